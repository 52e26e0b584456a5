"""RouterCycle (proxy/edge/cycle.py): an answer's head leaves in the same write as its first
body bytes, or at the end of the loop turn when the body is not there yet; the app's disconnect
watch fires once when the client goes away before its answer is complete; a whole answer in
one message writes what its start and last body would, in one write."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from proxy.edge.cycle import JOIN_MAX_BYTES, RouterCycle
from proxy.edge.hooks import DISCONNECT_WATCH, DisconnectWatch
from proxy.request import WHOLE_ANSWER


class Recorder:
    """A transport recording each write (and writelines) as one entry, in order."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.lines: list[tuple[bytes, ...]] = []
        self.events: list[str] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.events.append("write")

    def writelines(self, parts: Any) -> None:
        self.lines.append(tuple(parts))
        self.events.append("writelines")

    def close(self) -> None:
        self.closed = True
        self.events.append("close")

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _cycle(
    transport: Recorder, *, method: str = "GET", keep_alive: bool = True
) -> tuple[RouterCycle, list[int]]:
    done: list[int] = []
    scope: Any = {"type": "http", "method": method, "path": "/", "headers": []}
    cycle = RouterCycle(
        scope=scope,
        transport=transport,
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: done.append(1),
    )
    return cycle, done


def _whole(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    return {"type": WHOLE_ANSWER, "status": status, "headers": headers, "body": body}


def _start(length: int | None) -> dict[str, Any]:
    headers = [] if length is None else [(b"content-length", b"%d" % length)]
    return {"type": "http.response.start", "status": 200, "headers": headers}


def _body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def test_an_answer_whose_body_follows_at_once_is_one_write() -> None:
    transport = Recorder()
    cycle, done = _cycle(transport)
    await cycle.send(_start(5))
    await cycle.send(_body(b"hello"))
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\ncontent-length: 5")
    assert body == b"hello"
    assert done == [1]
    await asyncio.sleep(0)
    assert len(transport.writes) == 1  # the end-of-turn flush found nothing left


async def test_a_head_whose_body_is_late_goes_out_at_the_end_of_the_turn() -> None:
    transport = Recorder()
    cycle, _ = _cycle(transport)
    await cycle.send(_start(None))
    assert transport.writes == []
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    await cycle.send(_body(b"tick", more=True))
    assert transport.writes[1] == b"4\r\ntick\r\n"


async def test_a_stream_whose_first_chunk_is_ready_sends_it_with_the_head() -> None:
    transport = Recorder()
    cycle, _ = _cycle(transport)
    await cycle.send(_start(None))
    await cycle.send(_body(b"tick", more=True))
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b"\r\n\r\n4\r\ntick\r\n")


async def test_a_closing_answer_writes_its_head_and_body_before_the_close() -> None:
    transport = Recorder()
    cycle, _ = _cycle(transport, keep_alive=False)
    await cycle.send(_start(2))
    await cycle.send(_body(b"ok"))
    assert transport.events == ["write", "close"]
    assert b"connection: close\r\n" in transport.writes[0]
    assert transport.writes[0].endswith(b"\r\n\r\nok")


async def test_a_head_request_still_gets_its_head() -> None:
    transport = Recorder()
    cycle, done = _cycle(transport, method="HEAD")
    await cycle.send(_start(5))
    await cycle.send(_body(b""))
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b"content-length: 5\r\n\r\n")
    assert done == [1]


@pytest.mark.parametrize("whole", [False, True], ids=["start-and-body", "whole-answer"])
@pytest.mark.parametrize(("size", "joined"), [(JOIN_MAX_BYTES, True), (JOIN_MAX_BYTES + 1, False)])
async def test_a_large_body_is_not_copied_to_join_its_head(
    size: int, joined: bool, whole: bool
) -> None:
    transport = Recorder()
    cycle, _ = _cycle(transport)
    body = b"x" * size
    if whole:
        await cycle.send(_whole(200, [], body))
    else:
        await cycle.send(_start(size))
        await cycle.send(_body(body))
    if joined:
        assert transport.events == ["write"]
        assert transport.writes[0].endswith(b"\r\n\r\n" + body)
    else:
        assert transport.events == ["writelines"]
        head, sent = transport.lines[0]
        assert head.endswith(b"content-length: %d\r\n\r\n" % size if whole else b"\r\n\r\n")
        assert sent is body


async def test_a_client_gone_before_the_flush_gets_nothing() -> None:
    transport = Recorder()
    cycle, _ = _cycle(transport)
    await cycle.send(_start(None))
    cycle.disconnected = True
    await asyncio.sleep(0)
    await cycle.send(_body(b"late", more=True))
    assert transport.writes == []


# -- the disconnect watch -------------------------------------------------------------------


def _watch(fired: list[str]) -> DisconnectWatch:
    return DisconnectWatch(lambda: fired.append("gone"))


async def test_the_cycle_advertises_the_disconnect_watch() -> None:
    cycle, _ = _cycle(Recorder())
    assert DISCONNECT_WATCH in cycle.scope["extensions"]


async def test_a_watch_fires_once_when_the_client_goes_away_mid_answer() -> None:
    fired: list[str] = []
    cycle, _ = _cycle(Recorder())
    await cycle.send({"type": DISCONNECT_WATCH, "watch": _watch(fired)})
    await cycle.send(_start(None))
    cycle.disconnected = True
    cycle.disconnected = True
    assert fired == ["gone"]


async def test_a_watch_sent_after_the_client_left_fires_at_once() -> None:
    fired: list[str] = []
    cycle, _ = _cycle(Recorder())
    cycle.disconnected = True
    await cycle.send({"type": DISCONNECT_WATCH, "watch": _watch(fired)})
    assert fired == ["gone"]


async def test_a_cancelled_watch_never_fires() -> None:
    fired: list[str] = []
    cycle, _ = _cycle(Recorder())
    watch = _watch(fired)
    await cycle.send({"type": DISCONNECT_WATCH, "watch": watch})
    watch.cancel()
    cycle.disconnected = True
    assert fired == []


async def test_a_complete_answer_drops_the_watch() -> None:
    fired: list[str] = []
    cycle, done = _cycle(Recorder())
    await cycle.send(_start(2))
    await cycle.send(_body(b"ok"))
    assert done == [1]
    await cycle.send({"type": DISCONNECT_WATCH, "watch": _watch(fired)})
    cycle.disconnected = True
    assert fired == []


async def test_a_failing_watch_is_logged_and_the_cycle_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def boom() -> None:
        raise RuntimeError("watch failed")

    cycle, _ = _cycle(Recorder())
    await cycle.send({"type": DISCONNECT_WATCH, "watch": DisconnectWatch(boom)})
    with caplog.at_level(logging.ERROR, logger="proxy.edge.hooks"):
        cycle.disconnected = True
    assert cycle.disconnected
    assert "a disconnect watch failed" in caplog.text


# -- a whole answer in one message ----------------------------------------------------------


def _parsed(wire: bytes) -> tuple[bytes, list[bytes], bytes]:
    """Status line, sorted header lines, body."""
    head, _, body = wire.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    return status, sorted(lines), body


def _dated_cycle(method: str) -> tuple[Recorder, RouterCycle, list[int]]:
    transport = Recorder()
    cycle, done = _cycle(transport, method=method)
    cycle.default_headers = [(b"date", b"Sun, 06 Dec 2026 00:00:00 GMT")]
    return transport, cycle, done


async def _two_messages(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, *, method: str = "GET"
) -> tuple[Recorder, list[int], RouterCycle]:
    transport, cycle, done = _dated_cycle(method)
    length = (b"content-length", b"%d" % len(body))
    await cycle.send(
        {"type": "http.response.start", "status": status, "headers": [*headers, length]}
    )
    await cycle.send(_body(b"" if method == "HEAD" else body))
    await asyncio.sleep(0)
    return transport, done, cycle


async def _one_message(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, *, method: str = "GET"
) -> tuple[Recorder, list[int], RouterCycle]:
    transport, cycle, done = _dated_cycle(method)
    await cycle.send(_whole(status, headers, body))
    return transport, done, cycle


async def test_the_cycle_advertises_whole_answers() -> None:
    cycle, _ = _cycle(Recorder())
    assert WHOLE_ANSWER in cycle.scope["extensions"]


@pytest.mark.parametrize(
    ("status", "headers", "body", "method"),
    [
        (200, [(b"content-type", b"application/json")], b'{"ok": true}', "GET"),
        (404, [(b"Content-Type", b"application/json"), (b"x-request-id", b"r-1")], b"{}", "POST"),
        (204, [(b"content-type", b"application/json")], b"", "POST"),
        (429, [(b"content-type", b"text/plain"), (b"retry-after", b"3")], b"slow down", "POST"),
        (200, [(b"content-type", b"application/json")], b'{"ok": true}', "HEAD"),
    ],
)
async def test_a_whole_answer_writes_what_start_and_body_would(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, method: str
) -> None:
    two, two_done, two_cycle = await _two_messages(status, headers, body, method=method)
    one, one_done, one_cycle = await _one_message(status, headers, body, method=method)
    assert len(one.writes) == 1
    assert _parsed(one.writes[0]) == _parsed(b"".join(two.writes))
    assert one_done == two_done == [1]
    assert one_cycle.response_complete and two_cycle.response_complete
    assert one_cycle.message_event.is_set()


async def test_a_whole_answer_that_closes_the_connection_writes_before_the_close() -> None:
    for headers, keep_alive in (([(b"connection", b"Close")], True), ([], False)):
        transport = Recorder()
        cycle, done = _cycle(transport, keep_alive=keep_alive)
        await cycle.send(_whole(200, headers, b"ok"))
        assert transport.events == ["write", "close"]
        assert transport.writes[0].lower().count(b"connection: close\r\n") == 1
        assert transport.writes[0].endswith(b"\r\n\r\nok")
        assert not cycle.keep_alive and done == [1]


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ([(b"content-type", b"a"), (b"bad name", b"x")], "Invalid HTTP header name."),
        ([(b"content-type", b"a"), (b"x-ok", b"line\r\nbreak")], "Invalid HTTP header value."),
    ],
)
async def test_a_whole_answer_with_a_bad_header_is_refused_unwritten(
    headers: list[tuple[bytes, bytes]], error: str
) -> None:
    transport = Recorder()
    cycle, _ = _cycle(transport)
    with pytest.raises(RuntimeError, match=error):
        await cycle.send(_whole(200, headers, b"ok"))
    assert transport.writes == []


async def test_a_whole_answer_after_the_answer_began_is_refused() -> None:
    transport = Recorder()
    cycle, _ = _cycle(transport)
    await cycle.send(_start(None))
    with pytest.raises(RuntimeError, match="after the answer began"):
        await cycle.send(_whole(200, [], b"ok"))


async def test_a_whole_answer_for_a_client_gone_writes_nothing() -> None:
    transport = Recorder()
    cycle, done = _cycle(transport)
    cycle.disconnected = True
    await cycle.send(_whole(200, [], b"ok"))
    assert transport.writes == [] and done == []
