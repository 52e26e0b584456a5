"""A reader's flush while a periodic flush is still writing (analytics, the decision log)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from asgiref.sync import async_to_sync


def second_flush_returned_early(
    flush: Callable[[], Awaitable[int]], writing: threading.Event, release: threading.Event
) -> bool:
    """Start a flush, and once its write is under way (`writing`) a second one; True when the
    second returned before the first's write was let go (`release`)."""

    async def run() -> bool:
        first = asyncio.ensure_future(flush())
        await asyncio.to_thread(writing.wait, 10)
        second = asyncio.ensure_future(flush())
        await asyncio.sleep(0)  # the second flush runs as far as it can
        early = second.done()
        release.set()
        await asyncio.gather(first, second)
        return early

    returned_early: bool = async_to_sync(run)()
    return returned_early
