"""The front door's protocol, in process: bytes in through a fake asyncio transport, time from a
fake clock the test advances, so each deadline is checked with exact numbers rather than by
waiting. The app is a small ASGI callable that records what it was started with; the protocol
starts it as a task on the running loop, which each test lets run by yielding (`turn`).

The real-socket tests of the same behaviour are in tests/test_frontdoor.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from proxy.edge import caps, filesend, frontdoor
from proxy.edge.frontdoor import (
    LINGER_MAX_BYTES,
    LINGER_SECS,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_URL_BYTES,
)
from proxy.edge.tls import CLIENT_CERT_SCOPE_KEY
from proxy.tests.doorharness import (
    KEYED,
    LIMIT,
    OK_PING,
    PEERCERT,
    PING,
    Door,
    body_of,
    post_head,
    status_of,
    turn,
)

# -- bodies -----------------------------------------------------------------------------------


async def test_a_declared_body_over_the_limit_is_answered_before_it_arrives(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(post_head(LIMIT + 1))
    assert status_of(transport.data) == 413
    assert body_of(transport.data)["error"]["code"] == "body_too_large"
    assert transport.eof  # the answer is whole: the node stops writing
    protocol.data_received(b"x" * (LIMIT + 1))
    await turn()
    assert door.app.started == 0
    assert door.state.tasks == set()


async def test_a_body_at_the_limit_reaches_the_app(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(post_head(LIMIT) + b"x" * LIMIT)
    await turn()
    assert door.app.bodies == [b"x" * LIMIT]
    assert transport.take() == b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n/v1/chat/completions"
    assert not transport.stopped


async def test_a_chunked_body_is_refused_once_past_the_limit(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + KEYED
        + b"Transfer-Encoding: chunked\r\n\r\n"
    )
    await turn()  # the app starts at the head and waits for the body
    protocol.data_received(b"%x\r\n" % LIMIT + b"x" * LIMIT + b"\r\n")
    await turn()
    assert transport.data == b""
    protocol.data_received(b"1\r\nx\r\n")
    assert status_of(transport.data) == 413
    assert body_of(transport.data)["error"]["code"] == "body_too_large"
    await turn()
    # The app hears that its client went away; it never gets the body whole.
    assert (door.app.started, door.app.disconnected, door.app.bodies) == (1, 1, [])
    assert status_of(transport.data) == 413  # ...and nothing it might send follows the refusal


# -- refusals and the linger ------------------------------------------------------------------


async def test_a_refused_connection_is_dropped_after_the_linger(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(transport.data) == 401
    assert transport.eof and not transport.closed
    door.clock.advance(LINGER_SECS - 0.01)
    assert not transport.aborted
    door.clock.advance(0.01)
    assert transport.aborted


async def test_a_refused_connection_is_dropped_once_it_sent_too_much(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    protocol.data_received(b"x" * LINGER_MAX_BYTES)
    assert not transport.aborted
    protocol.data_received(b"x")
    assert transport.aborted


async def test_a_closed_connection_leaves_no_linger_call(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(door.clock.pending()) == 1  # the linger's, the deadline's cancelled
    protocol.connection_lost(None)
    assert door.clock.pending() == []
    door.clock.advance(LINGER_SECS)
    assert not transport.aborted


def test_the_linger_constants() -> None:
    assert frontdoor.LINGER_SECS == 2.0
    assert frontdoor.LINGER_MAX_BYTES == 4 << 20


def test_the_head_limits_are_the_common_servers() -> None:
    # The tests of the limits read them from the module: their values are pinned here.
    assert (MAX_URL_BYTES, MAX_HEAD_BYTES, MAX_HEADERS) == (16384, 16384, 500)
    assert caps.REFUSAL_LOG_INTERVAL_SECS == 10.0


async def test_a_request_refused_at_the_head_never_starts_the_app(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    await turn()
    assert status_of(transport.data) == 401
    assert door.app.started == 0
    assert door.state.tasks == set()


async def test_a_rule_that_fails_answers_500_and_lets_nothing_through(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(door.door.gate, "head_refusal", broken)
    protocol, transport = door.connect()
    protocol.data_received(PING)
    await turn()
    assert status_of(transport.data) == 500
    assert body_of(transport.data)["error"]["type"] == "server_error"
    assert door.app.started == 0


async def test_a_failure_of_the_door_itself_answers_500_logged_not_400(
    door: Door, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Any, *args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(frontdoor.FrontDoorProtocol, "_judge", broken)
    protocol, transport = door.connect()
    with caplog.at_level(logging.ERROR, logger="router.frontdoor"):
        protocol.data_received(PING)
    await turn()
    assert status_of(transport.data) == 500
    assert door.app.started == 0
    (record,) = [r for r in caplog.records if r.name == "router.frontdoor"]
    assert record.exc_info is not None and "boom" in str(record.exc_info[1])


async def test_a_failure_of_the_door_once_the_app_runs_ends_the_connection(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Any) -> bool:
        raise RuntimeError("boom")

    door.app.held = asyncio.Event()
    monkeypatch.setattr(frontdoor.FrontDoorProtocol, "_has_body", broken)
    protocol, transport = door.connect()
    protocol.data_received(PING)
    await turn()
    # Started already, its request cut: no answer the client could pin on the wrong request.
    assert transport.closed and transport.data == b""
    assert door.app.disconnected == 1


async def test_expect_100_continue_is_not_sent_after_a_refusal(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Content-Length: 10\r\n\r\n"
    )
    await turn()
    assert status_of(transport.data) == 401
    assert b"100 Continue" not in transport.data
    # The same request with its key is told to go on, once the app asks for the body.
    protocol, transport = door.connect("127.0.0.9")
    protocol.data_received(post_head(10, b"Expect: 100-continue\r\n"))
    await turn()
    assert transport.data == b"HTTP/1.1 100 Continue\r\n\r\n"


async def test_a_junk_hop_in_x_forwarded_for_is_answered_403_at_the_head(
    doors: Callable[..., Door],
) -> None:
    door = doors(allowed_cidrs=["10.0.0.0/8"], trusted_proxies=["127.0.0.0/8"])
    protocol, transport = door.connect()
    protocol.data_received(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
        + KEYED
        + b"X-Forwarded-For: 10.9.9.9, junk, 127.0.0.2\r\n\r\n"
    )
    await turn()
    assert status_of(transport.data) == 403
    assert body_of(transport.data) == {
        "error": {
            "message": "client address unknown is not in server.allowed_cidrs",
            "type": "forbidden",
            "code": "address_not_allowed",
        }
    }
    assert door.app.started == 0


async def test_an_invalid_request_line_is_answered_400_in_the_json_envelope(door: Door) -> None:
    protocol, transport = door.connect()
    # A TLS hello on the plain port, say: no HTTP request line.
    protocol.data_received(b"\x16\x03\x01\x02\x00 not http\r\n\r\n")
    await turn()
    assert status_of(transport.data) == 400
    assert b"\r\ncontent-type: application/json\r\n" in transport.data
    assert body_of(transport.data) == {
        "error": {"message": "invalid HTTP request", "type": "invalid_request_error"}
    }
    assert transport.eof
    assert door.app.started == 0


# -- the size of a head -----------------------------------------------------------------------


def _get(target: bytes) -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_a_request_line_at_the_url_limit_passes_and_one_past_it_is_414(door: Door) -> None:
    longest = b"/ping?" + b"q" * (MAX_URL_BYTES - len(b"/ping?"))
    protocol, transport = door.connect()
    protocol.data_received(_get(longest))
    await turn()
    assert status_of(transport.data) == 200
    protocol, transport = door.connect("127.0.0.9")
    protocol.data_received(_get(longest + b"q"))
    await turn()
    assert status_of(transport.data) == 414
    assert body_of(transport.data)["error"]["code"] == "uri_too_long"
    assert door.app.started == 1


async def test_a_url_arriving_a_few_bytes_at_a_time_is_414_once_past_the_limit(
    door: Door,
) -> None:
    protocol, transport = door.connect()
    url = b"/" + b"q" * (MAX_URL_BYTES - 1)
    protocol.data_received(b"GET ")
    for start in range(0, len(url), 7):
        protocol.data_received(url[start : start + 7])
    assert transport.data == b""
    protocol.data_received(b"q")
    assert status_of(transport.data) == 414


def _line(name: bytes, size: int) -> bytes:
    """A header line of `size` bytes as the front door counts it: name, value, ": " and CRLF."""
    return name + b": " + b"v" * (size - len(name) - 4) + b"\r\n"


HOST = b"Host: x\r\n"


async def test_a_head_at_the_header_limits_passes_and_one_past_either_is_431(
    doors: Callable[..., Door],
) -> None:
    door = doors(max_connections_per_client=0)
    small = [_line(b"x-h%d" % index, 20) for index in range(MAX_HEADERS)]
    heads = {
        "at the count": [HOST, *small[: MAX_HEADERS - 1]],
        "past the count": [HOST, *small],
        "at the bytes": [HOST, _line(b"x-long", MAX_HEAD_BYTES - len(HOST))],
        "past the bytes": [HOST, _line(b"x-long", MAX_HEAD_BYTES - len(HOST) + 1)],
    }
    answers = {}
    for what, lines in heads.items():
        protocol, answers[what] = door.connect()
        protocol.data_received(b"GET /ping HTTP/1.1\r\n" + b"".join(lines) + b"\r\n")
    await turn()
    assert {what: status_of(transport.data) for what, transport in answers.items()} == {
        "at the count": 200,
        "past the count": 431,
        "at the bytes": 200,
        "past the bytes": 431,
    }
    assert body_of(answers["past the count"].data)["error"]["code"] == "headers_too_large"
    assert door.app.started == 2


@pytest.mark.parametrize("kept_alive", [False, True], ids=["first-request", "kept-alive"])
async def test_a_head_that_never_ends_is_431_once_past_what_a_head_may_hold(
    door: Door, kept_alive: bool
) -> None:
    # One header value, a few bytes at a time: the parser holds it whole until its line ends,
    # so only the bytes of the unfinished head can bound it.
    protocol, transport = door.connect()
    if kept_alive:
        # A head after an answer is counted from its own first byte, as the first one is.
        protocol.data_received(PING)
        await turn()
        assert transport.take() == OK_PING
    sent = 0

    def send(data: bytes) -> None:
        nonlocal sent
        protocol.data_received(data)
        sent += len(data)

    send(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Long: ")
    while sent + 7 <= MAX_HEAD_BYTES + MAX_URL_BYTES:
        send(b"v" * 7)
    send(b"v" * (MAX_HEAD_BYTES + MAX_URL_BYTES - sent))
    assert transport.data == b""
    send(b"v")
    assert status_of(transport.data) == 431
    assert transport.eof
    await turn()
    assert door.app.started == int(kept_alive)


# -- pipelining -------------------------------------------------------------------------------


async def test_a_pipelined_request_is_answered_after_the_first(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(PING + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    # The second waits for the first's answer, and so does reading.
    assert not transport.reading
    assert door.app.started == 0
    await asyncio.sleep(0)
    assert [scope["path"] for scope in door.app.scopes] == ["/ping"]
    assert transport.take() == OK_PING
    await asyncio.sleep(0)
    assert [scope["path"] for scope in door.app.scopes] == ["/ping", "/healthz"]
    assert transport.take() == b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n/healthz"
    assert transport.reading


# -- slow clients -----------------------------------------------------------------------------


async def test_a_head_must_arrive_within_the_header_timeout(door: Door) -> None:
    protocol, transport = door.connect()
    for byte in b"GET /ping":
        protocol.data_received(bytes([byte]))  # a byte a second does not move the deadline
        door.clock.advance(1.0)
    door.clock.advance(0.99)
    assert transport.data == b""
    door.clock.advance(0.01)
    assert status_of(transport.data) == 408
    assert body_of(transport.data)["error"]["message"] == "request head not received within 10s"
    await turn()
    assert door.app.started == 0


async def test_a_body_gets_its_timeout_plus_a_second_per_min_rate_bytes(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(post_head(900))
    await turn()
    # 200 bytes at 100 B/s: two more seconds, counted from the head (not the last byte).
    protocol.data_received(b"x" * 100)
    door.clock.advance(20.0)
    protocol.data_received(b"x" * 100)
    door.clock.advance(11.99)
    assert transport.data == b""
    door.clock.advance(0.01)
    assert status_of(transport.data) == 408
    message = body_of(transport.data)["error"]["message"]
    assert message == "request body not received within 32s"
    await turn()
    assert (door.app.disconnected, door.app.bodies) == (1, [])


async def test_a_body_timeout_shorter_than_the_head_timeout_still_holds(
    doors: Callable[..., Door],
) -> None:
    door = doors(header_timeout="60s", body_timeout="5s", body_min_rate=0)
    protocol, transport = door.connect()
    protocol.data_received(post_head(9))
    door.clock.advance(4.99)
    assert transport.data == b""
    door.clock.advance(0.01)
    assert status_of(transport.data) == 408
    assert b"request body not received within 5s" in transport.data


async def test_a_body_timeout_after_the_answer_began_closes_without_a_second_answer(
    door: Door,
) -> None:
    door.app.streams = True
    protocol, transport = door.connect()
    protocol.data_received(post_head(900))
    await turn()
    assert transport.take() == b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    door.clock.advance(30.0)
    assert transport.closed and not transport.eof
    await turn()
    assert transport.data == b""
    assert door.app.disconnected == 1


async def test_a_kept_alive_connection_times_each_head_from_its_first_byte(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(PING)
    await turn()
    assert transport.take() == OK_PING
    # Idle between requests is the idle timeout's business, not the head's.
    door.clock.advance(60.0)
    assert transport.data == b"" and not transport.stopped
    protocol.data_received(b"GET /pi")
    door.clock.advance(9.99)
    assert transport.data == b""
    door.clock.advance(0.01)
    assert status_of(transport.data) == 408


async def test_a_kept_alive_connection_closes_after_the_idle_timeout(
    doors: Callable[..., Door],
) -> None:
    door = doors(idle_timeout="5s")
    protocol, transport = door.connect()
    protocol.data_received(PING)
    await turn()
    assert transport.take() == OK_PING
    door.clock.advance(4.99)
    assert not transport.closed
    door.clock.advance(0.01)
    assert transport.closed
    assert door.app.started == 1
    # The call armed at the connection (the head's time capped by the idle timeout) was due
    # when the idle time ended: it served, and no other was armed.
    assert len(door.clock.armed) == 1


async def test_an_idle_connection_is_closed_without_an_answer(
    doors: Callable[..., Door],
) -> None:
    door = doors(idle_timeout="5s", header_timeout="60s")
    protocol, transport = door.connect()
    protocol.data_received(PING)
    await turn()
    transport.take()
    door.clock.advance(5.0)
    assert transport.closed
    assert transport.data == b""


async def test_idle_time_restarts_with_each_byte_received(doors: Callable[..., Door]) -> None:
    door = doors(idle_timeout="5s", header_timeout="60s")
    protocol, transport = door.connect()
    door.clock.advance(4.0)
    protocol.data_received(b"GET /pi")
    door.clock.advance(4.99)
    assert not transport.closed
    door.clock.advance(0.01)
    assert transport.closed
    assert transport.data == b""  # the idle timeout: closed without an answer


@pytest.mark.parametrize("body", [False, True], ids=["get", "post"])
async def test_a_request_being_answered_is_not_cut_by_the_idle_or_body_timeout(
    doors: Callable[..., Door], body: bool
) -> None:
    door = doors(idle_timeout="5s", body_timeout="10s", body_min_rate=0)
    door.app.held = asyncio.Event()
    protocol, transport = door.connect()
    protocol.data_received(post_head(2) + b"{}" if body else PING)
    await turn()
    door.clock.advance(30.0)  # a long answer: the app has not finished it
    assert not transport.stopped
    door.app.held.set()
    await turn()
    assert status_of(transport.take()) == 200
    door.clock.advance(4.99)
    assert not transport.closed
    door.clock.advance(0.01)
    assert transport.closed


# -- calls armed per request (a performance rule) ---------------------------------------------


def count_call_later(monkeypatch: pytest.MonkeyPatch, *clocks: Any) -> list[Any]:
    """The callbacks `call_later` arms from now on, through each of `clocks`; each call still
    goes to its clock."""
    armed: list[Any] = []
    for clock in clocks:
        call_later = clock.call_later

        def counting(delay: float, callback: Any, *args: Any, _to: Any = call_later) -> Any:
            armed.append(callback)
            return _to(delay, callback, *args)

        monkeypatch.setattr(clock, "call_later", counting)
    return armed


async def test_kept_alive_requests_arm_no_deadline_call_of_their_own(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    protocol, transport = door.connect()
    armed = count_call_later(monkeypatch, door.clock)
    for _ in range(5):
        protocol.data_received(post_head(2) + b"{}")
        await turn()
        door.clock.advance(0.1)
    assert door.app.bodies == [b"{}"] * 5
    # The call armed when the connection opened covers every head and body since.
    assert armed == []
    # ...and each head still gets its whole timeout from its first byte.
    transport.take()
    protocol.data_received(b"GET /pi")
    door.clock.advance(9.95)
    assert transport.data == b""
    door.clock.advance(0.1)
    assert status_of(transport.data) == 408


async def test_kept_alive_requests_arm_no_idle_call_either(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The idle timeout is one of the protocol's deadlines: nothing is cancelled and armed
    # anew for each request (uvicorn's own keep-alive timer, on the loop, would do both).
    protocol, _transport = door.connect()
    armed = count_call_later(monkeypatch, door.clock, protocol.loop)
    for _ in range(5):
        protocol.data_received(PING)
        await turn()
        door.clock.advance(0.1)
    assert door.app.started == 5
    assert armed == []
    assert door.clock.pending() == [protocol._timer]


async def test_one_call_per_header_timeout_over_many_requests(
    door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    protocol, _transport = door.connect()
    armed = count_call_later(monkeypatch, door.clock)
    # 100 requests over 50 s, five header timeouts: the pending call comes due about once
    # per timeout, finds the connection between requests and is moved to the idle deadline,
    # then back to the next head's: two calls per timeout, none per request.
    for _ in range(100):
        protocol.data_received(PING)
        await turn()
        door.clock.advance(0.5)
    assert door.app.started == 100
    assert len(armed) <= 2 * 5


# -- TLS --------------------------------------------------------------------------------------


async def test_the_client_certificate_is_read_once_and_told_to_each_request(door: Door) -> None:
    protocol, transport = door.connect(tls=True, peercert=PEERCERT)
    for _ in range(3):
        protocol.data_received(PING)
        await turn()
    assert transport.looked_up.count("peercert") == 1
    assert [scope[CLIENT_CERT_SCOPE_KEY] for scope in door.app.scopes] == [True] * 3
    assert {scope["scheme"] for scope in door.app.scopes} == {"https"}
    assert all(filesend.EXTENSION in scope["extensions"] for scope in door.app.scopes)


@pytest.mark.parametrize(
    ("tls", "peercert"), [(False, None), (True, None), (True, {})], ids=["plain", "none", "empty"]
)
async def test_without_a_verified_certificate_the_scope_says_so(
    doors: Callable[..., Door], tls: bool, peercert: dict[str, Any] | None
) -> None:
    door = doors()
    protocol, _transport = door.connect(tls=tls, peercert=peercert)
    protocol.data_received(PING)
    await turn()
    assert door.app.scopes[0][CLIENT_CERT_SCOPE_KEY] is False
    assert filesend.EXTENSION in door.app.scopes[0]["extensions"]


@pytest.mark.parametrize("half_close", [False, True], ids=["asyncio", "claims-half-close"])
async def test_a_refusal_under_tls_closes_rather_than_half_closes(
    door: Door, half_close: bool
) -> None:
    # A TLS close_notify ends both directions: a half-close is not TLS's to give, whatever
    # the transport says.
    protocol, transport = door.connect(tls=True, half_close=half_close)
    protocol.data_received(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(transport.data) == 401
    assert transport.closed and not transport.eof


# -- the per-client cap -----------------------------------------------------------------------


async def test_the_connection_cap_answers_429_and_frees_places(door: Door) -> None:
    first, _ = door.connect()
    door.connect()
    _, transport = door.connect()
    assert status_of(transport.data) == 429
    assert body_of(transport.data)["error"]["code"] == "too_many_connections"
    assert b"\r\nretry-after: 1\r\n" in transport.data
    assert door.connect("127.0.0.9")[1].data == b""
    first.connection_lost(None)
    assert door.connect()[1].data == b""


async def test_a_trusted_proxy_is_not_counted(doors: Callable[..., Door]) -> None:
    door = doors(trusted_proxies=["127.0.0.0/8"])
    for _ in range(3):
        assert door.connect()[1].data == b""


# -- pipelining, early answers, upgrades and cut bodies ------------------------------------


async def _answers_at_once(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that answers without reading the body (an early error, say)."""
    await send(
        {"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]}
    )
    await send({"type": "http.response.body", "body": b""})


async def test_a_pipelined_request_refused_at_its_head_is_answered_after_the_first(
    door: Door,
) -> None:
    protocol, transport = door.connect()
    protocol.data_received(PING + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    await turn()
    await turn()
    assert transport.data.startswith(OK_PING)
    assert status_of(transport.data[len(OK_PING) :]) == 401


async def test_a_pipelined_body_timeout_waits_for_the_answer_before_it(door: Door) -> None:
    door.app.held = asyncio.Event()
    protocol, transport = door.connect()
    protocol.data_received(PING + post_head(10) + b"{}")
    await turn()
    door.clock.advance(31.0)
    door.app.held.set()
    await turn()
    assert transport.data.startswith(OK_PING)


async def test_a_head_sent_while_an_answer_is_owed_is_bounded_too(door: Door) -> None:
    door.app.held = asyncio.Event()
    protocol, transport = door.connect()
    protocol.data_received(PING)
    await turn()
    protocol.data_received(b"GET /ping HTTP/1.1\r\nX-Long: ")
    for _ in range(2 * (MAX_HEAD_BYTES + MAX_URL_BYTES) // 1000):
        protocol.data_received(b"v" * 1000)
    # Either reading stops or the connection is refused: the parser does not hold it all.
    assert not transport.reading or transport.stopped


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_the_rest_of_a_body_after_an_early_answer_is_not_taken_for_a_head(
    doors: Callable[..., Door], chunked: bool
) -> None:
    door = doors(max_body_bytes=1 << 20)
    door.config.loaded_app = _answers_at_once
    protocol, transport = door.connect()
    size = 40000
    if chunked:
        head = post_head(0).replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
        rest = b"%x\r\n" % size + b"x" * size + b"\r\n0\r\n\r\n"
    else:
        head, rest = post_head(size), b"x" * size
    protocol.data_received(head)
    await turn()
    assert status_of(transport.take()) == 404
    protocol.data_received(rest)
    door.clock.advance(10.0)
    assert transport.data == b""


async def test_an_upgrade_other_than_websocket_gets_one_answer(door: Door) -> None:
    protocol, transport = door.connect()
    protocol.data_received(
        b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
    await turn()
    # Served as HTTP/1.1 (the Upgrade ignored, as RFC 9110 allows), once; the parser reads no
    # further request after an Upgrade, so the connection ends with the answer.
    assert transport.data.count(b"HTTP/1.1 ") == 1
    assert status_of(transport.data) == 200
    assert b"connection: close\r\n" in transport.data
    assert transport.closed


async def test_a_cut_body_sends_no_100_continue_and_the_app_hears_a_disconnect(
    door: Door,
) -> None:
    protocol, transport = door.connect()
    protocol.data_received(
        post_head(0, b"Expect: 100-continue\r\n").replace(
            b"Content-Length: 0", b"Transfer-Encoding: chunked"
        )
        + b"%x\r\n" % (LIMIT + 1)
        + b"x" * (LIMIT + 1)
        + b"\r\n"
    )
    assert status_of(transport.data) == 413
    await turn()
    assert b"100 Continue" not in transport.data
    assert door.app.disconnected == 1


async def test_header_names_reach_the_app_in_lower_case_and_values_without_trailing_blanks(
    door: Door,
) -> None:
    protocol, _ = door.connect()
    protocol.data_received(post_head(0, b"X-Trace-Tag:  Mixed Case \t \r\n"))
    await turn()
    headers = door.app.scopes[0]["headers"]
    assert (b"x-trace-tag", b"Mixed Case") in headers
    assert (b"host", b"x") in headers
    assert not protocol.expect_100_continue


async def test_expect_100_continue_is_noted_whatever_its_case_and_blanks(door: Door) -> None:
    protocol, _ = door.connect()
    protocol.data_received(post_head(10, b"EXPECT: 100-Continue \r\n"))
    assert protocol.expect_100_continue


def test_an_http_request_goes_to_the_app_channels_would_route_it_to() -> None:
    from channels.routing import ProtocolTypeRouter

    async def http(scope: Any, receive: Any, send: Any) -> None: ...

    async def websocket(scope: Any, receive: Any, send: Any) -> None: ...

    routed = ProtocolTypeRouter({"http": http, "websocket": websocket})
    assert frontdoor.http_app(routed) is http
    assert frontdoor.http_app(http) is http
    only_ws = ProtocolTypeRouter({"websocket": websocket})
    assert frontdoor.http_app(only_ws) is only_ws


def test_the_nodes_own_app_is_routed_to_the_proxy_app() -> None:
    from proxy.edge.app import ProxyApp
    from routerproject.asgi import application

    assert isinstance(frontdoor.http_app(application), ProxyApp)


async def test_under_channels_router_the_protocol_starts_the_http_app_itself(
    door: Door,
) -> None:
    from channels.routing import ProtocolTypeRouter

    from proxy.edge.server import server_config

    door.config = server_config(ProtocolTypeRouter({"http": door.app}))
    protocol, transport = door.connect()
    assert protocol.app is door.app
    protocol.data_received(post_head(0))
    await turn()
    assert status_of(transport.data) == 200
    assert [scope["path"] for scope in door.app.scopes] == ["/v1/chat/completions"]
