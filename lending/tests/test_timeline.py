"""Lending over time: the window, the buckets each node fills from its database, the merge."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from analytics.models import RequestRecord
from lending.models import OffloadDecision
from lending.tests.factories import OffloadDecisionFactory
from lending.timeline import (
    MAX_BUCKETS,
    MIN_STEP_MS,
    merge_timelines,
    timeline_local,
    timeline_window,
)
from routerproject.errors import RouterError

T0 = 1_750_000_020_000  # a whole minute


def test_minutes_make_sixty_buckets_ending_on_a_whole_step() -> None:
    since, until, step = timeline_window({"minutes": "15"}, now_ms=T0 + 7_500)
    assert step == 15_000
    assert until == T0 + 15_000 and (until - since) // step == 60
    # A second later the buckets are the same ones.
    assert timeline_window({"minutes": "15"}, now_ms=T0 + 8_500) == (since, until, step)
    assert timeline_window({}, now_ms=T0)[2] == 15_000  # 15 minutes by default


def test_a_short_window_keeps_one_second_buckets() -> None:
    since, until, step = timeline_window({"minutes": "1"}, now_ms=T0)
    assert step == MIN_STEP_MS and (until - since) // step == 60


@pytest.mark.parametrize("raw", ["0", "1441", "-5", "x", "1.5"])
def test_minutes_out_of_range_are_a_400_naming_minutes(raw: str) -> None:
    with pytest.raises(RouterError) as caught:
        timeline_window({"minutes": raw}, now_ms=T0)
    assert (caught.value.status, caught.value.param) == (400, "minutes")
    assert timeline_window({"minutes": "1440"}, now_ms=T0)[2] == 1_440_000


def test_a_master_given_window_is_used_as_is_and_bounded() -> None:
    query = {"since_ms": "1000", "until_ms": "61000", "step_ms": "1000"}
    assert timeline_window(query, now_ms=T0) == (1000, 61000, 1000)
    too_many = {"since_ms": "0", "until_ms": str((MAX_BUCKETS + 1) * 1000), "step_ms": "1000"}
    for bad in (
        too_many,
        {**query, "step_ms": str(MIN_STEP_MS - 1)},
        {**query, "until_ms": "1000"},
        {**query, "since_ms": "soon"},
    ):
        with pytest.raises(RouterError):
            timeline_window(bad, now_ms=T0)
    exact = {"since_ms": "0", "until_ms": str(MAX_BUCKETS * 1000), "step_ms": "1000"}
    assert timeline_window(exact, now_ms=T0)[2] == 1000


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def request(node: str, start_ms: int, end_ms: int, *, borrowed: bool = False) -> RequestRecord:
    return RequestRecord(
        node_id=node,
        model_id="m",
        lane="text",
        borrowed=borrowed,
        duration_ms=end_ms - start_ms,
        started_at=_at(start_ms),
        finished_at=_at(end_ms),
    )


def decision(at: int, **fields: Any) -> OffloadDecision:
    row: OffloadDecision = OffloadDecisionFactory.build(
        recorded_at=at, node_id="a", lane="text", owner_node_id="a", owner_model_id="big", **fields
    )
    return row


@pytest.mark.django_db
def test_a_node_splits_request_time_over_buckets_and_counts_lent_and_held() -> None:
    since, step = T0, 10_000
    RequestRecord.objects.bulk_create(
        [
            # 5 s in bucket 0 and 3 s in bucket 1.
            request("a", since + 5_000, since + 13_000),
            # Borrowed work: 2 s in bucket 2.
            request("a", since + 20_000, since + 22_000, borrowed=True),
            # Begun before the window: only its part inside counts.
            request("a", since - 4_000, since + 1_000),
            # Another node's row and a row after the window are not this node's series.
            request("b", since, since + 9_000),
            request("a", since + 40_000, since + 41_000),
        ]
    )
    OffloadDecision.objects.bulk_create(
        [
            decision(since + 1, kind="dispatch", outcome="lent"),
            decision(since + 2, kind="dispatch", outcome="lent"),
            decision(since + 25_000, kind="dispatch", outcome="lent"),
            decision(since + 3, kind="plan", outcome="skipped", pending_count=4),
            decision(since + 4, kind="plan", outcome="granted", pending_count=7),
            decision(since + 11_000, kind="plan", outcome="skipped", pending_count=2),
            # Outside the window, or another kind: not counted.
            decision(since + 30_000, kind="dispatch", outcome="lent"),
            decision(since + 5, kind="dispatch", outcome="returned"),
        ]
    )
    doc = timeline_local(node_id="a", since_ms=since, until_ms=since + 30_000, step_ms=step)
    node = doc["node"]
    assert node["own_ms"] == [6_000, 3_000, 0]
    assert node["borrowed_ms"] == [0, 0, 2_000]
    assert node["lent"] == [2, 0, 1]
    (owner,) = doc["owners"]
    assert (owner["owner_node_id"], owner["owner_model_id"]) == ("a", "big")
    assert owner["held_max"] == [7, 2, 0] and owner["lent"] == [2, 0, 1]


def test_the_merge_keeps_nodes_apart_and_merges_owners() -> None:
    window = {"since_ms": 0, "until_ms": 20_000, "step_ms": 10_000}
    owner = {"owner_node_id": "o", "owner_model_id": "big", "lane": "text"}
    master: dict[str, Any] = {
        **window,
        "node": {"node_id": "m", "own_ms": [0, 0], "borrowed_ms": [0, 0], "lent": [0, 0]},
        "owners": [{**owner, "held_max": [5, 1], "lent": [0, 0]}],
    }
    o = {
        **window,
        "node": {"node_id": "o", "own_ms": [9, 9], "borrowed_ms": [0, 0], "lent": [3, 1]},
        "owners": [{**owner, "held_max": [0, 0], "lent": [3, 1]}],
    }
    other_window = {**o, "since_ms": 5}
    doc = merge_timelines({"m": master, "o": o, "x": other_window}, **window)
    assert [n["node_id"] for n in doc["nodes"]] == ["m", "o"]
    assert doc["buckets"] == 2
    (merged,) = doc["owners"]
    assert merged["held_max"] == [5, 1] and merged["lent"] == [3, 1]
    # The inputs are left as they were.
    assert master["owners"][0]["lent"] == [0, 0]
