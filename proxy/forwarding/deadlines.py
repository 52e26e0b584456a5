"""The deadlines of the requests this node's backends and other nodes hold, kept by one timer.

`backend.request_timeout` bounds each request to a backend of this node, and each call to the
node that serves a request forwarded there, from the moment it is sent to its answer's last
byte. A timer of its own for every request costs more than it looks
under uvloop: arming and cancelling one took 3.7 us here (1.5 % of a request's CPU), and
aiohttp's `total` timeout arms one and enters a timer context on every read of the answer, each
chunk of a stream included. So a request notes its deadline here (a set insertion), and one
timer, armed only while some request is held, ends the requests whose deadline has passed: each
is cancelled at most `tick_secs` after its deadline, and `Deadline.expired` tells its code
that the cancellation was its timeout, not its client leaving (see `expired_now`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

# How late a request may be ended after its deadline, at most (a fraction of a short timeout).
MAX_TICK_SECS = 1.0
TICK_SHARE = 0.125


def tick_for(timeout_secs: float) -> float:
    """How often the timer looks, for requests bounded by `timeout_secs`."""
    return min(MAX_TICK_SECS, timeout_secs * TICK_SHARE)


class Deadline:
    """One held request's deadline."""

    __slots__ = ("cancelling", "expired", "secs", "task", "when")

    def __init__(self, task: asyncio.Task[Any], secs: float, when: float) -> None:
        self.task = task
        self.secs = secs
        self.when = when
        # The task's pending cancellations when it was held: those are not this deadline's.
        self.cancelling = task.cancelling()
        self.expired = False

    def expired_now(self) -> bool:
        """Called where the held request caught a CancelledError: True when that cancellation
        was this deadline's alone (it is taken back then, so the task carries on, to raise a
        TimeoutError); False when someone else cancelled the task too, or instead."""
        return self.expired and self.task.uncancel() <= self.cancelling

    def error(self) -> TimeoutError:
        """What the request raises once `expired_now` said its time was up."""
        return TimeoutError(f"no answer within backend.request_timeout ({self.secs:g}s)")


class Deadlines:
    """The deadlines of the requests held now, and the one timer that ends the late ones."""

    def __init__(
        self, *, tick_secs: float = MAX_TICK_SECS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tick_secs = tick_secs
        self.clock = clock
        self._held: set[Deadline] = set()
        self._timer: asyncio.TimerHandle | None = None
        # The loop the timer runs on: a node carried to another loop (tests) arms a new one.
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, secs: float) -> Deadline:
        """The current task's request ends `secs` from now, or is cancelled after that."""
        task = asyncio.current_task()
        assert task is not None
        deadline = Deadline(task, secs, self.clock() + secs)
        self._held.add(deadline)
        if self._timer is None or self._timer_loop is not task.get_loop():
            self._arm(task.get_loop())
        return deadline

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer_loop = loop
        self._timer = loop.call_later(self.tick_secs, self.sweep)

    def release(self, deadline: Deadline) -> None:
        """The request is over, by its answer or otherwise."""
        self._held.discard(deadline)

    def sweep(self) -> None:
        """Cancel every held request whose deadline has passed; look again in a tick while
        any is held."""
        self._timer = None
        now = self.clock()
        late = [deadline for deadline in self._held if deadline.when <= now]
        for deadline in late:
            self._held.discard(deadline)
            deadline.expired = True
            deadline.task.cancel()
        if self._held and self._timer_loop is not None:
            self._arm(self._timer_loop)
