"""One log line when a repeating call's outcome changes, not one per attempt.

A sync loop or a push to a dead slave fails on every tick; the operator needs to hear when it
starts failing (and why) and when it works again, not the same warning every second.
"""

from __future__ import annotations

import asyncio
import logging


class OutcomeLog:
    """The last outcome of one repeating call (`""` = it worked), logged when it changes."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self.last_error = ""

    def note(self, error: str) -> None:
        if error == self.last_error:
            return
        if error:
            self.logger.warning("%s failed: %s", self.what, error)
        else:
            self.logger.info("%s works again", self.what)
        self.last_error = error


class PeriodicCall:
    """A call repeated every `interval` seconds on the event loop until `stop`; an exception
    is one more outcome (logged when it changes), never the end of the loop."""

    def __init__(self, logger: logging.Logger, what: str, interval: float) -> None:
        self.interval = interval
        self._outcome = OutcomeLog(logger, what)
        self._task: asyncio.Task[None] | None = None

    @property
    def last_error(self) -> str:
        return self._outcome.last_error

    def _note(self, error: str) -> None:
        self._outcome.note(error)

    async def tick(self) -> object:
        raise NotImplementedError

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as exc:
                self._note(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self.run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass  # what the cancel asked for
