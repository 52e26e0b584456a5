from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from lending.queue import Entry, LaneQueue, QueueStats, State

START_SECS = 1000.0


class FakeClock:
    def __init__(self, now: float = START_SECS) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


def make_queue(
    clock: FakeClock,
    *,
    depth: int = 2,
    lane: str = "text",
    hold: Callable[[Entry, LaneQueue, float], bool] | None = None,
    on_held: Callable[[Entry, float], None] | None = None,
) -> LaneQueue:
    return LaneQueue(lane, depth=depth, clock=clock, hold=hold, on_held=on_held)


def arrive(queue: LaneQueue, clock: FakeClock, model_id: str = "A", **fields: Any) -> Entry:
    entry = Entry(model_id=model_id, arrived_at=clock(), **fields)
    queue.enqueue(entry)
    return entry


def always_hold(entry: Entry, queue: LaneQueue, now: float) -> bool:
    return True


# ----- the spec's flow ------------------------------------------------------------------------


@pytest.fixture
def flow() -> tuple[FakeClock, LaneQueue, list[Entry]]:
    """Depth 2, ten requests for model A arriving one second apart, each of its own size."""
    clock = FakeClock()
    queue = make_queue(clock)
    entries = []
    for i in range(10):
        entries.append(arrive(queue, clock, work=(100.0 * (i + 1), 50.0), context=1000))
        clock.advance(1.0)
    return clock, queue, entries


def test_ten_requests_at_depth_two_admit_two_and_keep_eight_pending(flow):
    _clock, queue, entries = flow
    assert queue.admitted() == entries[:2]
    assert [e.state for e in entries[:2]] == [State.ADMITTED] * 2
    assert entries[0].admitted_at == START_SECS
    assert entries[1].admitted_at == START_SECS + 1.0
    assert queue.pending() == entries[2:]
    assert queue.stats("A") == QueueStats(
        pending_count=8,
        pending_work=(5200.0, 400.0),
        pending_context=8000,
        backlog_count=10,
        backlog_work=(5500.0, 500.0),
        lent_count=0,
        lendable_count=8,
    )
    assert len(queue) == 10


def test_withdraw_lends_the_newest_and_the_oldest_keep_their_place(flow):
    clock, queue, entries = flow
    lent = queue.withdraw("A", 2, helper=("node-2", "A-helper"))
    assert lent == [entries[9], entries[8]]
    assert all(e.state is State.LENT for e in lent)
    assert all(e.lent_at == clock() for e in lent)
    assert all(e.helper == ("node-2", "A-helper") for e in lent)
    assert queue.pending() == entries[2:8]
    assert queue.lent("A") == [entries[9], entries[8]]
    stats = queue.stats("A")
    assert (stats.pending_count, stats.backlog_count, stats.lent_count) == (6, 8, 2)
    assert stats.pending_work == (100.0 * (3 + 4 + 5 + 6 + 7 + 8), 300.0)
    assert len(queue) == 10


def test_completing_an_admitted_request_tops_the_backend_back_up_with_the_oldest(flow):
    _clock, queue, entries = flow
    queue.withdraw("A", 2)
    assert queue.complete(entries[0]) == [entries[2]]
    assert entries[0].state is State.DONE
    assert queue.admitted() == [entries[1], entries[2]]
    assert queue.stats("A").backlog_count == 7


def test_a_returned_request_goes_to_the_head_with_its_first_arrival_and_is_never_lent_again(flow):
    clock, queue, entries = flow
    queue.withdraw("A", 2)
    clock.advance(30.0)
    assert queue.lent_returned(entries[8]) == []
    assert entries[8].returned
    assert entries[8].state is State.QUEUED
    assert entries[8].arrived_at == START_SECS + 8.0
    assert entries[8].helper is None and entries[8].lent_at is None
    assert queue.pending() == [entries[8], *entries[2:8]]
    assert queue.stats("A").lent_count == 1
    assert queue.withdraw("A", 100) == entries[7:1:-1]
    assert entries[8].state is State.QUEUED
    assert queue.complete(entries[0]) == [entries[8]]


def test_returned_requests_wait_in_order_of_their_first_arrival(flow):
    _clock, queue, entries = flow
    queue.withdraw("A", 3)
    queue.lent_returned(entries[9])
    queue.lent_returned(entries[7])
    queue.lent_returned(entries[8])
    assert queue.pending()[:3] == [entries[7], entries[8], entries[9]]


def test_a_lent_request_answered_by_the_helper_is_done_and_gone(flow):
    _clock, queue, entries = flow
    queue.withdraw("A", 1)
    assert queue.lent_finished(entries[9]) == []
    assert entries[9].state is State.DONE
    assert queue.lent() == []
    assert len(queue) == 9
    assert queue.stats("A").lent_count == 0


# ----- pinned, cancel, depth ------------------------------------------------------------------


def test_pinned_requests_count_as_pending_but_are_never_withdrawn():
    clock = FakeClock()
    queue = make_queue(clock)
    arrive(queue, clock)
    arrive(queue, clock)
    plain = arrive(queue, clock, work=(10.0, 1.0))
    streams = [arrive(queue, clock, work=(20.0, 2.0), pinned=True) for _ in range(2)]
    stats = queue.stats("A")
    assert stats.pending_count == 3
    assert stats.pending_work == (50.0, 5.0)
    assert queue.withdraw("A", 5) == [plain]
    assert queue.pending() == streams
    assert queue.withdraw("A", 5) == []


def test_pinned_and_lendable_requests_are_admitted_in_arrival_order():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    first = arrive(queue, clock)
    rest = [arrive(queue, clock, pinned=i % 2 == 0) for i in range(5)]
    admitted = []
    current = first
    for _ in rest:
        (current,) = queue.complete(current)
        admitted.append(current)
    assert admitted == rest


def test_cancelling_a_queued_request_removes_it_without_admitting_anything():
    clock = FakeClock()
    queue = make_queue(clock)
    a1, _a2, a3, a4 = (arrive(queue, clock, work=(10.0, 1.0), context=100) for _ in range(4))
    assert queue.cancel(a3) == []
    assert a3.state is State.DONE
    assert queue.pending() == [a4]
    assert len(queue) == 3
    assert queue.stats("A").pending_count == 1
    assert queue.stats("A").pending_context == 100
    assert queue.complete(a1) == [a4]


def test_cancelling_an_admitted_request_frees_its_slot_for_the_next():
    clock = FakeClock()
    queue = make_queue(clock)
    a1, a2, a3 = (arrive(queue, clock) for _ in range(3))
    assert queue.cancel(a1) == [a3]
    assert a1.state is State.DONE
    assert queue.admitted() == [a2, a3]
    assert queue.complete(a1) == []


def test_cancelling_a_lent_request_drops_it_and_a_late_answer_is_ignored():
    clock = FakeClock()
    queue = make_queue(clock)
    for _ in range(3):
        arrive(queue, clock)
    (lent,) = queue.withdraw("A", 1)
    assert queue.cancel(lent) == []
    assert lent.state is State.DONE
    assert queue.lent() == []
    assert queue.stats("A").lent_count == 0
    assert queue.lent_finished(lent) == []
    assert queue.lent_returned(lent) == []
    assert queue.pending() == []
    assert len(queue) == 2


def test_cancelling_twice_is_harmless_and_completing_a_queued_entry_is_an_error():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    arrive(queue, clock)
    waiting = arrive(queue, clock)
    with pytest.raises(ValueError):
        queue.complete(waiting)
    queue.cancel(waiting)
    assert queue.cancel(waiting) == []
    assert len(queue) == 1


def test_an_entry_cannot_be_enqueued_twice():
    clock = FakeClock()
    queue = make_queue(clock)
    entry = arrive(queue, clock)
    with pytest.raises(ValueError):
        queue.enqueue(entry)


@pytest.mark.parametrize("borrowed", [False, True])
def test_an_entry_still_waiting_cannot_be_enqueued_again(borrowed: bool) -> None:
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    running = arrive(queue, clock)
    waiting = arrive(queue, clock, borrowed=borrowed)
    assert waiting.state is State.QUEUED
    with pytest.raises(ValueError, match="already queued"):
        queue.enqueue(waiting)
    # Refused whole: still one waiting entry, and it is admitted exactly once.
    assert queue.pending() == [waiting]
    assert len(queue) == 2
    assert queue.complete(running) == [waiting]
    assert queue.pending() == []
    assert len(queue) == 1


def test_growing_the_depth_admits_at_once_and_shrinking_it_evicts_nothing():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    entries = [arrive(queue, clock) for _ in range(5)]
    assert queue.set_depth(3) == entries[1:3]
    assert queue.set_depth(1) == []
    assert queue.admitted() == entries[:3]
    assert queue.complete(entries[0]) == []
    assert queue.complete(entries[1]) == []
    assert queue.complete(entries[2]) == [entries[3]]
    with pytest.raises(ValueError):
        queue.set_depth(0)


def test_models_of_one_lane_share_the_depth_in_arrival_order():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    a1 = arrive(queue, clock, "A")
    b1 = arrive(queue, clock, "B")
    a2 = arrive(queue, clock, "A")
    b2 = arrive(queue, clock, "B")
    assert queue.pending() == [b1, a2, b2]
    assert queue.pending("B") == [b1, b2]
    assert queue.complete(a1) == [b1]
    assert queue.complete(b1) == [a2]
    assert queue.complete(a2) == [b2]


def test_withdraw_takes_only_entries_that_fit_the_helper():
    clock = FakeClock()
    queue = make_queue(clock)
    arrive(queue, clock, context=100)
    arrive(queue, clock, context=100)
    small = arrive(queue, clock, context=2000)
    arrive(queue, clock, context=9000)
    smaller = arrive(queue, clock, context=1000)
    arrive(queue, clock, context=8000)
    lent = queue.withdraw("A", 3, fits=lambda entry: entry.context <= 4096)
    assert lent == [smaller, small]


def test_withdraw_of_an_unknown_model_or_nothing_lends_nothing():
    clock = FakeClock()
    queue = make_queue(clock)
    for _ in range(3):
        arrive(queue, clock)
    assert queue.withdraw("Z", 2) == []
    assert queue.withdraw("A", 0) == []


# ----- the hold ---------------------------------------------------------------------------------


def test_a_held_request_of_one_model_does_not_block_another_models_request_behind_it():
    clock = FakeClock()
    queue = make_queue(clock, hold=lambda entry, q, now: entry.model_id == "A")
    a1 = arrive(queue, clock, "A")
    a2 = arrive(queue, clock, "A")
    a3 = arrive(queue, clock, "A")
    assert a1.state is State.ADMITTED
    assert a2.state is State.HELD
    assert a3.state is State.QUEUED
    b1 = arrive(queue, clock, "B")
    assert b1.state is State.ADMITTED
    assert queue.admitted() == [a1, b1]
    assert queue.pending() == [a2, a3]


def test_the_hold_is_never_consulted_when_nothing_is_admitted():
    clock = FakeClock()
    calls: list[Entry] = []

    def hold(entry: Entry, q: LaneQueue, now: float) -> bool:
        calls.append(entry)
        return True

    queue = make_queue(clock, hold=hold)
    a1 = arrive(queue, clock)
    assert a1.state is State.ADMITTED
    assert calls == []
    a2 = arrive(queue, clock)
    assert calls == [a2]
    assert a2.state is State.HELD
    queue.complete(a1)
    assert a2.state is State.ADMITTED


def test_the_hold_gets_the_candidate_the_queue_and_the_clock_time():
    clock = FakeClock()
    seen: list[tuple[Entry, LaneQueue, float]] = []

    def hold(entry: Entry, q: LaneQueue, now: float) -> bool:
        seen.append((entry, q, now))
        return False

    queue = make_queue(clock, hold=hold)
    arrive(queue, clock)
    clock.advance(2.5)
    a2 = arrive(queue, clock)
    assert seen == [(a2, queue, START_SECS + 2.5)]


def test_a_returned_request_is_never_held():
    clock = FakeClock()
    queue = make_queue(clock, hold=always_hold)
    arrive(queue, clock)
    a2 = arrive(queue, clock)
    assert a2.state is State.HELD
    assert queue.withdraw("A", 1) == [a2]
    assert queue.lent_returned(a2) == [a2]
    assert a2.state is State.ADMITTED


def test_a_pinned_request_is_never_held():
    clock = FakeClock()
    queue = make_queue(clock, hold=always_hold)
    arrive(queue, clock)
    stream = arrive(queue, clock, pinned=True)
    assert stream.state is State.ADMITTED


def test_a_borrowed_request_is_never_held():
    clock = FakeClock()
    queue = make_queue(clock, hold=always_hold)
    arrive(queue, clock, borrowed=True)
    second = arrive(queue, clock, borrowed=True)
    assert second.state is State.ADMITTED


def test_no_hold_while_another_model_is_admitted():
    clock = FakeClock()
    queue = make_queue(clock, depth=3, hold=always_hold)
    arrive(queue, clock, "B")
    arrive(queue, clock, "A")
    a2 = arrive(queue, clock, "A")
    assert a2.state is State.ADMITTED


def test_no_hold_while_borrowed_work_is_admitted():
    clock = FakeClock()
    queue = make_queue(clock, depth=3, hold=always_hold)
    arrive(queue, clock, "A", borrowed=True)
    arrive(queue, clock, "A")
    a2 = arrive(queue, clock, "A")
    assert a2.state is State.ADMITTED


def test_a_held_request_is_released_when_the_hold_turns_false_on_reevaluation():
    clock = FakeClock()
    holding = {"on": True}
    queue = make_queue(clock, hold=lambda entry, q, now: holding["on"])
    arrive(queue, clock)
    a2 = arrive(queue, clock)
    assert a2.state is State.HELD
    assert a2.held_since == START_SECS
    clock.advance(3.0)
    assert queue.reevaluate() == []
    holding["on"] = False
    assert queue.reevaluate() == [a2]
    assert a2.state is State.ADMITTED
    assert a2.admitted_at == START_SECS + 3.0
    assert a2.held_since == START_SECS


def test_switching_the_hold_off_releases_the_held_request():
    clock = FakeClock()
    queue = make_queue(clock, hold=always_hold)
    arrive(queue, clock)
    a2 = arrive(queue, clock)
    assert queue.set_hold(None) == [a2]


def test_a_held_request_is_queued_again_once_no_free_slot_is_being_kept_for_it():
    clock = FakeClock()
    queue = make_queue(clock, hold=lambda entry, q, now: entry.model_id == "A")
    arrive(queue, clock, "A")
    a2 = arrive(queue, clock, "A")
    b1 = arrive(queue, clock, "B")
    assert a2.state is State.HELD
    assert queue.reevaluate() == []
    assert a2.state is State.QUEUED
    # The slot B frees is not behind A alone any more once B is gone: the hold applies again.
    assert queue.complete(b1) == []
    assert a2.state is State.HELD


def test_the_first_hold_is_reported_once_with_its_time():
    clock = FakeClock()
    reported: list[tuple[Entry, float]] = []
    queue = make_queue(
        clock, hold=always_hold, on_held=lambda entry, now: reported.append((entry, now))
    )
    arrive(queue, clock)
    a2 = arrive(queue, clock)
    clock.advance(1.0)
    queue.reevaluate()
    arrive(queue, clock)
    assert reported == [(a2, START_SECS)]
    assert a2.held_since == START_SECS


def test_a_held_request_keeps_borrowed_work_waiting():
    clock = FakeClock()
    queue = make_queue(clock, hold=always_hold)
    arrive(queue, clock, "A")
    a2 = arrive(queue, clock, "A")
    borrowed = arrive(queue, clock, "H", borrowed=True)
    assert a2.state is State.HELD
    assert borrowed.state is State.QUEUED
    assert queue.admitted("H") == []


def test_lending_the_held_request_lets_the_next_one_be_judged_on_reevaluation():
    clock = FakeClock()
    holding = {"on": True}
    queue = make_queue(clock, hold=lambda entry, q, now: holding["on"])
    arrive(queue, clock)
    a2 = arrive(queue, clock)
    assert queue.withdraw("A", 1) == [a2]
    a3 = arrive(queue, clock)
    assert a3.state is State.HELD
    holding["on"] = False
    assert queue.reevaluate() == [a3]


def test_a_cancelled_held_request_unblocks_its_model():
    clock = FakeClock()
    queue = make_queue(clock, hold=lambda entry, q, now: entry.seq == 2)
    arrive(queue, clock)
    a2 = arrive(queue, clock)
    a3 = arrive(queue, clock)
    assert a3.state is State.QUEUED
    assert queue.cancel(a2) == [a3]


# ----- helper side ------------------------------------------------------------------------------


def test_a_helpers_own_request_goes_ahead_of_borrowed_work():
    clock = FakeClock()
    queue = make_queue(clock)
    x1, x2, x3 = (arrive(queue, clock, "H", borrowed=True) for _ in range(3))
    own = arrive(queue, clock, "H")
    assert queue.pending() == [own, x3]
    assert queue.complete(x1) == [own]
    assert queue.complete(x2) == [x3]


def test_own_work_arriving_hands_back_borrowed_work_not_yet_admitted():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    x1, x2, x3 = (arrive(queue, clock, "H", borrowed=True) for _ in range(3))
    assert queue.own_work() is False
    own = arrive(queue, clock, "H")
    assert queue.own_work() is True
    assert queue.return_pending_borrowed() == [x2, x3]
    assert x2.state is State.DONE and x3.state is State.DONE
    assert queue.admitted() == [x1]
    assert len(queue) == 2
    assert queue.return_pending_borrowed() == []
    assert queue.complete(x1) == [own]


def test_a_native_request_records_how_many_borrowed_jobs_were_admitted_when_it_arrived():
    clock = FakeClock()
    queue = make_queue(clock)
    x1 = arrive(queue, clock, "H", borrowed=True)
    arrive(queue, clock, "H", borrowed=True)
    arrive(queue, clock, "H", borrowed=True)
    own = arrive(queue, clock, "H")
    assert queue.borrowed_admitted() == 2
    assert own.borrowed_ahead == 2
    queue.complete(x1)
    later = arrive(queue, clock, "H")
    assert later.borrowed_ahead == 1


def test_queue_stats_ignore_borrowed_entries():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    arrive(queue, clock, "H", borrowed=True, work=(999.0, 9.0), context=50)
    arrive(queue, clock, "H", borrowed=True, work=(999.0, 9.0), context=50)
    arrive(queue, clock, "H", work=(10.0, 2.0), context=30)
    assert queue.stats("H") == QueueStats(
        pending_count=1,
        pending_work=(10.0, 2.0),
        pending_context=30,
        backlog_count=1,
        backlog_work=(10.0, 2.0),
        lent_count=0,
        lendable_count=1,
    )
    assert queue.own_work() is True


def test_borrowed_work_alone_is_not_own_work():
    clock = FakeClock()
    queue = make_queue(clock)
    arrive(queue, clock, "H", borrowed=True)
    assert queue.own_work() is False
    assert queue.borrowed_admitted() == 1


# ----- statistics and snapshot --------------------------------------------------------------


def test_a_backlog_of_only_running_work_reports_pending_zero_and_backlog_one():
    clock = FakeClock()
    queue = make_queue(clock)
    arrive(queue, clock, work=(40.0, 4.0), context=60)
    assert queue.stats("A") == QueueStats(
        pending_count=0,
        pending_work=(0.0, 0.0),
        pending_context=0,
        backlog_count=1,
        backlog_work=(40.0, 4.0),
        lent_count=0,
    )


def test_an_unknown_model_has_empty_stats_of_the_lanes_arity():
    clock = FakeClock()
    assert make_queue(clock, lane="image").stats("Z") == QueueStats(0, (0.0,), 0, 0, (0.0,), 0, 0)


def test_sized_pending_excludes_entries_without_a_size_estimate():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    arrive(queue, clock, work=(1.0, 1.0), context=7)
    arrive(queue, clock, work=(100.0, 10.0), context=500)
    arrive(queue, clock)
    arrive(queue, clock, work=(5.0,), context=40)
    arrive(queue, clock, work=(300.0, 30.0), context=700)
    assert queue.sized_pending("A") == (2, (400.0, 40.0), 1200)
    stats = queue.stats("A")
    assert stats.pending_count == 4
    assert stats.pending_work == (400.0, 40.0)
    assert stats.pending_context == 1240
    assert stats.backlog_work == (401.0, 41.0)


def test_the_owners_cached_work_is_summed_beside_the_work_through_admission_and_leaving():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    first = arrive(queue, clock, work=(100.0, 10.0), cached=(60.0, 0.0))
    arrive(queue, clock, work=(200.0, 20.0), cached=(150.0, 0.0))
    arrive(queue, clock, work=(300.0, 30.0))
    # The first is admitted (depth 1); the other two wait.
    assert first.state is State.ADMITTED
    assert queue.sized_cached("A") == (150.0, 0.0)
    assert queue.stats("A").backlog_cached == (210.0, 0.0)
    queue.complete(first)
    # The second is admitted now: nothing cached waits, the admitted one still counts.
    assert queue.sized_cached("A") == (0.0, 0.0)
    assert queue.stats("A").backlog_cached == (150.0, 0.0)


def test_a_queue_with_nothing_cached_reports_no_cached_work():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    arrive(queue, clock, work=(100.0, 10.0))
    arrive(queue, clock, work=(200.0, 20.0))
    assert queue.stats("A").backlog_cached == ()


def test_image_work_is_summed_as_single_units():
    clock = FakeClock()
    queue = make_queue(clock, depth=1, lane="image")
    arrive(queue, clock, "img", work=(5.0,))
    arrive(queue, clock, "img", work=(7.0,))
    arrive(queue, clock, "img", work=(11.0,))
    assert queue.stats("img").pending_work == (18.0,)
    assert queue.stats("img").backlog_work == (23.0,)


def test_a_lane_of_unknown_arity_learns_it_from_the_first_sized_entry():
    clock = FakeClock()
    queue = make_queue(clock, depth=1, lane="audio")
    arrive(queue, clock, "s")
    arrive(queue, clock, "s", work=(3.0, 4.0, 5.0))
    arrive(queue, clock, "s", work=(1.0,))
    assert queue.sized_pending("s") == (1, (3.0, 4.0, 5.0), 0)


def test_the_snapshot_lists_queued_held_and_lent_entries_with_their_waits():
    clock = FakeClock()
    queue = make_queue(clock, hold=lambda entry, q, now: entry.model_id == "A")
    arrive(queue, clock, "A")
    clock.advance(1.0)
    held = arrive(queue, clock, "A")
    clock.advance(1.0)
    arrive(queue, clock, "A", pinned=True)
    clock.advance(1.0)
    lendable = arrive(queue, clock, "A")
    assert queue.withdraw(
        "A", 1, helper=("node-2", "A2"), fits=lambda entry: entry is lendable
    ) == [lendable]
    clock.advance(1.5)
    assert held.state is State.HELD
    rows = queue.snapshot(clock())
    base = {"lane": "text", "model_id": "A", "pinned": False, "returned": False, "key": None}
    assert rows == [
        {**base, "state": "held", "waiting_ms": 3500, "arrived_at": START_SECS + 1.0},
        {
            **base,
            "state": "queued",
            "waiting_ms": 2500,
            "arrived_at": START_SECS + 2.0,
            "pinned": True,
        },
        {
            **base,
            "state": "lent",
            "waiting_ms": 1500,
            "arrived_at": START_SECS + 3.0,
            "helper_node_id": "node-2",
            "helper_model_id": "A2",
        },
    ]


def test_the_snapshot_marks_a_returned_request_and_counts_its_wait_from_first_arrival():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    arrive(queue, clock)
    lent_one = arrive(queue, clock)
    queue.withdraw("A", 1)
    clock.advance(4.0)
    queue.lent_returned(lent_one)
    assert queue.snapshot(clock()) == [
        {
            "lane": "text",
            "model_id": "A",
            "state": "queued",
            "waiting_ms": 4000,
            "arrived_at": START_SECS,
            "pinned": False,
            "returned": True,
            "key": None,
        }
    ]


# ----- scale ------------------------------------------------------------------------------------


def test_many_cancellations_keep_order_and_do_not_leave_the_queue_holding_dead_references():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    first = arrive(queue, clock)
    entries = [arrive(queue, clock) for _ in range(5000)]
    for i, entry in enumerate(entries):
        if i % 10:
            queue.cancel(entry)
    survivors = entries[::10]
    assert queue.pending() == survivors
    assert len(queue._models["A"].lendable) <= 2 * len(survivors) + 64
    order = []
    current = first
    while True:
        admitted = queue.complete(current)
        if not admitted:
            break
        (current,) = admitted
        order.append(current)
    assert order == survivors
    assert len(queue) == 0


# ----- differential test against a naive reference ---------------------------------------------


class NaiveQueue:
    """The admission rules written as plainly as possible (O(n) scans everywhere)."""

    def __init__(self, lane: str, depth: int, clock: FakeClock) -> None:
        self.lane = lane
        self.depth = depth
        self.clock = clock
        self.hold: Callable[[Entry, Any, float], bool] | None = None
        self.live: list[Entry] = []
        self.admit_order: list[Entry] = []
        self.lent_order: list[Entry] = []
        self.held: list[Entry] = []
        self.seq = 0

    @staticmethod
    def key(entry: Entry) -> tuple[int, float, int]:
        if entry.returned:
            return (0, entry.arrived_at, entry.seq)
        return (2 if entry.borrowed else 1, 0.0, entry.seq)

    def pending(self, model_id: str | None = None) -> list[Entry]:
        waiting = [e for e in self.live if e.state in (State.QUEUED, State.HELD)]
        return sorted(
            (e for e in waiting if model_id is None or e.model_id == model_id), key=self.key
        )

    def admitted(self, model_id: str | None = None) -> list[Entry]:
        return [e for e in self.admit_order if model_id is None or e.model_id == model_id]

    def lent(self, model_id: str | None = None) -> list[Entry]:
        return [e for e in self.lent_order if model_id is None or e.model_id == model_id]

    def admit(self) -> list[Entry]:
        out: list[Entry] = []
        held_now: list[Entry] = []
        while len(self.admit_order) < self.depth:
            chosen = None
            natives_waiting = any(not e.borrowed for e in self.pending())
            for entry in self.pending():
                if entry.returned:
                    chosen = entry
                    break
                if entry.borrowed:
                    if not natives_waiting:
                        chosen = entry
                    break
                if any(h.model_id == entry.model_id for h in held_now):
                    continue
                running = [e for e in self.admit_order if e.model_id == entry.model_id]
                may_hold = (
                    self.hold is not None
                    and not entry.pinned
                    and running
                    and len(running) == len(self.admit_order)
                    and not any(e.borrowed for e in self.admit_order)
                )
                if may_hold and self.hold is not None and self.hold(entry, self, self.clock()):
                    entry.state = State.HELD
                    if entry.held_since is None:
                        entry.held_since = self.clock()
                    held_now.append(entry)
                    continue
                chosen = entry
                break
            if chosen is None:
                break
            chosen.state = State.ADMITTED
            chosen.admitted_at = self.clock()
            self.admit_order.append(chosen)
            out.append(chosen)
        for entry in self.held:
            if entry.state is State.HELD and entry not in held_now:
                entry.state = State.QUEUED
        self.held = held_now
        return out

    def enqueue(self, entry: Entry) -> list[Entry]:
        self.seq += 1
        entry.seq = self.seq
        if not entry.borrowed:
            entry.borrowed_ahead = sum(e.borrowed for e in self.admit_order)
        self.live.append(entry)
        return self.admit()

    def finish(self, entry: Entry) -> None:
        entry.state = State.DONE
        self.live.remove(entry)
        if entry in self.admit_order:
            self.admit_order.remove(entry)
        if entry in self.lent_order:
            self.lent_order.remove(entry)

    def complete(self, entry: Entry) -> list[Entry]:
        self.finish(entry)
        return self.admit()

    def cancel(self, entry: Entry) -> list[Entry]:
        self.finish(entry)
        return self.admit()

    def lent_finished(self, entry: Entry) -> list[Entry]:
        self.finish(entry)
        return self.admit()

    def lent_returned(self, entry: Entry) -> list[Entry]:
        self.lent_order.remove(entry)
        entry.state = State.QUEUED
        entry.returned = True
        entry.lent_at = None
        entry.helper = None
        return self.admit()

    def withdraw(self, model_id: str, count: int, fits: Callable[[Entry], bool]) -> list[Entry]:
        candidates = [
            e
            for e in self.pending(model_id)
            if not (e.pinned or e.borrowed or e.returned) and fits(e)
        ]
        # The entry held for the helper goes first, then the newest.
        taken = sorted(candidates, key=lambda e: (e.state is not State.HELD, -e.seq))[:count]
        for entry in taken:
            entry.state = State.LENT
            entry.lent_at = self.clock()
            self.lent_order.append(entry)
        return taken

    def return_pending_borrowed(self) -> list[Entry]:
        out = [e for e in self.pending() if e.borrowed]
        for entry in out:
            self.finish(entry)
        return out

    def set_depth(self, depth: int) -> list[Entry]:
        self.depth = depth
        return self.admit()

    def set_hold(self, hold: Callable[[Entry, Any, float], bool] | None) -> list[Entry]:
        self.hold = hold
        return self.admit()

    def stats(self, model_id: str) -> QueueStats:
        arity = {"text": 2, "image": 1}[self.lane]
        pending = [e for e in self.pending(model_id) if not e.borrowed]
        running = [e for e in self.admitted(model_id) if not e.borrowed]

        def total(entries: list[Entry]) -> tuple[float, ...]:
            sums = [0.0] * arity
            for entry in entries:
                if len(entry.work) == arity:
                    for i, value in enumerate(entry.work):
                        sums[i] += value
            return tuple(sums)

        return QueueStats(
            pending_count=len(pending),
            pending_work=total(pending),
            pending_context=sum(e.context for e in pending),
            backlog_count=len(pending) + len(running),
            backlog_work=total(pending + running),
            lent_count=len(self.lent(model_id)),
            lendable_count=sum(1 for e in pending if not e.pinned and not e.returned),
        )


def lending_hold(entry: Entry, queue: Any, now: float) -> bool:
    return (entry.seq + len(queue.lent(entry.model_id)) + int(now)) % 3 != 0


def fits_even(entry: Entry) -> bool:
    return entry.context % 2 == 0


def seqs(entries: list[Entry]) -> list[int]:
    return [e.seq for e in entries]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_operations_match_the_naive_reference(seed):
    rng = random.Random(seed)
    clock = FakeClock()
    real = make_queue(clock)
    naive = NaiveQueue("text", 2, clock)
    pairs: dict[int, tuple[Entry, Entry]] = {}
    models = ["A", "B", "C"]

    def live_pairs(*states: State) -> list[tuple[Entry, Entry]]:
        return [p for p in pairs.values() if p[0].state in states]

    for _ in range(1500):
        clock.advance(rng.choice([0.0, 0.5, 1.0]))
        op = rng.random()
        if op < 0.4:
            fields: dict[str, Any] = {
                "model_id": rng.choice(models),
                "arrived_at": clock(),
                "work": rng.choice([(), (float(rng.randint(1, 50)), 3.0), (2.0,)]),
                "context": rng.randint(0, 9),
                "pinned": rng.random() < 0.15,
                "borrowed": rng.random() < 0.15,
            }
            left, right = Entry(**fields), Entry(**fields)
            got, want = real.enqueue(left), naive.enqueue(right)
            pairs[left.seq] = (left, right)
        elif op < 0.55 and live_pairs(State.ADMITTED):
            left, right = rng.choice(live_pairs(State.ADMITTED))
            got, want = real.complete(left), naive.complete(right)
        elif op < 0.65 and live_pairs(State.QUEUED, State.HELD, State.ADMITTED, State.LENT):
            left, right = rng.choice(
                live_pairs(State.QUEUED, State.HELD, State.ADMITTED, State.LENT)
            )
            got, want = real.cancel(left), naive.cancel(right)
        elif op < 0.75:
            model, count = rng.choice(models), rng.randint(1, 3)
            got = real.withdraw(model, count, fits=fits_even)
            want = naive.withdraw(model, count, fits_even)
            assert seqs(got) == seqs(want)
            got, want = real.reevaluate(), naive.admit()
        elif op < 0.82 and live_pairs(State.LENT):
            left, right = rng.choice(live_pairs(State.LENT))
            if rng.random() < 0.5:
                got, want = real.lent_finished(left), naive.lent_finished(right)
            else:
                got, want = real.lent_returned(left), naive.lent_returned(right)
        elif op < 0.86:
            depth = rng.randint(1, 3)
            got, want = real.set_depth(depth), naive.set_depth(depth)
        elif op < 0.92:
            hold = lending_hold if rng.random() < 0.7 else None
            got, want = real.set_hold(hold), naive.set_hold(hold)
        elif op < 0.95:
            got, want = real.return_pending_borrowed(), naive.return_pending_borrowed()
        else:
            got, want = real.reevaluate(), naive.admit()
        assert seqs(got) == seqs(want)
        assert seqs(real.pending()) == seqs(naive.pending())
        assert [e.state for e in real.pending()] == [e.state for e in naive.pending()]
        assert seqs(real.admitted()) == seqs(naive.admitted())
        assert seqs(real.lent()) == seqs(naive.lent())
        assert len(real) == len(naive.live)
        for model in models:
            assert real.stats(model) == naive.stats(model)
            assert seqs(real.pending(model)) == seqs(naive.pending(model))
        for left, right in pairs.values():
            assert (left.state, left.held_since, left.borrowed_ahead, left.returned) == (
                right.state,
                right.held_since,
                right.borrowed_ahead,
                right.returned,
            )
    assert len(pairs) > 400


# ----- lending quality: which requests go where ---------------------------------------------


def test_withdraw_by_size_lends_the_largest_first_and_the_newest_among_equals(flow):
    _clock, queue, entries = flow
    # Sizes 300..1000 wait; the owner's price says the second term counts double here.
    sizes = {id(e): e.work[0] for e in entries}
    sizes[id(entries[4])] = 5000.0
    sizes[id(entries[6])] = 5000.0

    lent = queue.withdraw("A", 3, size=lambda e: sizes[id(e)])

    assert lent == [entries[6], entries[4], entries[9]]
    assert queue.pending() == [entries[2], entries[3], entries[5], entries[7], entries[8]]


def test_withdraw_by_size_still_takes_only_entries_that_fit(flow):
    _clock, queue, entries = flow

    lent = queue.withdraw("A", 2, size=lambda e: e.work[0], fits=lambda e: e.work[0] < 800.0)

    assert lent == [entries[6], entries[5]]


def test_a_finished_lent_entry_can_leave_admission_to_the_caller():
    clock = FakeClock()
    queue = make_queue(clock, depth=2)
    a1, _a2 = arrive(queue, clock), arrive(queue, clock)
    lent, held = arrive(queue, clock), arrive(queue, clock)
    assert queue.withdraw("A", 1) == [held]
    queue.complete(a1)  # lent is admitted in a1's place
    assert lent.state is State.ADMITTED
    spare = arrive(queue, clock)
    assert queue.withdraw("A", 1) == [spare]

    assert queue.lent_finished(held, admit=False) == []
    assert held.state is State.DONE
    assert queue.lent("A") == [spare]


def test_under_a_live_lease_streams_go_to_the_backend_before_lendable_requests():
    clock = FakeClock()
    leased = {"A"}
    queue = LaneQueue(
        "text", depth=1, clock=clock, unlendable_first=lambda model_id: model_id in leased
    )
    running = arrive(queue, clock)
    plain = arrive(queue, clock)
    stream = arrive(queue, clock, pinned=True)

    assert queue.complete(running) == [stream]
    assert queue.complete(stream) == [plain]


def test_without_a_lease_streams_keep_their_place_in_arrival_order():
    clock = FakeClock()
    queue = LaneQueue("text", depth=1, clock=clock, unlendable_first=lambda model_id: False)
    running = arrive(queue, clock)
    plain = arrive(queue, clock)
    stream = arrive(queue, clock, pinned=True)

    assert queue.complete(running) == [plain]
    assert queue.complete(plain) == [stream]


def test_one_borrowed_request_at_a_time_reaches_a_helpers_backend():
    clock = FakeClock()
    queue = LaneQueue("text", depth=2, clock=clock, borrowed_depth=1)
    x1, x2 = (arrive(queue, clock, "H", borrowed=True) for _ in range(2))

    assert queue.admitted() == [x1]
    assert x2.state is State.QUEUED
    # The helper's own request goes straight into the free backend slot, and the borrowed
    # one still waiting can be handed back.
    own = arrive(queue, clock, "H")
    assert queue.admitted() == [x1, own]
    assert queue.return_pending_borrowed() == [x2]
    assert queue.complete(x1) == []


def test_the_next_borrowed_request_goes_in_when_the_one_inside_finishes():
    clock = FakeClock()
    queue = LaneQueue("text", depth=2, clock=clock, borrowed_depth=1)
    x1, x2 = (arrive(queue, clock, "H", borrowed=True) for _ in range(2))

    assert queue.complete(x1) == [x2]


def test_a_borrowed_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="borrowed_depth"):
        LaneQueue("text", depth=2, clock=FakeClock(), borrowed_depth=0)


def test_streams_and_returned_requests_are_not_lendable_in_the_stats():
    clock = FakeClock()
    queue = make_queue(clock, depth=1)
    arrive(queue, clock)
    arrive(queue, clock, pinned=True)
    out = arrive(queue, clock)
    plain = arrive(queue, clock)
    assert queue.withdraw("A", 1) == [plain]
    queue.lent_returned(plain)
    assert queue.stats("A").lendable_count == 1  # `out` only
    assert queue.withdraw("A", 1) == [out]
    assert queue.stats("A").lendable_count == 0
    assert queue.stats("A").pending_count == 2


def test_the_request_held_for_the_helper_is_the_one_lent_to_it():
    clock = FakeClock()
    queue = make_queue(clock, hold=always_hold)
    arrive(queue, clock)
    held = arrive(queue, clock)
    newer = [arrive(queue, clock) for _ in range(3)]
    assert held.state is State.HELD

    assert queue.withdraw("A", 2) == [held, newer[2]]
    assert queue.pending() == newer[:2]


def test_a_held_request_the_helper_cannot_take_is_passed_over():
    clock = FakeClock()
    queue = make_queue(clock, hold=always_hold)
    arrive(queue, clock)
    held = arrive(queue, clock, context=9000)
    newer = arrive(queue, clock, context=10)

    assert queue.withdraw("A", 1, fits=lambda e: e.context < 4096) == [newer]
    assert held.state is State.HELD
