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
import base64
import bisect
import json
import logging
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from channels.db import database_sync_to_async

from routerproject.errors import RouterError

__all__ = [
    "DECISION_FIELDS",
    "DECISION_OUTCOMES",
    "LANES",
    "OUTCOME_TEXT",
    "REASON_TEXT",
    "DecisionLog",
    "decisions_fold",
    "decisions_query",
    "fold_cursor",
    "merge_folds",
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
    ("key_name", str),
)
DECISION_FIELDS: tuple[str, ...] = tuple(name for name, _ in _COLUMNS)
TEXT_FIELDS = tuple(name for name, kind in _COLUMNS if kind is str)
INT_FIELDS = tuple(name for name, kind in _COLUMNS if kind is int)
FLOAT_FIELDS = tuple(name for name, kind in _COLUMNS if kind is float)
# The decision log folds rows that agree on the signature and shows each measure's range
# across the fold: what says who decided what, and the numbers it weighed.
# The trigger (which queue event asked) is not part of it: the same decision taken on
# `enqueued` and on `completed` is one decision, and each fold counts its triggers instead.
FOLD_SIGNATURE: tuple[str, ...] = (
    "node_id",
    "kind",
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

# Every outcome and reason our code writes, each explained in the operator's words (the
# Lending tab's legend and tooltips). A test keeps these in step with the code that records.
OUTCOME_TEXT: dict[str, str] = {
    "granted": "The master gave the owner a lease on this helper.",
    "probe": "The master sent one request to an idle helper to measure it.",
    "skipped": "The master did not lend to this helper (see the reason).",
    "kept": "The master kept the owner's lease although nothing of it was held.",
    "lease_updated": "The owner took a new or changed lease.",
    "lease_cleared": "The owner's lease ended.",
    "lease_refused": "The owner refused a lease it cannot use.",
    "lent": "The owner lent a held request to the helper.",
    "returned": "A lent request came back to its owner, which runs it.",
    "held_for_helper": "The owner kept a request back for a helper that finishes sooner.",
    "relay_refused": "The master could not pass a lent request on (see the reason).",
    "native_waited_behind_borrowed": "The helper's own request waited behind borrowed work.",
    "borrowed_returned": "The helper handed a borrowed request back to its owner.",
}
DECISION_OUTCOMES: tuple[str, ...] = tuple(OUTCOME_TEXT)
REASON_TEXT: dict[str, str] = {
    "cost_rejected": "Lending would not finish the work sooner than the owner alone.",
    "owner_unpriced": "The owner has too few measured requests to price its backlog.",
    "switch_unpriced": "The helper's model load time has not been measured yet.",
    "restore_unpriced": "The time to reload the helper's previous model is not measured yet.",
    "service_unpriced": "Neither the helper nor the owner can price this work yet.",
    "helper_recently_busy": "The helper was busy with its own work too recently.",
    "helper_not_accepting": "The helper has its own work and takes no borrowed work now.",
    "helper_claimed": "Another owner holds this helper in the same plan.",
    "load_forbidden": "The helper would have to load the model and the link forbids it.",
    "context_too_small": "The helper's context window is too small for the held requests.",
    "outranked": "Another helper finishes the work sooner.",
    "nothing_held": "The owner runs its own work with nothing to lend; its next may go out.",
    "refilled": "A lent slot freed and the owner filled it at once under its live lease.",
    "not_an_owner": "The lease names a model that does not lend from this node.",
    "helper_finishes_sooner": "The helper is expected to answer before the owner could.",
    "no_live_lease": "The owner had no live lease for this helper any more.",
    "helper_is_master": "The lease named the master itself as the helper.",
    "helper_unreachable": "The master could not reach the helper.",
    "forward_failed": "Passing the request to the helper failed.",
    "helper_stalled": "The helper stopped answering; its lent work went back to the owner.",
    "helper_cut_off": "The helper's answer broke off before it was whole; the owner ran it.",
    "own_work_arrived": "The helper's own request arrived before the borrowed one started.",
    "helper_busy_on_arrival": "The helper was busy with its own work when the request came.",
}

# Converters applied on the writer thread: one row with a wrong type (a numpy float, a None
# meaning "no value", which becomes the column default) must not fail the whole batch.
_CONVERTERS: tuple[Callable[[Any], Any], ...] = tuple(
    str if name in TEXT_FIELDS else int if name in INT_FIELDS else float for name in DECISION_FIELDS
)
# Nullable text columns: a row about no request in particular (a plan, a lease update) stores
# NULL there, not '', so "rows of this request" and "rows of no request" stay apart in SQL.
NULLABLE_FIELDS = frozenset({"request_id", "key_name"})
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
        # One flush at a time: the decision routes flush and then read, so a flush must not
        # return while the periodic one is still writing rows it took.
        self._flushing = asyncio.Lock()

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
        async with self._flushing:
            return await self._flush_buffered()

    async def _flush_buffered(self) -> int:
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


def _filtered(
    *,
    lane: str | None,
    outcome: str | None,
    kind: str | None,
    since_ms: int | None,
    until_ms: int | None = None,
    model_id: str | None = None,
    request_id: str | None = None,
    node_id: str | None = None,
) -> Any:
    from django.db.models import Q

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
    if until_ms is not None:
        rows = rows.filter(recorded_at__lte=until_ms)
    if model_id:
        rows = rows.filter(Q(owner_model_id=model_id) | Q(helper_model_id=model_id))
    if request_id:
        rows = rows.filter(request_id=request_id)
    if node_id:
        rows = rows.filter(node_id=node_id)
    return rows


def decisions_query(
    *,
    lane: str | None,
    outcome: str | None,
    kind: str | None,
    since_ms: int | None,
    limit: int,
    until_ms: int | None = None,
    model_id: str | None = None,
    request_id: str | None = None,
    node_id: str | None = None,
) -> list[dict[str, Any]]:
    """This database's decision rows, newest first, zero-valued optional fields omitted."""
    if limit < 1:
        return []
    rows = _filtered(
        lane=lane,
        outcome=outcome,
        kind=kind,
        since_ms=since_ms,
        until_ms=until_ms,
        model_id=model_id,
        request_id=request_id,
        node_id=node_id,
    )
    ordered = rows.order_by("-recorded_at", "-id").values("id", *DECISION_FIELDS)[:limit]
    return [_compact(row) for row in ordered]


# A node answers at most this many folds; a log with more distinct decisions in the window says
# so (`truncated`) instead of growing the answer without bound.
MAX_FOLDS_PER_NODE = 2000
# The rollup's minute (migration 0004 writes the same arithmetic into its triggers).
FOLD_BUCKET_MS = 60_000
REQUEST_ID_SAMPLE = 10
FOLD_TABLE = "offload_decision_folds"
SIGNATURE_TABLE = "offload_decision_signatures"
# The text columns a fold samples: its list, the decision column and the rollup's range name.
_SAMPLED: tuple[tuple[str, str, str], ...] = (
    ("router_versions", "router_version", "version"),
    ("service_sources", "service_source", "source"),
    ("request_ids", "request_id", "request"),
    ("key_names", "key_name", "key"),
)
# A group (one signature and trigger) is one tuple, laid out alike whether it came from the
# rows or the rollup: the signature, trigger, row count, first and last time, then a (min,
# max) pair per sampled column and per measure. Plain tuples from a cursor, not ORM dicts: a
# page folds a few hundred groups, and building model values for them cost more than the SQL.
_SIG = len(FOLD_SIGNATURE)
_TRIGGER, _N, _FIRST, _LAST = _SIG, _SIG + 1, _SIG + 2, _SIG + 3
_SAMPLES_AT = _SIG + 4
_MEASURES_AT = _SAMPLES_AT + 2 * len(_SAMPLED)


def _q(name: str) -> str:
    return f'"{name}"'  # `trigger` is a keyword to SQLite


def _ranges(columns: Iterable[tuple[str, str]], table: str = "") -> list[str]:
    return [f"MIN({table}{_q(lo)}), MAX({table}{_q(hi)})" for lo, hi in columns]


def _keys(table: str = "") -> str:
    return ", ".join(f"{table}{_q(c)}" for c in (*FOLD_SIGNATURE, "trigger"))


_ROW_PICKS = ", ".join(
    [
        _keys(),
        'COUNT(*), MIN("recorded_at"), MAX("recorded_at")',
        *_ranges((column, column) for _, column, _ in _SAMPLED),
        *_ranges((m, m) for m in FOLD_MEASURES),
    ]
)


_ROLLUP_AGGREGATES = ", ".join(
    [
        'SUM(r."n"), MIN(r."first_at"), MAX(r."last_at")',
        *_ranges(((f"{name}_min", f"{name}_max") for _, _, name in _SAMPLED), "r."),
        *_ranges(((f"{m}_min", f"{m}_max") for m in FOLD_MEASURES), "r."),
    ]
)
_ROLLUP_MATCH = " AND ".join(f"r.{_q(c)} = s.{_q(c)}" for c in (*FOLD_SIGNATURE, "trigger"))


class _Fold:
    """One signature's groups added up: count, span, triggers, measure ranges, samples."""

    __slots__ = ("count", "first_at", "highs", "last_at", "lows", "samples", "triggers")

    def __init__(self, g: tuple[Any, ...]) -> None:
        self.count = 0
        self.first_at: int = g[_FIRST]
        self.last_at: int = g[_LAST]
        self.triggers: dict[str, int] = {}
        self.lows: list[Any] = list(g[_MEASURES_AT::2])
        self.highs: list[Any] = list(g[_MEASURES_AT + 1 :: 2])
        self.samples: list[list[str]] = [[] for _ in _SAMPLED]

    def add(self, g: tuple[Any, ...]) -> None:
        n = int(g[_N])  # PostgreSQL sums a bigint to a numeric
        self.count += n
        self.first_at = min(self.first_at, g[_FIRST])
        self.last_at = max(self.last_at, g[_LAST])
        if g[_TRIGGER]:
            self.triggers[g[_TRIGGER]] = self.triggers.get(g[_TRIGGER], 0) + n
        self.lows = list(map(min, self.lows, g[_MEASURES_AT::2]))
        self.highs = list(map(max, self.highs, g[_MEASURES_AT + 1 :: 2]))
        for i, seen in enumerate(self.samples):
            for value in g[_SAMPLES_AT + 2 * i : _SAMPLES_AT + 2 * i + 2]:
                if value and value not in seen:
                    seen.append(value)

    def doc(self, key: tuple[Any, ...]) -> dict[str, Any]:
        out: dict[str, Any] = dict(zip(FOLD_SIGNATURE, key, strict=True))
        out.update(count=self.count, first_at=self.first_at, last_at=self.last_at)
        out["triggers"] = self.triggers
        # Measures that were 0 throughout say nothing about this decision.
        out["measures"] = {
            m: [lo, hi]
            for m, lo, hi in zip(FOLD_MEASURES, self.lows, self.highs, strict=True)
            if lo != 0 or hi != 0
        }
        # Versions and sources are few; request IDs and keys differ row by row: a sample.
        for (field, column, _), seen in zip(_SAMPLED, self.samples, strict=True):
            out[field] = sorted(seen)[:REQUEST_ID_SAMPLE] if column in NULLABLE_FIELDS else seen
        return out


def decisions_fold(
    *,
    lane: str | None,
    outcome: str | None,
    kind: str | None,
    since_ms: int | None,
    until_ms: int | None = None,
    model_id: str | None = None,
    request_id: str | None = None,
    node_id: str | None = None,
    max_folds: int = MAX_FOLDS_PER_NODE,
) -> dict[str, Any]:
    """This database's decision rows folded by FOLD_SIGNATURE, in the database (GROUP BY).

    Each fold has the signature fields, its row `count`, `first_at`/`last_at`, the count of
    each trigger, and per measure its `[min, max]`; folds come newest `last_at` first (then by
    signature, so equal times keep one order).

    Whole minutes of the window are read from the rollup (`offload_decision_folds`, one row
    per signature, trigger and minute, kept by the database as rows are written); the window's
    first minute (the oldest rows, the ones pruning takes) and a partial last minute from the
    rows themselves. Asked for one request, the rows themselves (its index finds them).
    """
    narrow = dict(lane=lane, outcome=outcome, kind=kind, model_id=model_id, node_id=node_id)
    # One group per signature and trigger; the triggers are folded together below, so the
    # limit is on those finer groups, newest first.
    cap = max_folds * 4
    if request_id:
        narrow["request_id"] = request_id
        fine = _row_groups((since_ms, until_ms), narrow, cap)
        fine, truncated = fine[:cap], len(fine) > cap
    else:
        fine, truncated = _window_groups(since_ms, until_ms, cap, narrow)
    folds: dict[tuple[Any, ...], _Fold] = {}
    for g in fine:
        key = g[:_SIG]
        if key not in folds:
            folds[key] = _Fold(g)
        folds[key].add(g)
    ordered = sorted(folds.items(), key=lambda kv: (-kv[1].last_at, kv[0]))
    if len(ordered) > max_folds:
        ordered, truncated = ordered[:max_folds], True
    out = [fold.doc(key) for key, fold in ordered]
    return {"folds": out, "rows": sum(f["count"] for f in out), "truncated": truncated}


def _row_groups(
    span: tuple[int | None, int | None], narrow: Mapping[str, Any], cap: int
) -> list[tuple[Any, ...]]:
    """Groups by signature and trigger of the rows recorded in `span` (inclusive), newest
    first, at most `cap` + 1 (one more says the cap cut some)."""
    from django.db import connection

    conditions, params = [], []
    for bound, op in zip(span, (">=", "<="), strict=True):
        if bound is not None:
            conditions.append(f'"recorded_at" {op} %s')
            params.append(bound)
    narrowing, narrow_params = _narrowing(narrow, "")
    conditions += narrowing
    params += narrow_params
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    sql = (
        f"SELECT {_ROW_PICKS} FROM {TABLE} {where} GROUP BY {_keys()} "
        f"ORDER BY {_LAST + 1} DESC LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, cap + 1])
        return [tuple(row) for row in cursor.fetchall()]


def _narrowing(narrow: Mapping[str, Any], table: str) -> tuple[list[str], list[Any]]:
    """The filters as SQL conditions on `table`'s signature columns, with their parameters."""
    conditions, params = [], []
    for name in ("lane", "outcome", "kind", "node_id", "request_id"):
        if narrow.get(name):
            conditions.append(f"{table}{_q(name)} = %s")
            params.append(narrow[name])
    if narrow.get("model_id"):
        owner, helper = f"{table}{_q('owner_model_id')}", f"{table}{_q('helper_model_id')}"
        conditions.append(f"({owner} = %s OR {helper} = %s)")
        params += [narrow["model_id"]] * 2
    return conditions, params


def _bucket_groups(
    first: int, last: int, narrow: Mapping[str, Any], cap: int
) -> list[tuple[Any, ...]]:
    """Groups by signature and trigger of the rollup's minutes `first` to `last` (inclusive),
    newest first, at most `cap` + 1."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(*_bucket_groups_sql(first, last, narrow, cap))
        return [tuple(row) for row in cursor.fetchall()]


def _bucket_groups_sql(
    first: int, last: int, narrow: Mapping[str, Any], cap: int
) -> tuple[str, list[Any]]:
    """The query of `_bucket_groups`, as this database runs it best.

    PostgreSQL hashes the window's rollup rows into groups. SQLite has no hash aggregate: its
    GROUP BY sorts every rollup row of the window, every column the aggregates read. There the
    query walks the signatures (`s`) instead, each one's minutes a seek into the rollup's (`r`)
    unique index, which holds them in group order: no sort, and a signature whose newest row
    is older than the window is skipped.
    """
    from django.db import connection

    order = f"ORDER BY {_LAST + 1} DESC LIMIT %s"
    if connection.vendor != "sqlite":
        narrowing, params = _narrowing(narrow, "r.")
        where = " AND ".join(["r.bucket_ms >= %s", "r.bucket_ms <= %s", *narrowing])
        sql = (
            f"SELECT {_keys('r.')}, {_ROLLUP_AGGREGATES} FROM {FOLD_TABLE} r WHERE {where} "
            f"GROUP BY {_keys('r.')} {order}"
        )
        return sql, [first, last, *params, cap + 1]
    narrowing, params = _narrowing(narrow, "s.")
    # CROSS JOIN: SQLite keeps the signatures as the outer loop.
    conditions = ["s.last_at >= %s", *narrowing, _ROLLUP_MATCH, "r.bucket_ms >= %s"]
    conditions.append("r.bucket_ms <= %s")
    sql = (
        f"SELECT {_keys('s.')}, {_ROLLUP_AGGREGATES} FROM {SIGNATURE_TABLE} s "
        f"CROSS JOIN {FOLD_TABLE} r WHERE {' AND '.join(conditions)} GROUP BY s.id {order}"
    )
    return sql, [first, *params, first, last, cap + 1]


def _window_groups(
    since_ms: int | None, until_ms: int | None, cap: int, narrow: dict[str, Any]
) -> tuple[list[tuple[Any, ...]], bool]:
    """The groups of a window: its first minute and a partial last one from the rows, the
    whole minutes between from the rollup; and whether any part was cut at `cap`."""
    from django.db import connection

    with connection.cursor() as cursor:
        # Two subqueries: each MIN or MAX alone is one step down the index, both in one
        # SELECT would scan it on SQLite.
        cursor.execute(
            f'SELECT (SELECT MIN("recorded_at") FROM {TABLE}), '
            f'(SELECT MAX("recorded_at") FROM {TABLE})'
        )
        oldest, newest = cursor.fetchone()
    if oldest is None:
        return [], False
    start = oldest if since_ms is None else max(since_ms, oldest)
    # The rows of the first minute: a minute that lost rows to pruning has a stale range in
    # the rollup, and pruning always takes the oldest minute.
    first_whole = (start // FOLD_BUCKET_MS + 1) * FOLD_BUCKET_MS
    head_until = first_whole - 1 if until_ms is None else min(until_ms, first_whole - 1)
    parts = [_row_groups((start, head_until), narrow, cap)]
    if until_ms is None or until_ms >= first_whole:
        # Whole minutes up to the last one the window covers entirely; with no end, up to the
        # newest row's (a bound on every seek into the rollup's index).
        if until_ms is None:
            end = (newest // FOLD_BUCKET_MS + 1) * FOLD_BUCKET_MS
        else:
            end = (until_ms + 1) // FOLD_BUCKET_MS * FOLD_BUCKET_MS
        if end > first_whole:
            parts.append(_bucket_groups(first_whole, end - FOLD_BUCKET_MS, narrow, cap))
        if until_ms is not None and end <= until_ms:
            parts.append(_row_groups((end, until_ms), narrow, cap))
    truncated = any(len(part) > cap for part in parts)
    return [g for part in parts for g in part[:cap]], truncated


def _fold_order(fold: Mapping[str, Any]) -> tuple[Any, ...]:
    """Newest `last_at` first, then by signature: one order for any set of folds, which a
    cursor can point into."""
    return (-int(fold.get("last_at", 0)), *(str(fold.get(k) or "") for k in FOLD_SIGNATURE))


def fold_cursor(fold: Mapping[str, Any]) -> str:
    """The opaque cursor of the page that starts after `fold`: its place in `_fold_order`
    (the API's `cursor` parameter turns it back into that place)."""
    place = [int(fold.get("last_at", 0)), *(str(fold.get(k) or "") for k in FOLD_SIGNATURE)]
    return base64.urlsafe_b64encode(json.dumps(place).encode()).decode().rstrip("=")


def merge_folds(
    per_node: Mapping[str, Mapping[str, Any]],
    *,
    offset: int,
    limit: int,
    after: tuple[Any, ...] | None = None,
) -> dict[str, Any]:
    """Several nodes' folds as one page, newest `last_at` first.

    The node is part of the signature, so folds from two nodes never merge: the page is a
    slice of all of them, with the totals an operator needs to know what is not shown.
    `after` (a parsed cursor) starts the page after that place in the order rather than at a
    count of folds: a fold that turned up on top since the last page moves nothing, so the
    next page neither repeats a line nor skips one. `offset` then counts from there.
    """
    folds: list[dict[str, Any]] = []
    rows = 0
    truncated: list[str] = []
    for node_key, doc in per_node.items():
        folds.extend(f for f in doc.get("folds", []) if isinstance(f, dict))
        rows += int(doc.get("rows", 0))
        if doc.get("truncated"):
            truncated.append(node_key)
    folds.sort(key=_fold_order)
    first = offset
    if after is not None:
        first += bisect.bisect_right([_fold_order(f) for f in folds], after)
    page, more = folds[first : first + limit], first + limit < len(folds)
    return {
        "folds": page,
        "offset": offset,
        "total_folds": len(folds),
        "total_rows": rows,
        "truncated_nodes": sorted(truncated),
        "next_cursor": fold_cursor(page[-1]) if page and more else None,
    }


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
    until_ms = _whole(query, "until_ms", minimum=0)
    if since_ms is not None and until_ms is not None and until_ms < since_ms:
        raise RouterError(400, "until_ms must not be before since_ms", param="until_ms")
    lane = query.get("lane", "").strip()
    if lane and lane not in LANES:
        raise RouterError(400, "lane must be image or text", param="lane")
    return {
        "lane": lane or None,
        "outcome": query.get("outcome", "").strip() or None,
        "kind": query.get("kind", "").strip() or None,
        "since_ms": since_ms,
        "until_ms": until_ms,
        "model_id": query.get("model_id", "").strip() or None,
        "request_id": query.get("request_id", "").strip() or None,
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
