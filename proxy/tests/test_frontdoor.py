"""The front door's channel and request, in process: bytes in through Twisted's test transport,
time from a Twisted `Clock`, so each deadline is checked exactly rather than by waiting.

The real-socket tests of the same behaviour are in tests/test_frontdoor.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web import http

from proxy.edge import frontdoor
from proxy.edge.frontdoor import LINGER_MAX_BYTES, LINGER_SECS, FrontDoor, FrontDoorFactory
from routerproject.config import load_config

LIMIT = 1000


class Messages(list[Any]):
    def put_nowait(self, message: Any) -> None:
        self.append(message)


class FakeServer:
    """Daphne's server as a request sees it, counting the requests that reach the app."""

    proxy_forwarded_address_header = None
    root_path = ""
    server_name = ""
    request_buffer_size = 8192

    def __init__(self) -> None:
        self.created = 0

    def protocol_connected(self, protocol: Any) -> None:
        return None

    def protocol_disconnected(self, protocol: Any) -> None:
        return None

    def create_application(self, protocol: Any, scope: Any) -> Messages:
        self.created += 1
        return Messages()


class Door:
    def __init__(self, tmp_path: Path, **server: Any) -> None:
        (tmp_path / "kcpps").mkdir(exist_ok=True)
        settings = {
            "max_body_bytes": LIMIT,
            "header_timeout": "10s",
            "body_timeout": "30s",
            "body_min_rate": 100,
            "max_connections_per_client": 2,
            **server,
        }
        path = tmp_path / "config.yaml"
        path.write_text(
            textwrap.dedent(
                f"""
                server: {orjson.dumps(settings).decode()}
                auth: {{inference_keys: [front-door-key-1]}}
                """
            )
        )
        self.clock = Clock()
        self.server = FakeServer()
        self.door = FrontDoor(load_config(path, environ={}), clock=self.clock)
        self.factory = FrontDoorFactory(self.server, self.door)

    def connect(self, host: str = "127.0.0.1") -> tuple[Any, StringTransport]:
        protocol = self.factory.buildProtocol(IPv4Address("TCP", host, 40000))
        transport = StringTransport()
        protocol.makeConnection(transport)
        return protocol, transport


@pytest.fixture
def door(tmp_path: Path) -> Door:
    return Door(tmp_path)


def _status(transport: StringTransport) -> int:
    value = transport.value()
    return int(value[9:12]) if value.startswith(b"HTTP/1.1 ") else 0


def _body(transport: StringTransport) -> Any:
    return orjson.loads(transport.value().partition(b"\r\n\r\n")[2])


KEYED = b"Authorization: Bearer front-door-key-1\r\n"


def test_a_declared_body_over_the_limit_is_answered_before_it_arrives(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.dataReceived(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + KEYED
        + b"Content-Length: %d\r\n\r\n" % (LIMIT + 1)
    )
    assert _status(transport) == 413
    assert _body(transport)["error"]["code"] == "body_too_large"
    assert transport.disconnecting
    protocol.dataReceived(b"x" * (LIMIT + 1))
    assert door.server.created == 0


def test_a_body_at_the_limit_reaches_the_app(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.dataReceived(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + KEYED
        + b"Content-Length: %d\r\n\r\n" % LIMIT
        + b"x" * LIMIT
    )
    assert transport.value() == b""
    assert door.server.created == 1


def test_a_chunked_body_is_refused_once_past_the_limit(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.dataReceived(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + KEYED
        + b"Transfer-Encoding: chunked\r\n\r\n"
    )
    protocol.dataReceived(b"%x\r\n" % LIMIT + b"x" * LIMIT + b"\r\n")
    assert transport.value() == b""
    protocol.dataReceived(b"1\r\nx\r\n")
    assert _status(transport) == 413
    assert door.server.created == 0


def test_a_refused_connection_is_dropped_after_the_linger(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.dataReceived(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _status(transport) == 401
    door.clock.advance(LINGER_SECS - 0.01)
    assert not getattr(transport, "disconnected", False)
    door.clock.advance(0.02)
    assert transport.disconnected


def test_a_refused_connection_is_dropped_once_it_sent_too_much(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.dataReceived(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    protocol.dataReceived(b"x" * LINGER_MAX_BYTES)
    assert not getattr(transport, "disconnected", False)
    protocol.dataReceived(b"x")
    assert transport.disconnected


def test_a_head_must_arrive_within_the_header_timeout(door: Door) -> None:
    protocol, transport = door.connect()
    for _ in range(9):
        protocol.dataReceived(b"G")  # a byte a second does not move the deadline
        door.clock.advance(1.0)
    assert transport.value() == b""
    door.clock.advance(1.0)
    assert _status(transport) == 408
    assert door.server.created == 0


def test_a_body_gets_its_timeout_plus_a_second_per_min_rate_bytes(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.dataReceived(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + KEYED
        + b"Content-Length: 900\r\n\r\n"
    )
    protocol.dataReceived(b"x" * 200)  # 200 bytes at 100 B/s: two more seconds
    door.clock.advance(31.9)
    assert transport.value() == b""
    door.clock.advance(0.2)
    assert _status(transport) == 408
    assert b"request body not received" in transport.value()


def test_a_kept_alive_connection_times_each_head_from_its_first_byte(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert door.server.created == 1
    request = protocol._channel.requests[0]
    protocol._channel.requestDone(request)
    # Idle between requests is the idle timeout's business, not the head's.
    door.clock.advance(60.0)
    assert transport.value() == b""
    protocol.dataReceived(b"GET /pi")
    door.clock.advance(10.0)
    assert _status(transport) == 408


def test_the_connection_cap_answers_429_and_frees_places(door: Door) -> None:
    first, _ = door.connect()
    door.connect()
    _, transport = door.connect()
    assert _status(transport) == 429
    assert _body(transport)["error"]["code"] == "too_many_connections"
    assert door.connect("127.0.0.9")[1].value() == b""
    first.connectionLost(None)
    assert door.connect()[1].value() == b""


def test_a_rule_that_fails_answers_500_and_lets_nothing_through(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(door.door.gate, "head_refusal", broken)
    protocol, transport = door.connect()
    protocol.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _status(transport) == 500
    assert door.server.created == 0


def test_expect_100_continue_is_not_sent_after_a_refusal(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.dataReceived(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Content-Length: 10\r\n\r\n"
    )
    assert _status(transport) == 401
    assert b"100 Continue" not in transport.value()


def test_the_linger_constants() -> None:
    assert frontdoor.LINGER_SECS == 2.0
    assert frontdoor.LINGER_MAX_BYTES == 4 << 20


def test_a_junk_hop_in_x_forwarded_for_is_answered_403_at_the_head(tmp_path: Path) -> None:
    door = Door(tmp_path, allowed_cidrs=["10.0.0.0/8"], trusted_proxies=["127.0.0.0/8"])
    protocol, transport = door.connect()
    protocol.dataReceived(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
        + KEYED
        + b"X-Forwarded-For: 10.9.9.9, junk, 127.0.0.2\r\n\r\n"
    )

    assert _status(transport) == 403
    assert _body(transport) == {
        "error": {
            "message": "client address unknown is not in server.allowed_cidrs",
            "type": "forbidden",
            "code": "address_not_allowed",
        }
    }
    assert door.server.created == 0


def test_a_kept_alive_connection_closes_after_the_idle_timeout(tmp_path: Path) -> None:
    door = Door(tmp_path, idle_timeout="5s")
    protocol, transport = door.connect()
    protocol.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    protocol._channel.requestDone(protocol._channel.requests[0])

    door.clock.advance(4.9)
    assert not transport.disconnecting
    door.clock.advance(0.2)
    assert transport.disconnecting
    assert door.server.created == 1


def test_idle_time_restarts_with_each_byte_received(tmp_path: Path) -> None:
    door = Door(tmp_path, idle_timeout="5s", header_timeout="60s")
    protocol, transport = door.connect()
    door.clock.advance(4.0)
    protocol.dataReceived(b"GET /pi")
    door.clock.advance(4.0)
    assert not transport.disconnecting
    door.clock.advance(1.1)
    assert transport.disconnecting


def test_a_request_being_answered_is_not_cut_by_the_idle_timeout(tmp_path: Path) -> None:
    door = Door(tmp_path, idle_timeout="5s")
    protocol, transport = door.connect()
    protocol.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")

    door.clock.advance(30.0)  # a long answer: the app has not finished it
    assert not transport.disconnecting
    protocol._channel.requestDone(protocol._channel.requests[0])
    door.clock.advance(5.1)
    assert transport.disconnecting


def count_call_later(monkeypatch: pytest.MonkeyPatch, clock: Any, *also: Any) -> list[Any]:
    """The functions `callLater` arms from now on, through the clock and through ``also``
    (a channel's own `callLater`); each call still goes to the clock."""
    armed: list[Any] = []
    call_later = clock.callLater

    def counting(delay: float, f: Any, *args: Any, **kwargs: Any) -> Any:
        armed.append(f)
        return call_later(delay, f, *args, **kwargs)

    for target in (clock, *also):
        monkeypatch.setattr(target, "callLater", counting)
    return armed


def test_kept_alive_requests_arm_no_deadline_call_of_their_own(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    protocol, transport = door.connect()
    channel = protocol._channel
    armed = count_call_later(monkeypatch, door.clock)
    for _ in range(5):
        protocol.dataReceived(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            + KEYED
            + b"Content-Length: 2\r\n\r\n{}"
        )
        channel.requestDone(channel.requests[-1])
        door.clock.advance(0.1)
    assert door.server.created == 5
    # The call armed when the connection opened covers every head and body since.
    assert [f for f in armed if f == channel._expired] == []
    # ...and each head still gets its whole timeout from its first byte.
    protocol.dataReceived(b"GET /pi")
    door.clock.advance(9.95)
    assert transport.value() == b""
    door.clock.advance(0.1)
    assert _status(transport) == 408


def test_kept_alive_requests_arm_no_idle_call_either(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The idle timeout is one of the channel's deadlines: nothing is cancelled and armed
    # anew for each request (Twisted's own idle timer did both, every request).
    protocol, _transport = door.connect()
    channel = protocol._channel
    armed = count_call_later(monkeypatch, door.clock, channel)
    for _ in range(5):
        protocol.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        channel.requestDone(channel.requests[-1])
        door.clock.advance(0.1)
    assert door.server.created == 5
    assert armed == []
    assert door.clock.getDelayedCalls() == [channel._timer]


def test_whether_a_connection_is_tls_is_looked_up_once_for_all_its_requests(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[Any] = []
    original = http.HTTPChannel.isSecure

    def counting(channel: Any) -> bool:
        looked_up.append(channel)
        return bool(original(channel))

    monkeypatch.setattr(http.HTTPChannel, "isSecure", counting)
    protocol, _transport = door.connect()
    channel = protocol._channel
    for _ in range(3):
        protocol.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert channel.requests[-1].isSecure() is False
        channel.requestDone(channel.requests[-1])
    assert looked_up == [channel]


def test_an_idle_connection_is_closed_without_an_answer(tmp_path: Path) -> None:
    door = Door(tmp_path, idle_timeout="5s", header_timeout="60s")
    protocol, transport = door.connect()
    protocol.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    protocol._channel.requestDone(protocol._channel.requests[0])
    transport.clear()
    door.clock.advance(5.1)
    assert transport.disconnecting
    assert transport.value() == b""


def test_a_body_timeout_shorter_than_the_head_timeout_still_holds(tmp_path: Path) -> None:
    door = Door(tmp_path, header_timeout="60s", body_timeout="5s", body_min_rate=0)
    protocol, transport = door.connect()
    protocol.dataReceived(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + KEYED + b"Content-Length: 9\r\n\r\n"
    )
    door.clock.advance(4.9)
    assert transport.value() == b""
    door.clock.advance(0.2)
    assert _status(transport) == 408
    assert b"request body not received within 5s" in transport.value()
