"""The node-wide connection cap, its reserve for health checks and node routes, and IPv6
clients counted per /64, in process (the front door's protocol on a fake transport and clock,
as in test_frontdoor.py).

The real-socket tests, WebSockets included, are in tests/test_ws_limits.py.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.edge.caps import (
    FD_HEADROOM,
    MIN_MAX_CONNECTIONS,
    REFUSAL_LOG_INTERVAL_SECS,
    RESERVE_MAX,
    client_key,
    derived_max_connections,
    is_reserved_path,
    reserve_for,
)
from proxy.tests.doorharness import KEYED, Door, body_of, status_of, turn

# With a cap of 4 the reserve is 1: three ordinary places, one for health checks.
CAP = 4
TOKEN = "cap-cluster-token-0123456789"
NODE_ROUTE = b"GET /router/v1/node/runtime-status HTTP/1.1\r\nHost: x\r\n"
UPGRADE = (
    b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\n"
    + KEYED
    + b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


@pytest.fixture
def capped(doors: Callable[..., Door], tmp_path: Path) -> Door:
    cluster = {
        "role": "master",
        "node_id": "cap-test",
        "token": TOKEN,
        "store_dir": str(tmp_path / "store"),
    }
    return doors(max_connections=CAP, max_connections_per_client=0, cluster=cluster)


def test_the_default_cap_leaves_a_descriptor_per_connection_for_its_backend() -> None:
    assert derived_max_connections(4096) == (4096 - FD_HEADROOM) // 2 == 1920
    assert derived_max_connections(256) == MIN_MAX_CONNECTIONS
    assert reserve_for(1920) == RESERVE_MAX == 64
    assert reserve_for(CAP) == 1
    assert reserve_for(0) == 0


def test_the_default_cap_follows_the_open_file_limit(tmp_path: Path) -> None:
    from proxy.edge.caps import FrontDoor
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


async def test_the_per_client_cap_counts_a_whole_ipv6_64(doors: Callable[..., Door]) -> None:
    door = doors(max_connections_per_client=2)

    def connect(host: str) -> bytes:
        return bytes(door.connect(host)[1].data)

    assert connect("2001:db8:0:7::1") == b""
    assert connect("2001:db8:0:7::2") == b""
    assert connect("2001:db8:0:7::3").startswith(b"HTTP/1.1 429 ")
    assert connect("2001:db8:0:8::1") == b""
    assert door.door.open == {"2001:db8:0:7::/64": 2, "2001:db8:0:8::/64": 1}


async def test_the_last_place_takes_only_health_checks_and_node_routes(capped: Door) -> None:
    for _ in range(CAP - 1):
        ordinary, transport = capped.connect()
        ordinary.data_received(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + KEYED + b"\r\n")
        await turn()
        assert status_of(transport.take()) == 200
    capped.app.scopes.clear()
    reserved, transport = capped.connect()
    reserved.data_received(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + KEYED + b"\r\n")
    await turn()
    assert status_of(transport.data) == 503
    assert body_of(transport.data)["error"]["code"] == "too_many_connections"
    assert b"\r\nretry-after: 1\r\n" in transport.data
    assert capped.app.started == 0
    reserved.connection_lost(None)

    health, transport = capped.connect()
    health.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await turn()
    assert status_of(transport.data) == 200  # passed on to the app
    health.connection_lost(None)

    node, transport = capped.connect()
    node.data_received(NODE_ROUTE + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    await turn()
    assert status_of(transport.data) == 200
    assert [scope["path"] for scope in capped.app.scopes] == [
        "/healthz",
        "/router/v1/node/runtime-status",
    ]


async def test_no_cap_at_all_with_max_connections_0(doors: Callable[..., Door]) -> None:
    door = doors(max_connections=0, max_connections_per_client=0)
    for _ in range(100):
        assert door.connect()[1].data == b""
    assert door.door.total == 100


async def test_past_the_cap_a_connection_is_refused_and_a_closed_one_frees_its_place(
    capped: Door,
) -> None:
    held = [capped.connect()[0] for _ in range(CAP)]
    _, refused = capped.connect("127.0.0.9")
    assert status_of(refused.data) == 503
    assert body_of(refused.data)["error"]["code"] == "too_many_connections"
    assert capped.door.total == CAP
    held[0].connection_lost(None)
    assert capped.door.total == CAP - 1
    assert capped.connect()[1].data == b""
    assert capped.door.total == CAP


async def test_a_refused_connection_gives_back_no_place(capped: Door) -> None:
    for _ in range(CAP):
        capped.connect()
    refused, _ = capped.connect("127.0.0.9")
    refused.connection_lost(None)
    assert capped.door.total == CAP


async def test_refusals_at_the_cap_are_logged_once_per_interval(
    capped: Door, caplog: pytest.LogCaptureFixture
) -> None:
    capped.door.log.clock = capped.clock.time
    for _ in range(CAP):
        capped.connect()
    line = f"refused: 503 to 127.0.0.9: the node holds {CAP} connections (server.max_connections)"
    with caplog.at_level(logging.WARNING, logger="router.frontdoor"):
        for _ in range(3):
            capped.connect("127.0.0.9")
        capped.clock.advance(REFUSAL_LOG_INTERVAL_SECS - 0.01)
        capped.connect("127.0.0.9")
        capped.clock.advance(0.01)
        capped.connect("127.0.0.9")
    # (The connections held meanwhile are closed at their header timeout: another kind.)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(line[:20])]
    assert lines == [line, line + " (3 more like it since the last line)"]


async def test_a_websocket_keeps_its_places_until_its_socket_closes(
    doors: Callable[..., Door],
) -> None:
    door = doors(max_connections_per_client=1, max_connections=CAP)
    protocol, transport = door.connect()
    protocol.data_received(UPGRADE)
    socket = transport.protocol
    assert socket is not None and socket is not protocol
    assert (door.door.open, door.door.total) == ({"127.0.0.1": 1}, 1)
    assert status_of(door.connect()[1].data) == 429
    socket.connection_lost(None)
    assert (door.door.open, door.door.total) == ({}, 0)
    assert door.connect()[1].data == b""
