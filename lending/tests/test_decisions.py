"""The decision log: buffering, flushing, querying, merging across nodes, pruning."""

from __future__ import annotations

import asyncio
import builtins
import inspect
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from lending import decisions as decisions_module
from lending import services
from lending.decisions import (
    DECISION_FIELDS,
    DECISION_OUTCOMES,
    MAX_BUFFERED_ROWS,
    OUTCOME_TEXT,
    REASON_TEXT,
    DecisionLog,
    decisions_fold,
    decisions_query,
    merge_folds,
    merge_node_records,
    parse_decision_filters,
)
from lending.models import OffloadDecision
from lending.services import decisions_prune
from lending.settings_store import settings_save
from lending.tasks import prune_decisions
from lending.tests.factories import OffloadDecisionFactory
from routerproject.errors import RouterError
from tests.flushing import second_flush_returned_early

NODE_ID = "node-a"
VERSION = "1.2.3"
T0_MS = 1_750_000_000_000

# The log writes from a worker thread (database_sync_to_async), so rows must really be
# committed for it and for the test to see each other.
writer_db = pytest.mark.django_db(transaction=True)


class Clock:
    def __init__(self, start: int = T0_MS) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now


def new_log(clock: Callable[[], int] | None = None) -> DecisionLog:
    return DecisionLog(node_id=NODE_ID, router_version=VERSION, clock_ms=clock or Clock())


def flush(log: DecisionLog) -> int:
    written: int = async_to_sync(log.flush)()
    return written


def buffered(log: DecisionLog) -> list[dict[str, Any]]:
    return [dict(row) for row in log._rows]


def stored(*fields: str) -> list[tuple[Any, ...]]:
    return list(OffloadDecision.objects.order_by("id").values_list(*fields))


def make_rows(*rows: dict[str, Any]) -> None:
    OffloadDecision.objects.bulk_create(
        [
            OffloadDecisionFactory.build(**{"node_id": NODE_ID, "router_version": VERSION, **r})
            for r in rows
        ]
    )


# -- recording -------------------------------------------------------------------------------


def test_the_field_list_matches_the_table_columns() -> None:
    columns = tuple(f.column for f in OffloadDecision._meta.concrete_fields if f.column != "id")
    assert columns == DECISION_FIELDS


def test_recording_fills_node_version_and_time() -> None:
    log = new_log(Clock(T0_MS))
    log.record(kind="plan", outcome="granted", lane="image")
    log.record(kind="helper", recorded_at=42)
    assert buffered(log) == [
        {
            "kind": "plan",
            "outcome": "granted",
            "lane": "image",
            "node_id": NODE_ID,
            "router_version": VERSION,
            "recorded_at": T0_MS + 1,
        },
        {"kind": "helper", "recorded_at": 42, "node_id": NODE_ID, "router_version": VERSION},
    ]


def test_an_unknown_field_is_a_type_error_and_nothing_is_buffered() -> None:
    log = new_log()
    with pytest.raises(TypeError, match="colour"):
        log.record(kind="plan", colour="red")
    assert log.pending() == 0


def test_the_buffer_keeps_the_newest_rows_and_counts_what_it_drops() -> None:
    log = new_log()
    for i in range(MAX_BUFFERED_ROWS + 5):
        log.record(kind="plan", recorded_at=i)
    assert log.pending() == MAX_BUFFERED_ROWS
    assert log.dropped == 5
    assert buffered(log)[0]["recorded_at"] == 5
    assert buffered(log)[-1]["recorded_at"] == MAX_BUFFERED_ROWS + 4


def test_recording_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    # No django_db mark: pytest-django fails any database access in this test. Files and
    # sockets are shut off too, so only pure in-memory work can pass.
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("record() did I/O")

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(decisions_module, "database_sync_to_async", refuse)
    assert not inspect.iscoroutinefunction(DecisionLog.record)
    log = new_log()
    for i in range(2 * MAX_BUFFERED_ROWS):
        log.record(kind="dispatch", outcome="lent", slots=2, wait_ms=i)
    assert log.pending() == MAX_BUFFERED_ROWS


# -- flushing --------------------------------------------------------------------------------


@writer_db
def test_a_flush_writes_every_buffered_row_exactly() -> None:
    log = new_log(Clock(T0_MS))
    log.record(
        kind="plan",
        trigger="enqueued",
        lane="text",
        owner_node_id="node-a",
        owner_model_id="chat",
        helper_node_id="node-b",
        helper_model_id="chat-b",
        outcome="granted",
        reason="",
        pending_count=3,
        backlog_count=2,
        keep_ms=1200.5,
        switch_ms=800.0,
        restore_ms=700.25,
        service_ms=300.0,
        owner_job_ms=400.0,
        service_source="helper",
        helper_idle_ms=9000,
        slots=2,
    )
    log.record(kind="helper", outcome="native_waited_behind_borrowed", borrowed_ahead=1)
    assert flush(log) == 2
    assert log.pending() == 0
    rows = list(OffloadDecision.objects.order_by("id").values(*DECISION_FIELDS))
    assert rows[0] == {
        "recorded_at": T0_MS + 1,
        "node_id": NODE_ID,
        "kind": "plan",
        "trigger": "enqueued",
        "lane": "text",
        "owner_node_id": "node-a",
        "owner_model_id": "chat",
        "helper_node_id": "node-b",
        "helper_model_id": "chat-b",
        "outcome": "granted",
        "reason": "",
        "pending_count": 3,
        "backlog_count": 2,
        "keep_ms": 1200.5,
        "switch_ms": 800.0,
        "restore_ms": 700.25,
        "service_ms": 300.0,
        "owner_job_ms": 400.0,
        "service_source": "helper",
        "helper_idle_ms": 9000,
        "slots": 2,
        "lent_out": 0,
        "borrowed_ahead": 0,
        "wait_ms": 0,
        "router_version": VERSION,
        "request_id": None,
        "key_name": None,
    }
    assert rows[1]["outcome"] == "native_waited_behind_borrowed"
    assert rows[1]["borrowed_ahead"] == 1
    assert rows[1]["owner_model_id"] == ""


@writer_db
def test_a_row_about_a_request_keeps_its_id_and_any_other_row_stores_null() -> None:
    log = new_log()
    log.record(kind="dispatch", outcome="lent", request_id="req-7")
    log.record(kind="dispatch", outcome="lease_updated")
    log.record(kind="helper", outcome="borrowed_returned", request_id=None)
    assert flush(log) == 3
    assert stored("outcome", "request_id") == [
        ("lent", "req-7"),
        ("lease_updated", None),
        ("borrowed_returned", None),
    ]
    # The query side leaves the empty ID out, as it does every other empty field.
    rows = decisions_query(lane=None, outcome=None, kind=None, since_ms=None, limit=10)
    by_outcome = {r["outcome"]: r for r in rows}
    assert by_outcome["lent"]["request_id"] == "req-7"
    assert "request_id" not in by_outcome["lease_updated"]


@writer_db
def test_a_malformed_row_is_dropped_without_losing_the_rest() -> None:
    log = new_log()
    log.record(kind="plan", outcome="granted")
    log.record(kind="plan", slots="many")
    log.record(kind="plan", outcome="skipped")
    assert flush(log) == 2
    assert log.dropped == 1
    assert stored("outcome") == [("granted",), ("skipped",)]


@writer_db
def test_near_miss_values_are_stored_as_the_column_type() -> None:
    log = new_log()
    log.record(kind="plan", recorded_at=7.0, slots="3", keep_ms=2, reason=None, wait_ms=None)
    assert flush(log) == 1
    assert stored("recorded_at", "slots", "keep_ms", "reason", "wait_ms") == [(7, 3, 2.0, "", 0)]
    assert log.dropped == 0


def test_flushing_an_empty_buffer_writes_nothing() -> None:
    assert flush(new_log()) == 0


@writer_db
def test_a_failed_flush_keeps_the_rows_in_order_for_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = new_log()
    for i in range(3):
        log.record(kind="plan", recorded_at=i)

    def broken(batch: Any) -> tuple[int, int]:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(decisions_module, "_write", broken)
    assert flush(log) == 0
    log.record(kind="plan", recorded_at=3)
    assert [r["recorded_at"] for r in buffered(log)] == [0, 1, 2, 3]

    monkeypatch.undo()
    assert flush(log) == 4
    assert stored("recorded_at") == [(0,), (1,), (2,), (3,)]
    assert log.dropped == 0


def test_a_failed_flush_reapplies_the_bound_to_rows_that_arrived_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = new_log()
    for i in range(MAX_BUFFERED_ROWS):
        log.record(kind="plan", recorded_at=i)

    def failing_thread(func: Any) -> Any:
        async def run(batch: Any) -> Any:
            # Three decisions are recorded while the write is out on its thread.
            for j in range(3):
                log.record(kind="plan", recorded_at=MAX_BUFFERED_ROWS + j)
            raise RuntimeError("disk full")

        return run

    monkeypatch.setattr(decisions_module, "database_sync_to_async", failing_thread)
    assert flush(log) == 0
    assert log.pending() == MAX_BUFFERED_ROWS
    assert log.dropped == 3
    times = [r["recorded_at"] for r in buffered(log)]
    assert times[0] == 3
    assert times[-1] == MAX_BUFFERED_ROWS + 2


@writer_db
def test_a_flush_returns_only_once_a_flush_already_writing_has_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The decision routes flush and then read: rows a periodic flush took a moment earlier
    # must be committed by the time their flush returns.
    real_write = decisions_module._write
    writing = threading.Event()
    release = threading.Event()

    def slow_write(batch: Any) -> tuple[int, int]:
        writing.set()
        assert release.wait(10)
        written: tuple[int, int] = real_write(batch)
        return written

    monkeypatch.setattr(decisions_module, "_write", slow_write)
    log = new_log()
    log.record(kind="plan", recorded_at=7)

    assert not second_flush_returned_early(log.flush, writing, release)
    assert stored("recorded_at") == [(7,)]


@writer_db
async def test_flushing_ten_thousand_rows_leaves_the_event_loop_free() -> None:
    log = new_log()
    for i in range(MAX_BUFFERED_ROWS):
        log.record(kind="dispatch", outcome="lent", owner_model_id="chat", slots=2, wait_ms=i)
    beats = 0
    done = asyncio.Event()

    async def heartbeat() -> None:
        nonlocal beats
        while not done.is_set():
            beats += 1
            await asyncio.sleep(0)

    beating = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)
    start_beats = beats
    written = await log.flush()
    done.set()
    await beating
    assert written == MAX_BUFFERED_ROWS
    # Had the write run on the loop, the heartbeat could not have run during it.
    assert beats - start_beats > 1
    count = await database_sync_to_async(OffloadDecision.objects.count)()
    assert count == MAX_BUFFERED_ROWS


@writer_db
async def test_the_flush_loop_writes_rows_and_stop_writes_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decisions_module, "FLUSH_INTERVAL_SECS", 0.01)
    log = new_log()
    log.start()
    log.record(kind="plan", outcome="granted")
    count = database_sync_to_async(OffloadDecision.objects.count)
    for _ in range(500):
        if await count() == 1:
            break
        await asyncio.sleep(0.01)
    assert await count() == 1
    log.record(kind="plan", outcome="skipped")
    await log.stop()
    assert await count() == 2
    assert log.pending() == 0


# -- query -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_query_returns_newest_first_with_zero_fields_left_out() -> None:
    make_rows(
        {"recorded_at": 100, "kind": "plan", "lane": "image", "outcome": "granted", "slots": 2},
        {"recorded_at": 300, "kind": "dispatch", "lane": "text", "outcome": "lent"},
        {"recorded_at": 300, "kind": "helper", "lane": "text", "outcome": "borrowed_returned"},
    )
    rows = decisions_query(lane=None, outcome=None, kind=None, since_ms=None, limit=10)
    assert [r["kind"] for r in rows] == ["helper", "dispatch", "plan"]
    first_id = rows[2]["id"]
    assert rows[2] == {
        "id": first_id,
        "recorded_at": 100,
        "node_id": NODE_ID,
        "kind": "plan",
        "lane": "image",
        "outcome": "granted",
        "slots": 2,
        "router_version": VERSION,
    }


@pytest.mark.django_db
def test_the_query_always_shows_the_identity_fields_even_when_empty() -> None:
    OffloadDecisionFactory(recorded_at=5)
    (row,) = decisions_query(lane=None, outcome=None, kind=None, since_ms=None, limit=10)
    assert set(row) == {"id", "recorded_at", "node_id", "kind", "router_version"}


@pytest.mark.django_db
def test_the_query_filters_by_lane_outcome_kind_time_and_limit() -> None:
    make_rows(
        {"recorded_at": 100, "kind": "plan", "lane": "image", "outcome": "granted"},
        {"recorded_at": 200, "kind": "plan", "lane": "text", "outcome": "skipped"},
        {"recorded_at": 300, "kind": "dispatch", "lane": "text", "outcome": "lent"},
        {"recorded_at": 400, "kind": "plan", "lane": "text", "outcome": "granted"},
    )

    def times(**filters: Any) -> list[int]:
        query: dict[str, Any] = {
            "lane": None,
            "outcome": None,
            "kind": None,
            "since_ms": None,
            "limit": 10,
        }
        query.update(filters)
        return [r["recorded_at"] for r in decisions_query(**query)]

    assert times(lane="text") == [400, 300, 200]
    assert times(outcome="granted") == [400, 100]
    assert times(kind="plan", lane="text") == [400, 200]
    assert times(since_ms=300) == [400, 300]
    assert times(limit=2) == [400, 300]
    assert times(limit=0) == []


@pytest.mark.django_db
def test_the_query_can_keep_to_one_writer_node() -> None:
    make_rows({"recorded_at": 1, "kind": "plan"})
    OffloadDecisionFactory(recorded_at=2, kind="plan", node_id="node-b")
    rows = decisions_query(
        lane=None, outcome=None, kind=None, since_ms=None, limit=10, node_id="node-b"
    )
    assert [r["node_id"] for r in rows] == ["node-b"]


def test_filters_default_when_the_query_string_is_empty() -> None:
    assert parse_decision_filters({}, default_limit=500, max_limit=5000) == {
        "lane": None,
        "outcome": None,
        "kind": None,
        "since_ms": None,
        "until_ms": None,
        "model_id": None,
        "request_id": None,
        "limit": 500,
    }


def test_filters_pass_the_given_values_through() -> None:
    query = {
        "lane": "text",
        "outcome": "lent",
        "kind": "dispatch",
        "since_ms": "0",
        "until_ms": "9",
        "model_id": "qwen",
        "request_id": "req-1",
        "limit": "7",
    }
    assert parse_decision_filters(query, default_limit=500, max_limit=5000) == {
        "lane": "text",
        "outcome": "lent",
        "kind": "dispatch",
        "since_ms": 0,
        "until_ms": 9,
        "model_id": "qwen",
        "request_id": "req-1",
        "limit": 7,
    }


def test_a_limit_above_the_maximum_is_capped() -> None:
    filters = parse_decision_filters({"limit": "99999"}, default_limit=500, max_limit=5000)
    assert filters["limit"] == 5000


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "1.5", "+3", "٣"])
def test_a_bad_limit_is_a_400_naming_limit(raw: str) -> None:
    with pytest.raises(RouterError) as caught:
        parse_decision_filters({"limit": raw}, default_limit=500, max_limit=5000)
    assert (caught.value.status, caught.value.param) == (400, "limit")


@pytest.mark.parametrize("raw", ["-1", "soon", "1e3"])
def test_a_bad_since_ms_is_a_400_naming_since_ms(raw: str) -> None:
    with pytest.raises(RouterError) as caught:
        parse_decision_filters({"since_ms": raw}, default_limit=500, max_limit=5000)
    assert (caught.value.status, caught.value.param) == (400, "since_ms")


def test_an_unknown_lane_is_a_400_naming_lane() -> None:
    with pytest.raises(RouterError) as caught:
        parse_decision_filters({"lane": "audio"}, default_limit=500, max_limit=5000)
    assert (caught.value.status, caught.value.param) == (400, "lane")


# -- merging ---------------------------------------------------------------------------------


def test_rows_from_several_nodes_merge_newest_first_with_stable_ties() -> None:
    per_node = {
        "node-b": [
            {"id": 9, "node_id": "node-b", "recorded_at": 300},
            {"id": 8, "node_id": "node-b", "recorded_at": 100},
        ],
        "node-a": [
            {"id": 5, "node_id": "node-a", "recorded_at": 300},
            {"id": 4, "node_id": "node-a", "recorded_at": 300},
            {"id": 3, "node_id": "node-a", "recorded_at": 200},
        ],
    }
    merged = merge_node_records(per_node, limit=10)
    assert [(r["node_id"], r["id"]) for r in merged] == [
        ("node-a", 5),
        ("node-a", 4),
        ("node-b", 9),
        ("node-a", 3),
        ("node-b", 8),
    ]


def test_merging_truncates_to_the_limit() -> None:
    per_node = {"n": [{"id": i, "node_id": "n", "recorded_at": i} for i in range(10)]}
    assert [r["id"] for r in merge_node_records(per_node, limit=3)] == [9, 8, 7]
    assert merge_node_records(per_node, limit=0) == []


def test_merging_orders_rows_even_when_a_node_sent_them_unsorted() -> None:
    per_node = {"n": [{"id": 1, "recorded_at": 1}, {"id": 2, "recorded_at": 2}]}
    assert [r["id"] for r in merge_node_records(per_node, limit=5)] == [2, 1]


# -- pruning ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_pruning_deletes_only_rows_older_than_the_retention() -> None:
    make_rows({"recorded_at": 999}, {"recorded_at": 1000}, {"recorded_at": 5000})
    assert decisions_prune(now_ms=6000, retention_ms=5000) == 1
    assert stored("recorded_at") == [(1000,), (5000,)]
    assert decisions_prune(now_ms=6000, retention_ms=5000) == 0


@pytest.mark.django_db
def test_pruning_works_through_more_rows_than_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "PRUNE_BATCH_ROWS", 3)
    make_rows(*({"recorded_at": i} for i in range(10)), {"recorded_at": 50})
    assert decisions_prune(now_ms=100, retention_ms=60) == 10
    assert stored("recorded_at") == [(50,)]


@pytest.mark.django_db
def test_the_prune_task_uses_the_stored_retention() -> None:
    hour_ms = 3_600_000
    settings_save(values={"offload_decisions_retention": "1h"}, now_ms=T0_MS)
    make_rows({"recorded_at": T0_MS - 2 * hour_ms}, {"recorded_at": T0_MS - hour_ms // 2})
    with time_machine.travel(T0_MS / 1000, tick=False):
        assert prune_decisions() == 1
    assert stored("recorded_at") == [(T0_MS - hour_ms // 2,)]


@pytest.mark.django_db
def test_the_prune_task_keeps_thirty_days_by_default() -> None:
    day_ms = 86_400_000
    make_rows({"recorded_at": T0_MS - 31 * day_ms}, {"recorded_at": T0_MS - 29 * day_ms})
    with time_machine.travel(T0_MS / 1000, tick=False):
        assert prune_decisions() == 1
    assert stored("recorded_at") == [(T0_MS - 29 * day_ms,)]


@writer_db
def test_a_slave_prunes_in_its_router_process_with_the_retention_its_master_pushed(
    settings: Any,
) -> None:
    from types import SimpleNamespace

    from lending.ticker import PRUNE_EVERY_SECS, LendingTicker

    hour_ms = 3_600_000
    # The slave's own layers say thirty days; the master pushed one hour.
    make_rows({"recorded_at": T0_MS - 2 * hour_ms}, {"recorded_at": T0_MS - hour_ms // 2})
    lending = SimpleNamespace(
        settings=SimpleNamespace(refresh_interval_secs=5.0, decisions_retention_secs=3600.0),
        listeners=[],
        settings_source="local",
    )
    ticker = LendingTicker(SimpleNamespace(role="slave", lending=lending))
    # Until the master's settings arrive the slave does not know the retention: no prune.
    assert async_to_sync(ticker.prune_if_due)(100.0, T0_MS) == 0
    lending.settings_source = "master"
    assert async_to_sync(ticker.prune_if_due)(100.0, T0_MS) == 1
    assert stored("recorded_at") == [(T0_MS - hour_ms // 2,)]
    # Not again until the prune period has passed.
    assert async_to_sync(ticker.prune_if_due)(100.0 + PRUNE_EVERY_SECS - 1, T0_MS + hour_ms) == 0
    assert async_to_sync(ticker.prune_if_due)(100.0 + PRUNE_EVERY_SECS, T0_MS + hour_ms) == 1
    # The django-q2 task leaves a slave's log to the router process.
    settings.ROUTER = settings.ROUTER.model_copy(
        update={"cluster": settings.ROUTER.cluster.model_copy(update={"role": "slave"})}
    )
    make_rows({"recorded_at": T0_MS - 90 * 86_400_000})
    assert prune_decisions() == 0


# -- folding ---------------------------------------------------------------------------------


def fold_all(**filters: Any) -> dict[str, Any]:
    query: dict[str, Any] = {"lane": None, "outcome": None, "kind": None, "since_ms": None}
    query.update(filters)
    return decisions_fold(**query)


def plan(at: int, **fields: Any) -> dict[str, Any]:
    row = {
        "recorded_at": at,
        "kind": "plan",
        "lane": "text",
        "owner_node_id": "o",
        "owner_model_id": "big",
        "helper_node_id": "h",
        "helper_model_id": "fast",
        "outcome": "skipped",
        "reason": "cost_rejected",
    }
    row.update(fields)
    return row


@pytest.mark.django_db
def test_one_decision_folds_into_one_line_whatever_its_numbers_and_triggers() -> None:
    make_rows(
        plan(100, trigger="enqueued", keep_ms=800.0, pending_count=3),
        plan(250, trigger="completed", keep_ms=1200.5, pending_count=5),
        plan(300, trigger="enqueued", keep_ms=900.0, pending_count=4),
        # Another outcome, another reason, another helper model: three more lines.
        plan(200, trigger="enqueued", outcome="granted", reason="", slots=2),
        plan(210, trigger="enqueued", reason="helper_claimed"),
        plan(220, trigger="enqueued", helper_model_id="other"),
    )
    doc = fold_all()
    assert doc["rows"] == 6 and doc["truncated"] is False
    folds = doc["folds"]
    assert len(folds) == 4
    first = folds[0]
    assert (first["outcome"], first["reason"], first["helper_model_id"]) == (
        "skipped",
        "cost_rejected",
        "fast",
    )
    assert (first["count"], first["first_at"], first["last_at"]) == (3, 100, 300)
    assert first["triggers"] == {"enqueued": 2, "completed": 1}
    assert first["measures"]["keep_ms"] == [800.0, 1200.5]
    assert first["measures"]["pending_count"] == [3, 5]
    assert "slots" not in first["measures"]  # 0 throughout says nothing
    assert first["router_versions"] == [VERSION]
    # Newest last first: the lines that ended at 220, 210 and 200 follow.
    assert [f["last_at"] for f in folds] == [300, 220, 210, 200]
    assert folds[3]["measures"] == {"slots": [2, 2]}


@pytest.mark.django_db
def test_folds_of_two_nodes_stay_apart_and_merge_into_one_page() -> None:
    make_rows(plan(100), plan(300))
    OffloadDecision.objects.bulk_create(
        [OffloadDecisionFactory.build(**{**plan(200), "node_id": "node-b"})]
    )
    here = decisions_fold(lane=None, outcome=None, kind=None, since_ms=None, node_id=NODE_ID)
    there = decisions_fold(lane=None, outcome=None, kind=None, since_ms=None, node_id="node-b")
    assert [f["count"] for f in here["folds"]] == [2]
    page = merge_folds({NODE_ID: here, "node-b": there}, offset=0, limit=1)
    assert (page["total_folds"], page["total_rows"], page["offset"]) == (2, 3, 0)
    assert [f["node_id"] for f in page["folds"]] == [NODE_ID]
    page = merge_folds({NODE_ID: here, "node-b": there}, offset=1, limit=1)
    assert [f["node_id"] for f in page["folds"]] == ["node-b"]
    assert merge_folds({NODE_ID: here}, offset=5, limit=10)["folds"] == []


@pytest.mark.django_db
def test_folding_filters_by_time_range_and_model_on_either_side() -> None:
    make_rows(
        plan(100),
        plan(200, owner_model_id="small"),
        plan(300, helper_model_id="small", reason="outranked"),
        plan(400, reason="helper_claimed"),
    )
    spans = [(f["first_at"], f["last_at"]) for f in fold_all(since_ms=150, until_ms=350)["folds"]]
    assert spans == [(300, 300), (200, 200)]
    assert [f["last_at"] for f in fold_all(until_ms=100)["folds"]] == [100]
    assert [f["last_at"] for f in fold_all(model_id="small")["folds"]] == [300, 200]
    assert fold_all(model_id="nosuch")["folds"] == []


@pytest.mark.django_db
def test_a_fold_carries_a_sample_of_its_request_ids_and_one_id_filters_the_log() -> None:
    make_rows(
        plan(100, kind="dispatch", outcome="lent", reason="", request_id="req-a"),
        plan(200, kind="dispatch", outcome="lent", reason="", request_id="req-b"),
        plan(300, kind="dispatch", outcome="lent", reason="", request_id="req-c"),
        plan(400),  # a plan row: about no request in particular
    )
    lent = next(f for f in fold_all()["folds"] if f["outcome"] == "lent")
    assert lent["count"] == 3 and lent["request_ids"] == ["req-a", "req-c"]
    plan_fold = next(f for f in fold_all()["folds"] if f["kind"] == "plan")
    assert plan_fold["request_ids"] == []
    (one,) = fold_all(request_id="req-b")["folds"]
    assert (one["count"], one["request_ids"]) == (1, ["req-b"])
    assert fold_all(request_id="req-z")["folds"] == []


@pytest.mark.django_db
def test_a_node_with_more_decisions_than_it_answers_says_it_cut_them() -> None:
    make_rows(*(plan(100 + i, reason=f"r{i}") for i in range(5)))
    doc = decisions_fold(lane=None, outcome=None, kind=None, since_ms=None, max_folds=3)
    assert doc["truncated"] is True
    assert [f["reason"] for f in doc["folds"]] == ["r4", "r3", "r2"]
    assert doc["rows"] == 3  # the rows of the folds it answers
    assert merge_folds({NODE_ID: doc}, offset=0, limit=10)["truncated_nodes"] == [NODE_ID]
    exact = decisions_fold(lane=None, outcome=None, kind=None, since_ms=None, max_folds=5)
    assert exact["truncated"] is False and len(exact["folds"]) == 5


@pytest.mark.django_db
@pytest.mark.parametrize(("folds", "truncated"), [(4, False), (5, True)])
def test_a_fold_cap_is_reached_exactly_at_its_limit(folds: int, truncated: bool) -> None:
    make_rows(*(plan(100 + i, reason=f"r{i}") for i in range(folds)))

    doc = decisions_fold(lane=None, outcome=None, kind=None, since_ms=None, max_folds=4)

    assert doc["truncated"] is truncated
    assert [f["reason"] for f in doc["folds"]] == [f"r{i}" for i in range(folds - 1, -1, -1)][:4]


@pytest.mark.django_db
@pytest.mark.parametrize(("triggers", "truncated"), [(4, False), (5, True)])
def test_a_node_reads_at_most_four_trigger_groups_per_fold_it_answers(
    triggers: int, truncated: bool
) -> None:
    # One decision under several triggers is one fold, but the database groups it finer: the
    # read is capped at four such groups per fold answered.
    make_rows(*(plan(100 + i, trigger=f"t{i}") for i in range(triggers)))

    doc = decisions_fold(lane=None, outcome=None, kind=None, since_ms=None, max_folds=1)

    assert doc["truncated"] is truncated
    (fold,) = doc["folds"]
    assert fold["count"] == 4
    assert sorted(fold["triggers"]) == [f"t{i}" for i in range(triggers - 4, triggers)]


@pytest.mark.django_db
@pytest.mark.parametrize(("folds", "truncated"), [(2000, False), (2001, True)])
def test_by_default_a_node_answers_at_most_two_thousand_folds(folds: int, truncated: bool) -> None:
    make_rows(*(plan(100 + i, reason=f"r{i}") for i in range(folds)))

    doc = decisions_fold(lane=None, outcome=None, kind=None, since_ms=None)

    assert doc["truncated"] is truncated
    assert len(doc["folds"]) == 2000
    assert doc["folds"][0]["reason"] == f"r{folds - 1}"


def test_until_before_since_is_a_400_naming_until_ms() -> None:
    with pytest.raises(RouterError) as caught:
        parse_decision_filters({"since_ms": "10", "until_ms": "9"}, default_limit=1, max_limit=1)
    assert (caught.value.status, caught.value.param) == (400, "until_ms")
    same = parse_decision_filters(
        {"since_ms": "10", "until_ms": "10"}, default_limit=1, max_limit=1
    )
    assert same["until_ms"] == 10


def _recorded_literals(pattern: str) -> set[str]:
    import pathlib
    import re

    root = pathlib.Path(decisions_module.__file__).parent
    found: set[str] = set()
    for path in [*root.glob("*.py"), *(root.parent / "proxy").glob("*.py")]:
        found.update(re.findall(pattern, path.read_text(encoding="utf-8"), flags=re.S))
    return found


def test_every_outcome_and_reason_the_code_records_is_explained() -> None:
    outcomes = _recorded_literals(r'outcome="([a-z_]+)"') | _recorded_literals(
        r'OUTCOME_[A-Z]+ = "([a-z_]+)"'
    )
    reasons = (
        _recorded_literals(r'REASON_[A-Z_]+ = "([a-z_]+)"')
        | _recorded_literals(r'REFILLED = "([a-z_]+)"')
        | _recorded_literals(r'_refuse\([^)]*?"([a-z_]+)"')
        | _recorded_literals(r'_helper_row\([^)]*?"([a-z_]+)"')
        | _recorded_literals(r'outcome="[a-z_]+",\s*reason="([a-z_]+)"')
        | _recorded_literals(r'reason="([a-z_]+)",\s*outcome=')
    )
    # The scan finds what it should: a sample of each way a value is written.
    assert {"lent", "granted", "relay_refused", "borrowed_returned"} <= outcomes
    assert {"cost_rejected", "refilled", "helper_stalled", "own_work_arrived"} <= reasons
    assert outcomes <= set(OUTCOME_TEXT), outcomes - set(OUTCOME_TEXT)
    assert reasons <= set(REASON_TEXT), reasons - set(REASON_TEXT)
    assert set(DECISION_OUTCOMES) == set(OUTCOME_TEXT)


@pytest.mark.django_db
def test_a_fold_samples_the_keys_its_requests_came_with_without_splitting_on_them() -> None:
    make_rows(
        plan(100, kind="dispatch", outcome="lent", reason="", request_id="r1", key_name="team-a"),
        plan(200, kind="dispatch", outcome="lent", reason="", request_id="r2", key_name="team-b"),
        plan(300, kind="dispatch", outcome="lent", reason="", request_id="r3"),
    )
    (lent,) = [f for f in fold_all()["folds"] if f["outcome"] == "lent"]
    assert (lent["count"], lent["key_names"]) == (3, ["team-a", "team-b"])
