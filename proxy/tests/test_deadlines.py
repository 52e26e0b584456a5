"""The one timer that ends requests past `backend.request_timeout`, on a clock the tests move:
each check is made at an exact time (the timer's own tick is far away, so only `sweep` calls
made here look at the deadlines)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.forwarding import deadlines
from proxy.forwarding.deadlines import Deadline, Deadlines, tick_for

FAR_TICK_SECS = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def held_request(book: Deadlines, secs: float, started: asyncio.Event) -> str:
    """What `_send` does with its deadline, around a wait that only a cancellation ends."""
    deadline = book.hold(secs)
    try:
        started.set()
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        if not deadline.expired_now():
            raise
        raise deadline.error() from None
    finally:
        book.release(deadline)
    return "answered"


async def start(book: Deadlines, secs: float) -> asyncio.Task[str]:
    started = asyncio.Event()
    task = asyncio.ensure_future(held_request(book, secs, started))
    await started.wait()
    return task


def test_the_tick_is_an_eighth_of_a_short_timeout_and_a_second_at_most() -> None:
    assert tick_for(0.4) == pytest.approx(0.05)
    assert tick_for(8.0) == 1.0
    assert tick_for(1800.0) == deadlines.MAX_TICK_SECS == 1.0


async def test_a_request_is_ended_once_its_deadline_has_passed_and_not_before() -> None:
    clock = Clock()
    book = Deadlines(tick_secs=FAR_TICK_SECS, clock=clock)
    task = await start(book, 30.0)
    clock.now = 129.999
    book.sweep()
    await asyncio.sleep(0)
    assert not task.done() and len(book) == 1
    clock.now = 130.0
    book.sweep()
    with pytest.raises(TimeoutError, match=r"within backend.request_timeout \(30s\)"):
        await task
    assert len(book) == 0
    # Cancelled by its deadline and taken back: the task is not left "being cancelled".
    assert task.cancelling() == 0


async def test_only_the_late_requests_end_and_the_timer_stays_while_any_is_held() -> None:
    clock = Clock()
    book = Deadlines(tick_secs=FAR_TICK_SECS, clock=clock)
    short, long = await start(book, 10.0), await start(book, 20.0)
    clock.now = 115.0
    book.sweep()
    with pytest.raises(TimeoutError):
        await short
    assert not long.done() and len(book) == 1
    assert book._timer is not None
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    assert len(book) == 0
    clock.now = 130.0
    book.sweep()
    assert book._timer is None


async def test_a_request_cancelled_by_someone_else_too_is_cancelled_not_timed_out() -> None:
    clock = Clock()
    book = Deadlines(tick_secs=FAR_TICK_SECS, clock=clock)
    task = await start(book, 5.0)
    # Its client leaves in the same turn as its deadline passes.
    clock.now = 105.0
    book.sweep()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_deadline_counts_only_its_own_cancellation() -> None:
    clock = Clock()
    book = Deadlines(tick_secs=FAR_TICK_SECS, clock=clock)
    task = asyncio.current_task()
    assert task is not None
    deadline = book.hold(1.0)
    assert isinstance(deadline, Deadline) and not deadline.expired
    # Not expired: whatever cancelled the task, it was not the deadline.
    assert not deadline.expired_now()
    book.release(deadline)
    assert len(book) == 0


async def test_the_timer_ticks_by_itself_on_the_running_loop() -> None:
    book = Deadlines(tick_secs=0.01)
    task = await start(book, 0.0)
    # A deadline already passed: the first tick ends it.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(task, 5.0)
    assert len(book) == 0
