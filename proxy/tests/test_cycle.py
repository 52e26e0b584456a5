"""RouterCycle (proxy/edge/cycle.py): an answer's head leaves in the same write as its first
body bytes, or at the end of the loop turn when the body is not there yet; the app's disconnect
watch fires once when the client goes away before its answer is complete."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from proxy.edge.cycle import JOIN_MAX_BYTES, RouterCycle
from proxy.edge.hooks import DISCONNECT_WATCH, DisconnectWatch


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


@pytest.mark.parametrize(("size", "joined"), [(JOIN_MAX_BYTES, True), (JOIN_MAX_BYTES + 1, False)])
async def test_a_large_body_is_not_copied_to_join_its_head(size: int, joined: bool) -> None:
    transport = Recorder()
    cycle, _ = _cycle(transport)
    body = b"x" * size
    await cycle.send(_start(size))
    await cycle.send(_body(body))
    if joined:
        assert transport.events == ["write"]
        assert transport.writes[0].endswith(b"\r\n\r\n" + body)
    else:
        assert transport.events == ["writelines"]
        head, sent = transport.lines[0]
        assert head.endswith(b"\r\n\r\n")
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
