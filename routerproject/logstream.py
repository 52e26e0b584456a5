"""The console log handler: the lines of one event-loop turn written to stderr together.

`logging.StreamHandler` writes and flushes each line as it comes: one write syscall per line,
and every request writes an access line, on the event loop's single thread. This handler keeps
the lines logged on a thread running an event loop and writes them in one write when the loop
next turns (one `loop.call_soon`, scheduled as the first line of the turn arrives). What an
operator reads is unchanged: the same lines, in the order they were logged.

- A line logged on any other thread (no running loop: a worker thread, startup, a management
  command) is written at once, after the lines still kept, so the order holds across threads.
  So is a line logged on one loop while another loop's lines are kept.
- `flush()` writes what is kept; `logging.shutdown()`, run at exit, calls it. So a loop closed
  before its last turn's lines went out (its callback dropped) loses nothing on a normal exit.
- A write that fails is reported as `Handler.handleError` reports it, and its lines are dropped,
  as the stdlib drops a line it could not write.

The price: a crash that ends the process at once (kill -9, a fatal signal, `os._exit`) loses the
lines of the loop turn it interrupted, which a line-buffered stderr would have written. And text
written to stderr by other means (`print(..., file=sys.stderr)`) during a turn goes out ahead of
that turn's log lines.

Stdlib only: the logging configuration loads this before Django is set up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from typing import TextIO

# Every handler, so a forked child drops the lines its parent kept: they are the parent's to
# write, and written by both they would show twice.
_handlers: weakref.WeakSet[LoopTurnStreamHandler] = weakref.WeakSet()


class LoopTurnStreamHandler(logging.StreamHandler):
    """A `StreamHandler` that writes a loop turn's lines in one write."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self._kept: list[str] = []
        # The loop whose callback writes the kept lines.
        self._writer: asyncio.AbstractEventLoop | None = None
        _handlers.add(self)

    def emit(self, record: logging.LogRecord) -> None:
        # Called with the handler's lock held (Handler.handle).
        try:
            line = self.format(record) + self.terminator
            kept = self._kept
            loop = asyncio._get_running_loop()
            kept.append(line)
            if loop is None or (len(kept) > 1 and loop is not self._writer):
                self._write(self._take_kept())
            elif len(kept) == 1:
                self._writer = loop
                loop.call_soon(self._write_turn)
        except RecursionError:  # as StreamHandler.emit: a recursion is no write failure
            raise
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        self.acquire()
        try:
            self._write(self._take_kept())
        finally:
            self.release()

    def _write_turn(self) -> None:
        # Once a turn, on the loop.
        with self.lock:  # type: ignore[union-attr]
            if not self._kept:
                return
            text = self._take_kept()
            try:
                self._write(text)
            except RecursionError:
                raise
            except Exception:
                # No record is at hand: handleError shows the lost lines as its message.
                self.handleError(logging.makeLogRecord({"msg": text}))

    def _take_kept(self) -> str:
        # With the lock held. The lines leave the list before they are written: a write that
        # fails drops them, as StreamHandler drops a line it could not write.
        text = "".join(self._kept)
        self._kept.clear()
        self._writer = None
        return text

    def _write(self, text: str) -> None:
        # With the lock held: `text` (if any), then the stream flushed, as StreamHandler does.
        stream = self.stream
        if text:
            stream.write(text)
        if stream and hasattr(stream, "flush"):
            stream.flush()

    def _forget_kept(self) -> None:
        self._kept.clear()
        self._writer = None


def _after_fork_in_child() -> None:
    for handler in list(_handlers):
        handler._forget_kept()


os.register_at_fork(after_in_child=_after_fork_in_child)
