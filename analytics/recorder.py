"""Buffered analytics writes, kept off the request path.

Requests append a plain tuple-like sample to an in-memory buffer (no I/O, no await); a task
on the router's loop flushes the buffer in one transaction `FLUSH_DELAY_SECS` after a row
arrives, so a burst is one transaction. A failed flush puts the rows back and is retried every
`FLUSH_RETRY_SECS`; the buffer is bounded so a dead database cannot grow memory without limit.

The flushes write on one database connection, kept open from one flush to the next (checked
before each reuse, closed after a failed write and when the recorder stops): opening one for
every flush, about twenty a second under load, cost the router more CPU than the rows it wrote.
They run on a thread of their own, at a lower CPU priority than the router's (`_lower_priority`).

Under steady load flushes start `FLUSH_MIN_INTERVAL_SECS` apart, so a flush writes about a
quarter second of rows.

What a crash (kill -9, power loss) can lose: the rows of requests answered within about
`FLUSH_DELAY_SECS` plus one write before it on a quiet node, within `FLUSH_MIN_INTERVAL_SECS`
plus one write under load (it used to be a one-second tick: 0.7 to 1.6 s of answered requests
were lost), and while the database is down, every row still buffered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async

from routerproject.dbhealth import DATABASE, is_database_error

logger = logging.getLogger(__name__)

# Short enough that a crash loses little, long enough that a burst of requests is one write.
FLUSH_DELAY_SECS = 0.05
# Under steady load a row arrives within every delay, and flushing each time meant twenty
# transactions a second (their commits and the hops to the writer thread cost the router more
# CPU than the rows themselves): flushes start at least this far apart.
FLUSH_MIN_INTERVAL_SECS = 0.25
FLUSH_RETRY_SECS = 1.0
MAX_BUFFERED_ROWS = 10_000
# How far below the router's CPU priority the writer runs. Nice 10 weighs a tenth of nice 0:
# the writer yields to the request path, yet still gets several times the ~13 us a row it
# needs at thousands of rows a second on a saturated machine (at 19, a fiftieth, it could fall
# behind and fill the buffer).
WRITER_NICE_STEPS = 10
MAX_NICE = 19


@dataclass(slots=True)
class RequestSample:
    node_id: str
    model_id: str
    config_filename: str
    lane: str
    path: str
    status: int
    success: bool
    stream: bool
    prompt_bytes: int
    prompt_tokens: int
    output_tokens: int
    image_width: int
    image_height: int
    image_steps: int
    image_count: int
    duration_ms: float
    started_at: float
    finished_at: float
    borrowed: bool = False
    request_id: str | None = None
    cached_tokens: int = 0
    key_name: str | None = None


@dataclass(frozen=True)
class LoadEvent:
    """What analytics records for every load attempt (the runtimes report each one here)."""

    lane: str
    model_id: str
    config_filename: str
    duration_ms: float
    success: bool
    reason: str
    error: str
    finished_at: float


class Recorder:
    def __init__(self, *, node_id: str, enabled: bool = True) -> None:
        self.node_id = node_id
        self.enabled = enabled
        self._requests: list[RequestSample] = []
        self._loads: list[LoadEvent] = []
        self.dropped = 0
        self._task: asyncio.Task[None] | None = None
        # One flush at a time: a reader (the analytics view) flushes and then reads, so its
        # flush must not return while the periodic one is still writing rows it took.
        self._flushing = asyncio.Lock()
        # Set by every row added; the flush task waits on it instead of ticking.
        self._wake = asyncio.Event()
        self._failed = False
        self.written: list[Callable[[list[RequestSample]], None]] = []
        """Called with the request rows of each flush once they are in the database (lending
        refits a model the moment its rows reach the fit threshold)."""

    def add_request(self, sample: RequestSample) -> None:
        if not self.enabled:
            return
        if len(self._requests) >= MAX_BUFFERED_ROWS:
            self._requests.pop(0)
            self.dropped += 1
        self._requests.append(sample)
        self._wake.set()

    def add_load(self, event: LoadEvent) -> None:
        if not self.enabled:
            return
        if len(self._loads) >= MAX_BUFFERED_ROWS:
            self._loads.pop(0)
            self.dropped += 1
        self._loads.append(event)
        self._wake.set()

    def pending(self) -> int:
        return len(self._requests) + len(self._loads)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = float("-inf")
        while True:
            await self._wake.wait()
            await asyncio.sleep(flush_delay(loop.time() - last))
            self._wake.clear()
            last = loop.time()
            await self.flush()
            if self._failed:
                # The database is down: the rows are back in the buffer; try again at a pace
                # that does not hammer it.
                await asyncio.sleep(FLUSH_RETRY_SECS)
                self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self.flush()
        await _close_kept()

    async def flush(self) -> int:
        """Write every row buffered when it was called; returns how many this call wrote."""
        async with self._flushing:
            return await self._flush_buffered()

    async def _flush_buffered(self) -> int:
        requests, self._requests = self._requests, []
        loads, self._loads = self._loads, []
        if not requests and not loads:
            return 0
        self._failed = True
        try:
            await _write_kept(self.node_id, requests, loads)
        except Exception as exc:
            if is_database_error(exc):
                # An outage: one line when it starts, not a traceback every flush.
                DATABASE.failed("analytics flush", exc)
            else:
                logger.exception(
                    "analytics flush failed; keeping %d rows", len(requests) + len(loads)
                )
            self._requests[:0] = requests
            self._loads[:0] = loads
            # Rows that arrived during the failed flush sit behind the returned ones; the bound
            # still holds, and whatever it pushes out is counted, never lost silently.
            self.dropped += _trim(self._requests) + _trim(self._loads)
            return 0
        self._failed = False
        DATABASE.succeeded()
        for listener in self.written:
            try:
                listener(requests)
            except Exception:
                logger.exception("a listener of written analytics rows failed")
        return len(requests) + len(loads)


def flush_delay(since_last_flush: float) -> float:
    """How long a row that wakes the flush task waits: `FLUSH_DELAY_SECS`, or until
    `FLUSH_MIN_INTERVAL_SECS` after the last flush began when that is later."""
    return max(FLUSH_DELAY_SECS, FLUSH_MIN_INTERVAL_SECS - since_last_flush)


def _write_on_kept_connection(
    node_id: str, requests: list[RequestSample], loads: list[LoadEvent]
) -> None:
    """`_write` on this thread's connection, left open for the next flush.

    `database_sync_to_async` closes the connection before and after every call (the node runs
    with CONN_MAX_AGE=0); here only a failed write closes it. A connection kept from an earlier
    flush is checked first (a restarted server, a dropped socket), as Django's
    CONN_HEALTH_CHECKS would, so a stale one costs a reconnect rather than a failed flush.
    """
    from django.db import connection

    if connection.connection is not None and not connection.is_usable():
        connection.close()
    try:
        _write(node_id, requests, loads)
    except BaseException:
        connection.close()
        raise


def _close_kept_connection() -> None:
    from django.db import connection

    connection.close()


def _lower_priority() -> None:
    """The writer thread runs `WRITER_NICE_STEPS` below the router's CPU priority.

    A flush is a few ms of CPU every quarter second under load. At the router's own priority
    the scheduler let it preempt the event loop whenever the cores were busy (the client's
    process, a backend), and the requests of those moments waited: the proxy's added p99 was
    1.3-1.6 ms with analytics on against 0.8-0.9 ms with it off or with this (bench/overhead.py).
    Linux sets a nice value per thread; elsewhere the writer keeps the process's priority.
    """
    if not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    with contextlib.suppress(OSError):
        nice = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(MAX_NICE, nice + WRITER_NICE_STEPS))


# One thread of its own for every flush, so the kept connection is there for the next flush
# and the lower priority applies to these writes alone (not to the loop's other ORM calls).
_WRITER = ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="analytics-writer", initializer=_lower_priority
)
_write_kept = sync_to_async(_write_on_kept_connection, thread_sensitive=False, executor=_WRITER)
_close_kept = sync_to_async(_close_kept_connection, thread_sensitive=False, executor=_WRITER)


def _trim(rows: list[Any]) -> int:
    excess = len(rows) - MAX_BUFFERED_ROWS
    if excess > 0:
        del rows[:excess]
        return excess
    return 0


def _ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


REQUEST_COLUMNS = (
    "node_id",
    "model_id",
    "config_filename",
    "lane",
    "path",
    "status",
    "success",
    "borrowed",
    "stream",
    "prompt_bytes",
    "prompt_tokens",
    "output_tokens",
    "image_width",
    "image_height",
    "image_steps",
    "image_count",
    "duration_ms",
    "started_at",
    "finished_at",
    "request_id",
    "cached_tokens",
    "key_name",
)
LOAD_COLUMNS = (
    "node_id",
    "model_id",
    "config_filename",
    "lane",
    "reason",
    "success",
    "error",
    "duration_ms",
    "finished_at",
)


def _insert_sql(table: str, columns: tuple[str, ...]) -> str:
    marks = ", ".join(["%s"] * len(columns))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


def _timestamp_adapter(connection: Any) -> Callable[[float], Any]:
    """Seconds since the epoch as the backend's adapter stores a UTC datetime of them.

    SQLite's adapter turns an aware datetime into the naive text of it in the connection's
    time zone, looking the zone up for every value: two timestamps a row cost the writer
    thread ~8 us of CPU a row. Here the zone is looked up once a flush, and the text of the
    whole second once a second (a flush's rows share a few seconds): ~0.6 us a timestamp.
    """
    from django.conf import settings

    adapt = connection.ops.adapt_datetimefield_value
    if connection.vendor != "sqlite" or not settings.USE_TZ:
        return lambda seconds: adapt(_ts(seconds))
    zone = connection.timezone
    last: list[Any] = [None, ""]

    def text(seconds: float) -> str:
        # `datetime.fromtimestamp`'s own split of a (positive) time: the fraction rounded
        # half-even to the microsecond, a rounded-up million carried into the second.
        fraction, whole = math.modf(seconds)
        micros = round(fraction * 1e6)
        if micros >= 1_000_000:
            micros -= 1_000_000
            whole += 1.0
        if whole != last[0]:
            last[0] = whole
            last[1] = str(datetime.fromtimestamp(whole, tz=zone).replace(tzinfo=None))
        second: str = last[1]
        # str(datetime) leaves out a zero fraction.
        return f"{second}.{micros:06d}" if micros else second

    return text


def _write(node_id: str, requests: list[RequestSample], loads: list[LoadEvent]) -> None:
    # One executemany per table: at hundreds of requests a second, building ORM instances for
    # bulk_create cost the router process ~10% of a core (measured), under the same GIL as the
    # proxy. Values go through the backend's own adapters, so SQLite and PostgreSQL store
    # exactly what the ORM would.
    from django.db import connection, transaction

    from analytics.models import LoadRecord, RequestRecord

    ts = _timestamp_adapter(connection)
    request_rows = [
        (
            s.node_id,
            s.model_id,
            s.config_filename,
            s.lane,
            s.path,
            s.status,
            s.success,
            s.borrowed,
            s.stream,
            s.prompt_bytes,
            s.prompt_tokens,
            s.output_tokens,
            s.image_width,
            s.image_height,
            s.image_steps,
            s.image_count,
            s.duration_ms,
            ts(s.started_at),
            ts(s.finished_at),
            s.request_id,
            s.cached_tokens,
            s.key_name,
        )
        for s in requests
    ]
    load_rows = [
        (
            node_id,
            e.model_id,
            e.config_filename,
            e.lane,
            e.reason,
            e.success,
            e.error,
            e.duration_ms,
            ts(e.finished_at),
        )
        for e in loads
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        if request_rows:
            cursor.executemany(
                _insert_sql(RequestRecord._meta.db_table, REQUEST_COLUMNS), request_rows
            )
        if load_rows:
            cursor.executemany(_insert_sql(LoadRecord._meta.db_table, LOAD_COLUMNS), load_rows)
