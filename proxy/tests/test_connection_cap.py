"""The node-wide connection cap, its reserve for health checks and node routes, and IPv6
clients counted per /64, in process (Twisted's test transport and clock).

The real-socket tests, WebSockets included, are in tests/test_ws_limits.py.
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import pytest
from twisted.internet.address import IPv6Address

from proxy.edge.frontdoor import (
    FD_HEADROOM,
    MIN_MAX_CONNECTIONS,
    RESERVE_MAX,
    client_key,
    derived_max_connections,
    is_reserved_path,
    reserve_for,
)
from proxy.tests.test_frontdoor import KEYED, Door, _body, _status

# With a cap of 4 the reserve is 1: three ordinary places, one for health checks.
CAP = 4


@pytest.fixture
def capped(tmp_path: Path) -> Door:
    return Door(tmp_path, max_connections=CAP, max_connections_per_client=0)


def test_the_default_cap_leaves_a_descriptor_per_connection_for_its_backend() -> None:
    assert derived_max_connections(4096) == (4096 - FD_HEADROOM) // 2 == 1920
    assert derived_max_connections(256) == MIN_MAX_CONNECTIONS
    assert reserve_for(1920) == RESERVE_MAX == 64
    assert reserve_for(CAP) == 1
    assert reserve_for(0) == 0


def test_the_default_cap_follows_the_open_file_limit(tmp_path: Path) -> None:
    from proxy.edge.frontdoor import FrontDoor
    from routerproject.config import load_config

    (tmp_path / "kcpps").mkdir()
    path = tmp_path / "config.yaml"
    path.write_text("server: {}\n")
    door = FrontDoor(load_config(path, environ={}), fd_limit=4096)
    assert (door.max_connections, door.reserve) == (1920, 64)
    path.write_text("server: {max_connections: 0}\n")
    assert FrontDoor(load_config(path, environ={}), fd_limit=4096).max_connections == 0


def test_only_health_checks_and_node_routes_are_reserved() -> None:
    assert is_reserved_path("/healthz") and is_reserved_path("/readyz")
    assert is_reserved_path("/router/v1/node/state")
    assert not is_reserved_path("/v1/models")
    assert not is_reserved_path("/v1/realtime")
    assert not is_reserved_path("/router/v1/site/nodes/state")


def test_ipv6_clients_are_counted_per_64() -> None:
    one = ipaddress.ip_address("2001:db8:0:7::1")
    other_host_same_64 = ipaddress.ip_address("2001:db8:0:7:ffff::2")
    next_64 = ipaddress.ip_address("2001:db8:0:8::1")
    assert client_key(one) == client_key(other_host_same_64) == "2001:db8:0:7::/64"
    assert client_key(next_64) == "2001:db8:0:8::/64"
    assert client_key(ipaddress.ip_address("192.0.2.7")) == "192.0.2.7"


def test_the_per_client_cap_counts_a_whole_ipv6_64(tmp_path: Path) -> None:
    door = Door(tmp_path, max_connections_per_client=2)

    def connect(host: str) -> bytes:
        protocol = door.factory.buildProtocol(IPv6Address("TCP", host, 40000))
        from twisted.internet.testing import StringTransport

        transport = StringTransport()
        protocol.makeConnection(transport)
        return bytes(transport.value())

    assert connect("2001:db8:0:7::1") == b""
    assert connect("2001:db8:0:7::2") == b""
    assert connect("2001:db8:0:7::3").startswith(b"HTTP/1.1 429 ")
    assert connect("2001:db8:0:8::1") == b""


def test_the_last_place_takes_only_health_checks_and_node_routes(capped: Door) -> None:
    for _ in range(CAP - 1):
        assert capped.connect()[1].value() == b""
    _, reserved = capped.connect()
    reserved_channel = _
    reserved_channel.dataReceived(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + KEYED + b"\r\n")
    assert _status(reserved) == 503
    assert _body(reserved)["error"]["code"] == "too_many_connections"
    assert capped.server.created == 0
    reserved_channel.connectionLost(None)
    health, transport = capped.connect()
    health.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.value() == b""  # passed on to the app
    assert capped.server.created == 1


def test_past_the_cap_a_connection_is_refused_and_a_closed_one_frees_its_place(
    capped: Door,
) -> None:
    held = [capped.connect()[0] for _ in range(CAP)]
    _, refused = capped.connect("127.0.0.9")
    assert _status(refused) == 503
    assert _body(refused)["error"]["code"] == "too_many_connections"
    assert capped.door.total == CAP
    held[0].connectionLost(None)
    assert capped.door.total == CAP - 1
    assert capped.connect()[1].value() == b""


def test_refusals_at_the_cap_are_logged_once_per_interval(
    capped: Door, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(CAP):
        capped.connect()
    with caplog.at_level(logging.WARNING, logger="router.frontdoor"):
        for _ in range(3):
            capped.connect("127.0.0.9")
    lines = [r.getMessage() for r in caplog.records if r.name == "router.frontdoor"]
    assert lines == [
        f"refused: 503 to 127.0.0.9: the node holds {CAP} connections (server.max_connections)"
    ]
