"""Lending over time: the window, the buckets each node fills from its database, the merge."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from analytics.models import RequestRecord
from lending.models import OffloadDecision
from lending.tests.factories import OffloadDecisionFactory
from lending.timeline import (
    MAX_BUCKETS,
    MIN_STEP_MS,
    lane_slots,
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


def request(
    node: str,
    start_ms: int,
    end_ms: int,
    *,
    borrowed: bool = False,
    backend_ms: float | None = None,
    lane: str = "text",
) -> RequestRecord:
    """A finished request; `backend_ms` is its backend's own time when it waited before that."""
    return RequestRecord(
        node_id=node,
        model_id="m",
        lane=lane,
        borrowed=borrowed,
        duration_ms=end_ms - start_ms if backend_ms is None else backend_ms,
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


def _series(slots: dict[str, int] | None = None, buckets: int = 1) -> dict[str, Any]:
    node: dict[str, Any] = timeline_local(
        node_id="a", since_ms=T0, until_ms=T0 + buckets * 10_000, step_ms=10_000, slots=slots
    )["node"]
    return node


@pytest.mark.django_db
def test_requests_at_once_on_a_one_slot_lane_fill_the_bucket_once() -> None:
    # Two rows over the same ten seconds on a one-at-a-time backend: the lane was busy ten
    # seconds, not twenty (the old chart's 200 %).
    RequestRecord.objects.bulk_create(
        [request("a", T0, T0 + 10_000), request("a", T0, T0 + 10_000, borrowed=True)]
    )
    node = _series()
    assert node["slots"] == 1
    assert (node["own_ms"], node["borrowed_ms"], node["idle_ms"]) == ([5_000], [5_000], [0])


@pytest.mark.django_db
def test_time_waiting_before_the_backend_is_not_busy_time() -> None:
    # Ten seconds from arrival to answer, of which the backend worked the last four.
    RequestRecord.objects.bulk_create([request("a", T0, T0 + 10_000, backend_ms=4_000)])
    node = _series()
    assert (node["own_ms"], node["idle_ms"]) == ([4_000], [6_000])


@pytest.mark.django_db
def test_two_slots_hold_twice_the_bucket_split_in_proportion() -> None:
    RequestRecord.objects.bulk_create(
        [
            request("a", T0, T0 + 10_000),
            request("a", T0, T0 + 10_000, borrowed=True),
            # A third at once from 5 s: two slots, three requests, two of them own.
            request("a", T0 + 5_000, T0 + 10_000),
        ]
    )
    node = _series({"text": 2})
    assert node["slots"] == 2
    assert node["own_ms"] == [5_000 + round(5_000 * 4 / 3)]
    assert node["borrowed_ms"] == [5_000 + round(5_000 * 2 / 3)]
    assert node["idle_ms"] == [0]


@pytest.mark.django_db
def test_a_lane_the_slots_do_not_name_counts_one_slot_more() -> None:
    RequestRecord.objects.bulk_create([request("a", T0, T0 + 10_000, lane="image")])
    node = _series({"text": 2})
    assert node["slots"] == 3 and node["own_ms"] == [10_000] and node["idle_ms"] == [20_000]


@pytest.mark.django_db
def test_every_intervals_parts_add_up_to_its_slots_time() -> None:
    rng = random.Random(7)
    rows = []
    for _ in range(200):
        start = T0 + rng.randrange(-5_000, 60_000)
        end = start + rng.randrange(1, 9_000)
        waited = rng.random() < 0.3
        rows.append(
            request(
                "a",
                start,
                end,
                borrowed=rng.random() < 0.4,
                backend_ms=(end - start) * rng.random() if waited else None,
                lane=rng.choice(["text", "text", "image"]),
            )
        )
    RequestRecord.objects.bulk_create(rows)
    node = _series({"text": 3}, buckets=6)
    capacity = node["slots"] * 10_000
    for own, borrowed, idle in zip(
        node["own_ms"], node["borrowed_ms"], node["idle_ms"], strict=True
    ):
        assert own + borrowed <= capacity + 1
        assert abs(100 * (own + borrowed + idle) / capacity - 100) <= 1


def test_lane_slots_come_from_the_widest_parallel_and_one_per_other_backend() -> None:
    def cfg(parallel: int | None = None, **flags: bool) -> SimpleNamespace:
        kinds = ("has_llm", "has_embeddings", "has_tts", "has_image", "has_voice")
        return SimpleNamespace(parallel=parallel, **{k: flags.get(k, False) for k in kinds})

    configs = [
        cfg(2, has_llm=True),
        cfg(4, has_embeddings=True),
        cfg(None, has_tts=True),
        cfg(None, has_image=True),
        cfg(None, has_voice=True),
    ]
    assert lane_slots(configs) == {"text": 4, "image": 1, "whisper": 1}
    assert lane_slots([cfg(None, has_tts=True)]) == {"text": 1}
    assert lane_slots([]) == {}
