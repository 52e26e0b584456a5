"""The lending decision log: buffered writes from the router process, and its query side.

Planner, owner and helper code call ``DecisionLog.record`` on the event loop while they
decide, often several times per request, so recording is a plain append to a bounded deque:
no I/O, no await, no ORM instance. A task flushes the buffer every second in one
transaction on a worker thread. A failed flush puts the rows back; the bound means a dead
database costs at most ``MAX_BUFFERED_ROWS`` rows of memory, and every row it pushes out is
counted in ``dropped`` instead of vanishing silently.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from channels.db import database_sync_to_async

from routerproject.errors import RouterError

__all__ = [
    "DECISION_FIELDS",
    "LANES",
    "DecisionLog",
    "decisions_query",
    "merge_node_records",
    "parse_decision_filters",
]

logger = logging.getLogger(__name__)
# One line per lending event an operator follows (a lease, a lend, a return, a refusal); the
# master's per-pair plan rows go at DEBUG: a plan writes one per owner and helper.
events = logging.getLogger("router.lending")
_EVENT_KINDS = frozenset({"dispatch", "helper"})
_EVENT_FIELDS = (
    "lane",
    "owner_node_id",
    "owner_model_id",
    "helper_node_id",
    "helper_model_id",
    "reason",
    "slots",
    "lent_out",
)

FLUSH_INTERVAL_SECS = 1.0
MAX_BUFFERED_ROWS = 10_000
TABLE = "offload_decisions"

LANES = frozenset({"image", "text"})

# The columns of lending.models.OffloadDecision except the id, in model order (a test keeps
# the two in step), each with its kind. Written out rather than read from the model so that
# importing this module, which the router does at start, never needs the app registry. Every
# other list of decision fields (the API's serializer, the writer's converters, the Lending
# tab's folding) is derived from this one.
_COLUMNS: tuple[tuple[str, type], ...] = (
    ("recorded_at", int),
    ("node_id", str),
    ("kind", str),
    ("trigger", str),
    ("lane", str),
    ("owner_node_id", str),
    ("owner_model_id", str),
    ("helper_node_id", str),
    ("helper_model_id", str),
    ("outcome", str),
    ("reason", str),
    ("pending_count", int),
    ("backlog_count", int),
    ("keep_ms", float),
    ("switch_ms", float),
    ("restore_ms", float),
    ("service_ms", float),
    ("owner_job_ms", float),
    ("service_source", str),
    ("helper_idle_ms", int),
    ("slots", int),
    ("lent_out", int),
    ("borrowed_ahead", int),
    ("wait_ms", int),
    ("router_version", str),
    ("request_id", str),
)
DECISION_FIELDS: tuple[str, ...] = tuple(name for name, _ in _COLUMNS)
TEXT_FIELDS = tuple(name for name, kind in _COLUMNS if kind is str)
INT_FIELDS = tuple(name for name, kind in _COLUMNS if kind is int)
FLOAT_FIELDS = tuple(name for name, kind in _COLUMNS if kind is float)
# The Lending tab folds consecutive rows that agree on the signature and shows each measure's
# range across the fold: what says who decided what, and the numbers it weighed.
FOLD_SIGNATURE: tuple[str, ...] = (
    "node_id",
    "kind",
    "trigger",
    "lane",
    "owner_node_id",
    "owner_model_id",
    "helper_node_id",
    "helper_model_id",
    "outcome",
    "reason",
)
FOLD_MEASURES: tuple[str, ...] = tuple(
    name for name, kind in _COLUMNS if kind is not str and name != "recorded_at"
)
_FIELD_SET = frozenset(DECISION_FIELDS)

# Converters applied on the writer thread: one row with a wrong type (a numpy float, a
# None meaning "no value", which becomes the column default) must not fail the whole
# batch, and with it every flush after it.
_CONVERTERS: tuple[Callable[[Any], Any], ...] = tuple(
    str if name in TEXT_FIELDS else int if name in INT_FIELDS else float for name in DECISION_FIELDS
)
# Nullable text columns: a row about no request in particular (a plan, a lease update) stores
# NULL there, not '', so "rows of this request" and "rows of no request" stay apart in SQL.
NULLABLE_FIELDS = frozenset({"request_id"})
_TYPES: tuple[type | tuple[type, ...], ...] = tuple(
    (str, type(None))
    if name in NULLABLE_FIELDS
    else str
    if name in TEXT_FIELDS
    else int
    if name in INT_FIELDS
    else (int, float)
    for name in DECISION_FIELDS
)
_DEFAULTS: dict[str, Any] = {
    name: None
    if name in NULLABLE_FIELDS
    else ""
    if name in TEXT_FIELDS
    else 0
    if name in INT_FIELDS
    else 0.0
    for name in DECISION_FIELDS
}

# Always present in a record; every other field is left out when it is '' or 0.
_ALWAYS_SHOWN = frozenset({"id", "recorded_at", "node_id", "kind", "router_version"})

_WHOLE_NUMBER_RE = re.compile(r"[0-9]+")

_INSERT_SQL = (
    f"INSERT INTO {TABLE} ({', '.join(DECISION_FIELDS)}) "
    f"VALUES ({', '.join(['%s'] * len(DECISION_FIELDS))})"
)


class DecisionLog:
    """In-memory buffer of decision rows for one router process."""

    def __init__(self, *, node_id: str, router_version: str, clock_ms: Callable[[], int]) -> None:
        self.node_id = node_id
        self.router_version = router_version
        self._clock_ms = clock_ms
        self._rows: deque[dict[str, Any]] = deque(maxlen=MAX_BUFFERED_ROWS)
        self.dropped = 0
        self.counts: Counter[tuple[str, str, str, str]] = Counter()
        """Rows recorded by (kind, outcome, reason, lane) since start: what /metrics counts."""
        self._task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event | None = None
        self._failing = False

    def record(self, **fields: Any) -> None:
        """Buffer one decision row; the field names are the ``offload_decisions`` columns."""
        if not _FIELD_SET.issuperset(fields):
            unknown = sorted(fields.keys() - _FIELD_SET)
            raise TypeError(f"unknown decision field(s): {', '.join(unknown)}")
        fields.setdefault("node_id", self.node_id)
        fields.setdefault("router_version", self.router_version)
        if "recorded_at" not in fields:
            fields["recorded_at"] = self._clock_ms()
        if len(self._rows) == MAX_BUFFERED_ROWS:
            # The deque's maxlen drops the oldest row on append; count it.
            self.dropped += 1
        self._rows.append(fields)
        kind = fields.get("kind", "")
        outcome = fields.get("outcome", "")
        self.counts[(kind, outcome, fields.get("reason", ""), fields.get("lane", ""))] += 1
        level = logging.INFO if kind in _EVENT_KINDS else logging.DEBUG
        if events.isEnabledFor(level):
            _log_event(level, kind, outcome, fields)

    def pending(self) -> int:
        return len(self._rows)

    def start(self) -> None:
        """Flush every ``FLUSH_INTERVAL_SECS`` on the running loop until ``stop``."""
        if self._task is None or self._task.done():
            # Created here, not in __init__: the log may be built before the loop exists.
            self._stopping = asyncio.Event()
            self._task = asyncio.ensure_future(self._run(self._stopping))

    async def _run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), FLUSH_INTERVAL_SECS)
            except TimeoutError:
                pass
            await self.flush()

    async def stop(self) -> None:
        """Stop the flush loop and write whatever is still buffered."""
        if self._task is not None and self._stopping is not None:
            # Let a flush in progress finish instead of cancelling it mid-write: a cancelled
            # flush whose write then failed would lose its rows.
            self._stopping.set()
            await self._task
            self._task = None
        await self.flush()

    async def flush(self) -> int:
        """Write every buffered row in one transaction; returns how many were written."""
        if not self._rows:
            return 0
        batch = self._rows
        self._rows = deque(maxlen=MAX_BUFFERED_ROWS)
        try:
            written, refused = await database_sync_to_async(_write)(batch)
        except Exception:
            # Logged once per outage, not once a second while the database stays down.
            if not self._failing:
                logger.exception("decision log flush failed; keeping %d rows", len(batch))
            self._failing = True
            # Rows that arrived during the failed flush sit behind the returned ones; the
            # bound then drops the oldest, as it would have on append, and counts them.
            kept = [*batch, *self._rows]
            excess = max(0, len(kept) - MAX_BUFFERED_ROWS)
            self.dropped += excess
            self._rows = deque(kept[excess:], maxlen=MAX_BUFFERED_ROWS)
            return 0
        if self._failing:
            logger.info("decision log flushes again (%d rows dropped so far)", self.dropped)
            self._failing = False
        if refused:
            self.dropped += refused
            logger.warning("decision log: %d malformed rows dropped", refused)
        return written


def _log_event(level: int, kind: str, outcome: str, fields: Mapping[str, Any]) -> None:
    shown = {name: fields[name] for name in _EVENT_FIELDS if fields.get(name) not in (None, "", 0)}
    text = " ".join(f"{name}={value}" for name, value in shown.items())
    events.log(
        level,
        "lending %s %s %s",
        kind,
        outcome,
        text,
        extra={"event": "lending", "decision_kind": kind, "outcome": outcome, **shown},
    )


def _row_values(row: Mapping[str, Any]) -> tuple[Any, ...]:
    # _DEFAULTS is in column order and holds every column, so the merged dict is too. The
    # type check runs in C; only a row that fails it pays for per-field conversion.
    values = tuple({**_DEFAULTS, **row}.values())
    if all(map(isinstance, values, _TYPES)):
        return values
    return tuple(
        default if value is None else convert(value)
        for value, convert, default in zip(values, _CONVERTERS, _DEFAULTS.values(), strict=True)
    )


def _write(batch: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    # One executemany instead of bulk_create: building thousands of model instances costs
    # the process CPU under the same GIL as the proxy. Columns are only text, integers
    # and floats, which every backend's driver adapts natively.
    from django.db import connection, transaction

    values: list[tuple[Any, ...]] = []
    refused = 0
    for row in batch:
        try:
            values.append(_row_values(row))
        except (TypeError, ValueError, OverflowError):
            refused += 1
    if values:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(_INSERT_SQL, values)
    return len(values), refused


# -- query side ------------------------------------------------------------------------------


def _compact(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: value
        for key, value in row.items()
        if key in _ALWAYS_SHOWN or (value != "" and value != 0 and value is not None)
    }


def decisions_query(
    *,
    lane: str | None,
    outcome: str | None,
    kind: str | None,
    since_ms: int | None,
    limit: int,
    node_id: str | None = None,
) -> list[dict[str, Any]]:
    """This database's decision rows, newest first, zero-valued optional fields omitted."""
    from lending.models import OffloadDecision

    rows = OffloadDecision.objects.all()
    if lane:
        rows = rows.filter(lane=lane)
    if outcome:
        rows = rows.filter(outcome=outcome)
    if kind:
        rows = rows.filter(kind=kind)
    if since_ms is not None:
        rows = rows.filter(recorded_at__gte=since_ms)
    if node_id:
        rows = rows.filter(node_id=node_id)
    if limit < 1:
        return []
    ordered = rows.order_by("-recorded_at", "-id").values("id", *DECISION_FIELDS)[:limit]
    return [_compact(row) for row in ordered]


def _whole(query: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = query.get(name, "").strip()
    if not raw:
        return None
    if not _WHOLE_NUMBER_RE.fullmatch(raw) or int(raw) < minimum:
        raise RouterError(400, f"{name} must be a whole number of at least {minimum}", param=name)
    return int(raw)


def parse_decision_filters(
    query: Mapping[str, str], *, default_limit: int, max_limit: int
) -> dict[str, Any]:
    """Validated keyword arguments for ``decisions_query`` from a request's query string.

    A limit above ``max_limit`` is capped rather than refused: asking for "everything" is
    a reasonable request that the store answers with as much as it serves.
    """
    limit = _whole(query, "limit", minimum=1)
    if limit is None:
        limit = default_limit
    since_ms = _whole(query, "since_ms", minimum=0)
    lane = query.get("lane", "").strip()
    if lane and lane not in LANES:
        raise RouterError(400, "lane must be image or text", param="lane")
    return {
        "lane": lane or None,
        "outcome": query.get("outcome", "").strip() or None,
        "kind": query.get("kind", "").strip() or None,
        "since_ms": since_ms,
        "limit": min(limit, max_limit),
    }


def merge_node_records(
    per_node: Mapping[str, list[dict[str, Any]]], *, limit: int
) -> list[dict[str, Any]]:
    """Rows gathered from several nodes as one list, newest first, at most ``limit`` rows.

    Ties on ``recorded_at`` are broken by node, then by newest id, so the same inputs always
    give the same order (the Lending tab folds consecutive rows and must not flicker).
    """
    if limit < 1:
        return []
    rows: list[tuple[tuple[int, str, int], dict[str, Any]]] = []
    for node_key, records in per_node.items():
        for record in records:
            node = str(record.get("node_id") or node_key)
            key = (-int(record.get("recorded_at", 0)), node, -int(record.get("id", 0)))
            rows.append((key, record))
    rows.sort(key=lambda item: item[0])
    return [record for _, record in rows[:limit]]
