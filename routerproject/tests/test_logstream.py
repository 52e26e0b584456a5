"""The console handler: a loop turn's lines in one write, other threads' lines at once and in
order, nothing kept past `flush()`."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from routerproject.logstream import LoopTurnStreamHandler


class Writes(io.StringIO):
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)


class Broken(Writes):
    def write(self, text: str) -> int:
        super().write(text)
        raise OSError(28, "No space left on device")


@pytest.fixture
def handler() -> Iterator[LoopTurnStreamHandler]:
    handler = LoopTurnStreamHandler(Writes())
    handler.setFormatter(logging.Formatter("%(message)s"))
    yield handler
    handler.close()


def writes(handler: LoopTurnStreamHandler) -> list[str]:
    stream = handler.stream
    assert isinstance(stream, Writes)
    return stream.writes


def log(handler: LoopTurnStreamHandler, message: str) -> None:
    handler.handle(logging.makeLogRecord({"msg": message, "levelno": logging.INFO}))


async def next_turn() -> None:
    # Resumes once every callback already scheduled on the loop has run: they run in order.
    loop = asyncio.get_running_loop()
    turned = loop.create_future()
    loop.call_soon(turned.set_result, None)
    await turned


def _kept_by_a_closed_loop(handler: LoopTurnStreamHandler, message: str) -> None:
    # The loop stops in the turn that logged: its write stays scheduled, dropped as it closes.
    loop = asyncio.new_event_loop()
    loop.call_soon(log, handler, message)
    loop.call_soon(loop.stop)
    loop.run_forever()
    loop.close()
    assert writes(handler) == []


async def test_a_loop_turns_lines_go_out_in_one_write_once_it_ends(
    handler: LoopTurnStreamHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    scheduled: list[object] = []

    def call_soon(callback: Callable[..., object], *args: Any, **kwargs: Any) -> Any:
        scheduled.append(callback)
        return call_soon_of_the_loop(callback, *args, **kwargs)

    call_soon_of_the_loop = loop.call_soon
    monkeypatch.setattr(loop, "call_soon", call_soon)
    for n in range(3):
        log(handler, f"line {n}")
    assert writes(handler) == []
    # One callback a turn, scheduled by the turn's first line.
    assert scheduled == [handler._write_turn]
    monkeypatch.undo()
    await next_turn()
    assert writes(handler) == ["line 0\nline 1\nline 2\n"]
    log(handler, "next turn")
    await next_turn()
    assert writes(handler) == ["line 0\nline 1\nline 2\n", "next turn\n"]


def test_a_line_off_any_loop_goes_out_at_once(handler: LoopTurnStreamHandler) -> None:
    log(handler, "startup")
    assert writes(handler) == ["startup\n"]


async def test_another_threads_line_goes_out_at_once_after_the_kept_ones(
    handler: LoopTurnStreamHandler,
) -> None:
    log(handler, "on the loop")
    thread = threading.Thread(target=log, args=(handler, "from a worker thread"))
    thread.start()
    thread.join()
    assert writes(handler) == ["on the loop\nfrom a worker thread\n"]
    await next_turn()
    assert len(writes(handler)) == 1


def test_a_line_on_another_loop_goes_out_with_the_lines_a_closed_loop_kept(
    handler: LoopTurnStreamHandler,
) -> None:
    def log_and_stop(loop: asyncio.AbstractEventLoop) -> None:
        log(handler, "last line of a loop")
        loop.stop()  # its write is left scheduled, and dropped as it closes

    first = asyncio.new_event_loop()
    first.call_soon(log_and_stop, first)
    first.run_forever()
    first.close()
    assert writes(handler) == []

    async def on_the_next_loop() -> None:
        log(handler, "first line of the next")

    asyncio.run(on_the_next_loop())
    assert writes(handler) == ["last line of a loop\nfirst line of the next\n"]


async def test_flush_writes_the_kept_lines(handler: LoopTurnStreamHandler) -> None:
    log(handler, "kept")
    handler.flush()
    assert writes(handler) == ["kept\n"]
    await next_turn()
    assert writes(handler) == ["kept\n"]


def test_logging_shutdown_writes_what_a_closed_loop_left(handler: LoopTurnStreamHandler) -> None:
    _kept_by_a_closed_loop(handler, "said as the node stopped")
    logging.shutdown([weakref.ref(handler)])
    assert writes(handler) == ["said as the node stopped\n"]


async def test_a_failed_write_is_reported_as_handle_error_reports_it_and_its_lines_dropped(
    handler: LoopTurnStreamHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[logging.LogRecord] = []
    monkeypatch.setattr(handler, "handleError", reported.append)
    handler.setStream(Broken())
    log(handler, "lost 1")
    log(handler, "lost 2")
    await next_turn()
    assert [record.getMessage() for record in reported] == ["lost 1\nlost 2\n"]
    # Off the loop, the record that was being written is the one reported.
    thread = threading.Thread(target=log, args=(handler, "lost 3"))
    thread.start()
    thread.join()
    assert reported[-1].getMessage() == "lost 3"
    assert writes(handler) == ["lost 1\nlost 2\n", "lost 3\n"]


def test_a_forked_child_does_not_write_its_parents_kept_lines(
    handler: LoopTurnStreamHandler,
) -> None:
    _kept_by_a_closed_loop(handler, "the parent's")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it kept, and leave at once
        os.write(write_end, repr(handler._kept).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as child:
        kept_in_child = child.read()
    os.waitpid(pid, 0)
    assert kept_in_child == "[]"
    handler.flush()
    assert writes(handler) == ["the parent's\n"]


def test_the_node_logs_to_stderr_through_it() -> None:
    handlers = logging.getLogger().handlers
    assert any(type(h) is LoopTurnStreamHandler for h in handlers)
