"""The folded decision log read from its rollup: the same folds as the rows themselves say.

The rollup (`offload_decision_folds`, kept by triggers) holds whole minutes; a page reads its
first minute and a partial last one from the rows. Every fold below is checked against the
fold computed here, in Python, from the rows that fall in the window.
"""

from __future__ import annotations

import importlib
import random
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from lending.decisions import (
    FOLD_BUCKET_MS,
    FOLD_MEASURES,
    FOLD_SIGNATURE,
    _bucket_groups_sql,
    decisions_fold,
)
from lending.models import OffloadDecision, OffloadDecisionFold, OffloadDecisionSignature
from lending.services import decisions_prune
from lending.tests.factories import OffloadDecisionFactory

T0_MS = 1_750_000_020_000  # 20 s into a minute: windows start and end inside minutes
SPAN_MS = 7 * FOLD_BUCKET_MS
MIGRATION = importlib.import_module("lending.migrations.0004_decision_folds")


def random_rows(rng: random.Random, count: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(count):
        row: dict[str, Any] = {
            "recorded_at": T0_MS + rng.randrange(SPAN_MS),
            "node_id": rng.choice(["master", "o"]),
            "kind": rng.choice(["plan", "dispatch"]),
            "trigger": rng.choice(["enqueued", "completed", ""]),
            "lane": rng.choice(["text", "image"]),
            "owner_node_id": "o",
            "owner_model_id": rng.choice(["big", "small"]),
            "helper_node_id": "h",
            "helper_model_id": rng.choice(["fast", "small"]),
            "outcome": rng.choice(["lent", "skipped"]),
            "reason": rng.choice(["", "cost_rejected"]),
            "router_version": rng.choice(["1.0", "1.1"]),
            "request_id": rng.choice([None, f"req-{i:04d}"]),
            "key_name": rng.choice([None, "alice", "bob"]),
        }
        for m in FOLD_MEASURES:
            row[m] = rng.randrange(0, 50) if rng.random() < 0.7 else 0
        row["keep_ms"] = float(row["keep_ms"]) + 0.5
        rows.append(row)
    # Rows on either side of every minute's first millisecond, where rollup and rows meet.
    first = (T0_MS // FOLD_BUCKET_MS + 1) * FOLD_BUCKET_MS
    for i, at in enumerate(range(first, T0_MS + SPAN_MS, FOLD_BUCKET_MS)):
        for j, offset in enumerate((-1, 0, 1)):
            rows[(3 * i + j) % count]["recorded_at"] = at + offset
    return rows


def store(rows: list[dict[str, Any]]) -> None:
    OffloadDecision.objects.bulk_create([OffloadDecisionFactory.build(**r) for r in rows])


def expected(
    rows: list[dict[str, Any]], lo: int | None, hi: int | None
) -> dict[tuple[Any, ...], Any]:
    """Each fold's count, span, triggers and measure ranges, straight from the rows."""
    out: dict[tuple[Any, ...], Any] = {}
    for r in rows:
        if (lo is not None and r["recorded_at"] < lo) or (hi is not None and r["recorded_at"] > hi):
            continue
        key = tuple(r[k] for k in FOLD_SIGNATURE)
        fold = out.setdefault(key, {"count": 0, "at": [], "triggers": Counter(), "m": {}})
        fold["count"] += 1
        fold["at"].append(r["recorded_at"])
        if r["trigger"]:
            fold["triggers"][r["trigger"]] += 1
        for m in FOLD_MEASURES:
            fold["m"].setdefault(m, []).append(r[m])
    return {
        key: (
            f["count"],
            min(f["at"]),
            max(f["at"]),
            dict(f["triggers"]),
            {m: [min(v), max(v)] for m, v in f["m"].items() if [min(v), max(v)] != [0, 0]},
        )
        for key, f in out.items()
    }


def folded(**filters: Any) -> dict[tuple[Any, ...], Any]:
    query: dict[str, Any] = {"lane": None, "outcome": None, "kind": None, "since_ms": None}
    query.update(filters)
    doc = decisions_fold(**query)
    assert doc["truncated"] is False
    return {
        tuple(f[k] for k in FOLD_SIGNATURE): (
            f["count"],
            f["first_at"],
            f["last_at"],
            f["triggers"],
            f["measures"],
        )
        for f in doc["folds"]
    }


@pytest.mark.django_db
def test_every_window_folds_as_its_rows_do() -> None:
    rng = random.Random(29)
    rows = random_rows(rng, 600)
    store(rows)
    windows: list[tuple[int | None, int | None]] = [(None, None), (T0_MS + 30_000, None)]
    windows += [(None, T0_MS + 3 * FOLD_BUCKET_MS + 1)]
    for _ in range(12):
        start = T0_MS + rng.randrange(-FOLD_BUCKET_MS, SPAN_MS)
        windows.append((start, start + rng.randrange(0, 4 * FOLD_BUCKET_MS)))
    # Exactly on minute edges, where the rollup and the rows meet.
    edge = (T0_MS // FOLD_BUCKET_MS + 2) * FOLD_BUCKET_MS
    windows += [(edge, edge + 2 * FOLD_BUCKET_MS - 1), (edge - 1, edge + FOLD_BUCKET_MS)]
    for lo, hi in windows:
        assert folded(since_ms=lo, until_ms=hi) == expected(rows, lo, hi), (lo, hi)
    # Most of the window came from the rollup: it holds far fewer rows than the log.
    assert 0 < OffloadDecisionFold.objects.count() < len(rows)


@pytest.mark.django_db
def test_filters_narrow_the_rollup_as_they_narrow_the_rows() -> None:
    rows = random_rows(random.Random(7), 400)
    store(rows)
    small = [r for r in rows if "small" in (r["owner_model_id"], r["helper_model_id"])]
    assert folded(model_id="small") == expected(small, None, None)
    text_lent = [r for r in rows if r["lane"] == "text" and r["outcome"] == "lent"]
    assert folded(lane="text", outcome="lent") == expected(text_lent, None, None)
    mine = [r for r in rows if r["node_id"] == "o" and r["kind"] == "dispatch"]
    assert folded(node_id="o", kind="dispatch") == expected(mine, None, None)


@pytest.mark.django_db
def test_pruned_and_deleted_rows_leave_their_folds() -> None:
    rows = random_rows(random.Random(11), 500)
    store(rows)
    cutoff = T0_MS + 2 * FOLD_BUCKET_MS + 17_000  # inside a minute: it keeps some rows
    decisions_prune(now_ms=cutoff, retention_ms=0)
    kept = [r for r in rows if r["recorded_at"] >= cutoff]
    assert folded() == expected(kept, None, None)
    # A row deleted from the middle leaves its fold's count (its range may stay as it was).
    victim = OffloadDecision.objects.filter(recorded_at__gte=cutoff + FOLD_BUCKET_MS).first()
    assert victim is not None
    key = tuple(getattr(victim, k) for k in FOLD_SIGNATURE)
    victim.delete()
    counts = {k: v[0] for k, v in folded().items()}
    want = {k: v[0] for k, v in expected(kept, None, None).items()}
    want[key] -= 1
    assert counts == {k: v for k, v in want.items() if v}


@pytest.mark.django_db
def test_the_migration_fills_the_rollup_as_the_triggers_keep_it() -> None:
    store(random_rows(random.Random(3), 300))
    columns = [f.name for f in OffloadDecisionFold._meta.concrete_fields if f.name != "id"]
    kept = sorted(OffloadDecisionFold.objects.values_list(*columns))
    OffloadDecisionFold.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(MIGRATION._fill_sql())
    assert sorted(OffloadDecisionFold.objects.values_list(*columns)) == kept


SIGNATURES = importlib.import_module("lending.migrations.0005_decision_signatures")
SIGNATURE_KEY = (*FOLD_SIGNATURE, "trigger")


def signatures_of(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each signature and trigger with its row count and newest row, straight from the rows."""
    out: dict[tuple[Any, ...], list[int]] = {}
    for r in rows:
        seen = out.setdefault(tuple(r[k] for k in SIGNATURE_KEY), [0, 0])
        seen[0] += 1
        seen[1] = max(seen[1], r["recorded_at"])
    return sorted((*key, n, last) for key, (n, last) in out.items())


def signatures_kept() -> list[tuple[Any, ...]]:
    return sorted(OffloadDecisionSignature.objects.values_list(*SIGNATURE_KEY, "n", "last_at"))


@pytest.mark.django_db
def test_the_signatures_count_their_rows_as_rows_come_and_go() -> None:
    rows = random_rows(random.Random(5), 400)
    store(rows)
    assert signatures_kept() == signatures_of(rows)
    cutoff = T0_MS + 3 * FOLD_BUCKET_MS
    decisions_prune(now_ms=cutoff, retention_ms=0)
    kept = [r for r in rows if r["recorded_at"] >= cutoff]
    # Pruning takes the oldest rows: the newest of each signature stays as it was, and a
    # signature left without rows goes.
    assert signatures_kept() == signatures_of(kept)
    OffloadDecision.objects.all().delete()
    assert signatures_kept() == []


@pytest.mark.django_db
def test_the_migration_fills_the_signatures_as_the_triggers_keep_them() -> None:
    store(random_rows(random.Random(4), 300))
    kept = signatures_kept()
    OffloadDecisionSignature.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(SIGNATURES._fill_sql())
    assert signatures_kept() == kept


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's plan")
@pytest.mark.django_db
def test_the_rollup_is_read_by_seeks_into_its_index_without_sorting_the_window() -> None:
    sql, params = _bucket_groups_sql(T0_MS, T0_MS + SPAN_MS, {"lane": "text"}, 10)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " / ".join(str(step[-1]) for step in cursor.fetchall())
    assert "SEARCH r USING INDEX" in plan and "bucket_ms>? AND bucket_ms<?" in plan, plan
    assert "GROUP BY" not in plan, plan
