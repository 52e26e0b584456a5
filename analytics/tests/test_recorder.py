"""The buffered analytics recorder and the retention prune, against the real test database."""

from __future__ import annotations

import os
import random
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections

from analytics import recorder as recorder_module
from analytics.models import LoadRecord, RequestRecord
from analytics.recorder import (
    LoadEvent,
    Recorder,
    RequestSample,
    _timestamp_adapter,
    flush_delay,
)
from analytics.services import analytics_prune
from analytics.tests.factories import LoadRecordFactory, RequestRecordFactory
from tests.flushing import second_flush_returned_early

NODE_ID = "node-a"
# A fixed instant with whole microseconds, so a round trip through the database is exact.
T0 = 1_750_000_000.25

# The recorder writes from a worker thread (database_sync_to_async), so rows must really be
# committed for it and for the test to see each other.
recorder_db = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _writer_disconnected() -> Iterator[None]:
    # The flushes' thread keeps its connection open between flushes; left open after the last
    # test, it would keep PostgreSQL from dropping the test database.
    yield
    async_to_sync(recorder_module._close_kept)()


def sample(model_id: str = "chat", **overrides: Any) -> RequestSample:
    fields: dict[str, Any] = {
        "node_id": NODE_ID,
        "model_id": model_id,
        "config_filename": f"{model_id}.kcpps",
        "lane": "text",
        "path": "/v1/chat/completions",
        "status": 200,
        "success": True,
        "stream": False,
        "prompt_bytes": 120,
        "prompt_tokens": 30,
        "output_tokens": 16,
        "image_width": 0,
        "image_height": 0,
        "image_steps": 0,
        "image_count": 0,
        "duration_ms": 412.5,
        "started_at": T0,
        "finished_at": T0 + 0.5,
    }
    fields.update(overrides)
    return RequestSample(**fields)


def load_event(model_id: str = "chat", **overrides: Any) -> LoadEvent:
    fields: dict[str, Any] = {
        "lane": "text",
        "model_id": model_id,
        "config_filename": f"{model_id}.kcpps",
        "duration_ms": 812.0,
        "success": True,
        "reason": "own",
        "error": "",
        "finished_at": T0 + 2,
    }
    fields.update(overrides)
    return LoadEvent(**fields)


def flush(rec: Recorder) -> int:
    written: int = async_to_sync(rec.flush)()
    return written


def without_id(row: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key != "id"}


def request_models() -> list[str]:
    return list(RequestRecord.objects.order_by("id").values_list("model_id", flat=True))


def load_models() -> list[str]:
    return list(LoadRecord.objects.order_by("id").values_list("model_id", flat=True))


# -- flushing ---------------------------------------------------------------------------


@recorder_db
def test_a_flush_writes_each_buffered_sample_as_an_exact_row() -> None:
    rec = Recorder(node_id=NODE_ID)
    rec.add_request(sample(request_id="3f2a-client-trace", cached_tokens=12, key_name="team-søren"))
    rec.add_request(
        sample(
            "image-sd",
            lane="image",
            path="/v1/images/generations",
            status=502,
            success=False,
            stream=True,
            prompt_tokens=0,
            output_tokens=0,
            image_width=512,
            image_height=768,
            image_steps=20,
            image_count=2,
            borrowed=True,
        )
    )
    rec.add_load(load_event(success=False, reason="explicit", error="exited with code 2"))
    assert rec.pending() == 3

    assert flush(rec) == 3
    assert rec.pending() == 0

    rows = [without_id(row) for row in RequestRecord.objects.order_by("id").values()]
    assert rows == [
        {
            "node_id": NODE_ID,
            "model_id": "chat",
            "config_filename": "chat.kcpps",
            "lane": "text",
            "path": "/v1/chat/completions",
            "status": 200,
            "success": True,
            "borrowed": False,
            "stream": False,
            "prompt_bytes": 120,
            "prompt_tokens": 30,
            "cached_tokens": 12,
            "output_tokens": 16,
            "image_width": 0,
            "image_height": 0,
            "image_steps": 0,
            "image_count": 0,
            "duration_ms": 412.5,
            "started_at": datetime.fromtimestamp(T0, tz=UTC),
            "finished_at": datetime.fromtimestamp(T0 + 0.5, tz=UTC),
            "request_id": "3f2a-client-trace",
            "key_name": "team-søren",
        },
        {
            "node_id": NODE_ID,
            "model_id": "image-sd",
            "config_filename": "image-sd.kcpps",
            "lane": "image",
            "path": "/v1/images/generations",
            "status": 502,
            "success": False,
            "borrowed": True,
            "stream": True,
            "prompt_bytes": 120,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "output_tokens": 0,
            "image_width": 512,
            "image_height": 768,
            "image_steps": 20,
            "image_count": 2,
            "duration_ms": 412.5,
            "started_at": datetime.fromtimestamp(T0, tz=UTC),
            "finished_at": datetime.fromtimestamp(T0 + 0.5, tz=UTC),
            "request_id": None,
            "key_name": None,
        },
    ]
    [load] = [without_id(row) for row in LoadRecord.objects.values()]
    assert load == {
        "node_id": NODE_ID,
        "model_id": "chat",
        "config_filename": "chat.kcpps",
        "lane": "text",
        "reason": "explicit",
        "success": False,
        "error": "exited with code 2",
        "duration_ms": 812.0,
        "finished_at": datetime.fromtimestamp(T0 + 2, tz=UTC),
    }


@recorder_db
def test_a_flush_with_nothing_buffered_writes_nothing() -> None:
    rec = Recorder(node_id=NODE_ID)
    assert flush(rec) == 0
    assert RequestRecord.objects.count() == 0 and LoadRecord.objects.count() == 0


@recorder_db
def test_flushes_keep_one_connection_and_a_failed_write_or_stop_closes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = Recorder(node_id=NODE_ID)
    rec.add_request(sample("a"))
    assert flush(rec) == 1
    kept = writer_connection()
    assert kept is not None
    rec.add_request(sample("b"))
    assert flush(rec) == 1
    assert writer_connection() is kept

    # A kept connection that fails its check is replaced before the write.
    monkeypatch.setattr(type(connections["default"]), "is_usable", lambda _: False)
    rec.add_request(sample("c"))
    assert flush(rec) == 1
    assert writer_connection() is not None and writer_connection() is not kept
    monkeypatch.undo()

    def broken(*args: Any) -> None:
        raise RuntimeError("database is down")

    monkeypatch.setattr(recorder_module, "_write", broken)
    rec.add_request(sample("d"))
    assert flush(rec) == 0
    assert writer_connection() is None
    monkeypatch.undo()

    assert flush(rec) == 1
    assert writer_connection() is not None
    async_to_sync(rec.stop)()
    assert writer_connection() is None
    assert request_models() == ["a", "b", "c", "d"]


def writer_connection() -> Any:
    """The database connection the flushes' thread holds open, if any."""
    return recorder_module._WRITER.submit(lambda: connection.connection).result(10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a nice value per thread")
def test_the_writer_runs_ten_steps_below_the_router_s_cpu_priority() -> None:
    def nice_of_this_thread() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    writer = recorder_module._WRITER.submit(nice_of_this_thread).result(10)
    assert writer == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    # The loop's own thread, and so the request path, keeps the process's priority.
    assert nice_of_this_thread() == os.getpriority(os.PRIO_PROCESS, 0)


@recorder_db
def test_a_failed_flush_keeps_the_rows_for_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = recorder_module._write
    calls: list[int] = []

    def fail_once(*args: Any) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("database is down")
        real_write(*args)

    monkeypatch.setattr(recorder_module, "_write", fail_once)
    rec = Recorder(node_id=NODE_ID)
    for name in ("a", "b"):
        rec.add_request(sample(name))
    rec.add_load(load_event("a"))

    assert flush(rec) == 0
    assert rec.pending() == 3
    assert RequestRecord.objects.count() == 0 and LoadRecord.objects.count() == 0

    assert flush(rec) == 3
    assert rec.pending() == 0 and rec.dropped == 0
    assert request_models() == ["a", "b"]
    assert load_models() == ["a"]


@recorder_db
def test_rows_that_arrive_during_a_failed_flush_queue_behind_the_kept_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_write = recorder_module._write
    rec = Recorder(node_id=NODE_ID)
    failed = False

    def fail_once(*args: Any) -> None:
        nonlocal failed
        if not failed:
            failed = True
            # A request finishing while the write is in flight lands in the fresh buffer.
            rec.add_request(sample("late"))
            raise RuntimeError("database is down")
        real_write(*args)

    monkeypatch.setattr(recorder_module, "_write", fail_once)
    rec.add_request(sample("early"))

    assert flush(rec) == 0
    assert rec.pending() == 2
    assert flush(rec) == 2
    assert request_models() == ["early", "late"]


@recorder_db
def test_a_flush_returns_only_once_a_flush_already_writing_has_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The analytics view flushes and then reads: a periodic flush that took the rows a moment
    # earlier must have committed them by the time the view's flush returns.
    real_write = recorder_module._write
    writing = threading.Event()
    release = threading.Event()

    def slow_write(*args: Any) -> None:
        writing.set()
        assert release.wait(10)
        real_write(*args)

    monkeypatch.setattr(recorder_module, "_write", slow_write)
    rec = Recorder(node_id=NODE_ID)
    rec.add_request(sample("taken"))

    assert not second_flush_returned_early(rec.flush, writing, release)
    assert request_models() == ["taken"]


@recorder_db
def test_a_full_buffer_drops_its_oldest_rows_and_counts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recorder_module, "MAX_BUFFERED_ROWS", 3)
    rec = Recorder(node_id=NODE_ID)
    for index in range(5):
        rec.add_request(sample(f"r{index}"))
    for index in range(4):
        rec.add_load(load_event(f"l{index}"))

    assert rec.dropped == 3
    assert rec.pending() == 6
    assert flush(rec) == 6
    assert request_models() == ["r2", "r3", "r4"]
    assert load_models() == ["l1", "l2", "l3"]


@recorder_db
def test_every_row_is_written_buffered_or_counted_as_dropped_across_failed_flushes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recorder_module, "MAX_BUFFERED_ROWS", 3)
    real_write = recorder_module._write
    rec = Recorder(node_id=NODE_ID)
    added = 0
    failures = 2

    def add(name: str) -> None:
        nonlocal added
        rec.add_request(sample(name))
        added += 1

    def failing_write(*args: Any) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            if failures == 1:
                add("during-outage")
            raise RuntimeError("database is down")
        real_write(*args)

    monkeypatch.setattr(recorder_module, "_write", failing_write)
    for index in range(3):
        add(f"r{index}")
    flush(rec)
    assert rec.pending() <= 3
    flush(rec)
    written = flush(rec)
    assert added == written + rec.pending() + rec.dropped


@pytest.mark.parametrize(
    "seconds",
    [
        T0,
        1_750_000_000.0,
        1_750_000_000.0000004,
        1_750_000_000.9999996,
        1_750_000_000.9999995,
        1_750_000_000.0000005,
        1_750_000_000.0000015,
        0.5,
    ],
)
def test_a_timestamp_is_stored_as_the_orm_would_store_it(seconds: float) -> None:
    # Whole seconds (no fraction written), and fractions that round at the microsecond (half
    # to even, a rounded-up million carried into the second).
    expected = connection.ops.adapt_datetimefield_value(datetime.fromtimestamp(seconds, tz=UTC))
    assert _timestamp_adapter(connection)(seconds) == expected
    # Asked again after another second, so the second's cached text is not the answer.
    adapter = _timestamp_adapter(connection)
    adapter(seconds - 1.0)
    assert adapter(seconds) == expected


@dataclass
class _Connection:
    timezone: ZoneInfo
    vendor: str = "sqlite"
    ops: Any = None


def test_timestamps_in_a_zone_with_summer_time_are_the_datetime_text_of_each() -> None:
    # A flush's timestamps in the order a node writes them, across the night Berlin's clocks
    # go back (the same wall-clock second twice) and over many whole and rounded fractions.
    zone = ZoneInfo("Europe/Berlin")
    adapter = _timestamp_adapter(_Connection(zone, ops=connection.ops))
    rng = random.Random(7)
    start = datetime(2026, 10, 25, 0, 59, 58, tzinfo=UTC).timestamp()
    seconds = start
    for _ in range(20_000):
        seconds += rng.choice([0.0, 0.0000005, 0.0004, 0.25, 1.0, rng.random()])
        expected = str(datetime.fromtimestamp(seconds, tz=zone).replace(tzinfo=None))
        assert adapter(seconds) == expected, seconds


def test_a_quiet_node_flushes_a_row_50_ms_after_it_arrives() -> None:
    assert flush_delay(float("inf")) == pytest.approx(0.05)
    assert flush_delay(0.25) == pytest.approx(0.05)
    assert flush_delay(0.2) == pytest.approx(0.05)


def test_under_load_flushes_start_a_quarter_second_apart() -> None:
    # A row that arrives just after a flush began waits for the rest of the interval, so a
    # steady stream of requests is four transactions a second, not twenty.
    assert flush_delay(0.0) == pytest.approx(0.25)
    assert flush_delay(0.1) == pytest.approx(0.15)
    assert flush_delay(0.19) == pytest.approx(0.06)


@recorder_db
def test_stop_flushes_what_is_still_buffered() -> None:
    rec = Recorder(node_id=NODE_ID)

    async def run() -> None:
        rec.start()
        rec.add_request(sample("last"))
        await rec.stop()

    async_to_sync(run)()
    assert rec.pending() == 0
    assert request_models() == ["last"]


@recorder_db
def test_a_disabled_recorder_records_nothing() -> None:
    rec = Recorder(node_id=NODE_ID, enabled=False)
    rec.add_request(sample())
    rec.add_load(load_event())
    assert rec.pending() == 0 and rec.dropped == 0
    assert flush(rec) == 0
    assert RequestRecord.objects.count() == 0 and LoadRecord.objects.count() == 0


# -- retention --------------------------------------------------------------------------


@pytest.mark.django_db
def test_prune_deletes_only_rows_older_than_the_retention() -> None:
    now = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
    retention = timedelta(hours=1)
    ages = {
        "old": retention + timedelta(minutes=30),
        "just-old": retention + timedelta(microseconds=1),
        "at-cutoff": retention,
        "fresh": timedelta(minutes=5),
    }
    for name, age in ages.items():
        finished = now - age
        RequestRecordFactory(
            node_id=NODE_ID,
            model_id=name,
            lane="text",
            duration_ms=1.0,
            started_at=finished,
            finished_at=finished,
        )
        LoadRecordFactory(
            node_id=NODE_ID,
            model_id=name,
            config_filename=f"{name}.kcpps",
            lane="text",
            duration_ms=1.0,
            finished_at=finished,
        )

    deleted = analytics_prune(retention_secs=retention.total_seconds(), now=now)

    assert deleted == 4
    assert request_models() == ["at-cutoff", "fresh"]
    assert load_models() == ["at-cutoff", "fresh"]
    assert analytics_prune(retention_secs=retention.total_seconds(), now=now) == 0
