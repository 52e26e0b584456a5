"""Weighted fair share in the router queue: exact admission orders on the fake clock.

Each test drives a fair `LaneQueue` (or the `FairShare` core) the way the router does and
pins the order in which requests reach the backend. Flipping the start-tag comparison, the
tie-break, or the weight (cost * weight for cost / weight) reorders these lists.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from lending.fairshare import FairShare, clean_cost, clean_weight
from lending.queue import Entry, LaneQueue, State
from lending.tests.test_queue import FakeClock


def fair_queue(clock: FakeClock, depth: int = 1) -> LaneQueue:
    return LaneQueue("text", depth=depth, clock=clock, fair=True)


def arrive(queue: LaneQueue, clock: FakeClock, tenant: str, **fields: Any) -> Entry:
    entry = Entry("M", clock(), tenant=tenant, request_id=f"{tenant}{queue_len(queue)}", **fields)
    queue.enqueue(entry)
    return entry


def queue_len(queue: LaneQueue) -> int:
    return len(queue.pending()) + len(queue.admitted()) + 1


def drain(queue: LaneQueue, clock: FakeClock, job_secs: float = 0.1) -> list[str]:
    """Run the queue dry one job at a time; the tenants in the order they were admitted."""
    order: list[str] = []
    running = queue.admitted()
    while running:
        entry = running[0]
        order.append(entry.tenant)
        clock.advance(job_secs)
        queue.complete(entry)
        running = queue.admitted()
    return order


def test_a_trickle_goes_ahead_of_a_flood_at_the_next_free_slot() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    flood = [arrive(queue, clock, "A", cost=100.0) for _ in range(10)]
    assert queue.admitted() == [flood[0]]
    clock.advance(0.05)
    late = arrive(queue, clock, "B", cost=100.0)
    # A's head is tagged at A's finish (100); B starts at virtual time 0.
    assert queue.complete(flood[0]) == [late]
    assert drain(queue, clock) == ["B"] + ["A"] * 9


def test_without_fair_share_the_same_trickle_waits_behind_the_whole_flood() -> None:
    clock = FakeClock()
    queue = LaneQueue("text", depth=1, clock=clock)
    flood = [arrive(queue, clock, "A", cost=100.0) for _ in range(10)]
    arrive(queue, clock, "B", cost=100.0)
    queue.complete(flood[0])
    assert drain(queue, clock) == ["A"] * 9 + ["B"]


def test_weights_three_to_one_admit_three_of_a_for_each_of_b() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    for _ in range(12):
        arrive(queue, clock, "A", cost=3.0, weight=3.0)
    for _ in range(12):
        arrive(queue, clock, "B", cost=3.0, weight=1.0)
    # A advances 1 a job, B 3: on equal tags the earlier arrival (A) goes first.
    assert drain(queue, clock)[:16] == list("ABAAABAAABAAABAA")


def test_cost_counts_a_long_request_of_b_as_three_short_ones() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    for _ in range(6):
        arrive(queue, clock, "A", cost=100.0)
    for _ in range(6):
        arrive(queue, clock, "B", cost=300.0)
    assert drain(queue, clock)[:8] == list("ABAAABAA")


def test_a_key_keeps_its_own_order_whatever_the_sizes() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    sizes = [500.0, 1.0, 300.0, 2.0]
    entries = [arrive(queue, clock, "A", cost=size) for size in sizes]
    arrive(queue, clock, "B", cost=1.0)
    admitted: list[Entry] = []
    while queue.admitted():
        entry = queue.admitted()[0]
        admitted.append(entry)
        queue.complete(entry)
    assert [e for e in admitted if e.tenant == "A"] == entries


def test_requests_without_a_key_are_one_tenant_of_their_own() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    for _ in range(4):
        arrive(queue, clock, "", cost=1.0)
    for _ in range(2):
        arrive(queue, clock, "A", cost=1.0)
    assert drain(queue, clock) == ["", "A", "", "A", "", ""]


def test_a_cancelled_request_frees_its_place_and_costs_its_key_nothing() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    flood = [arrive(queue, clock, "A", cost=100.0) for _ in range(4)]
    gone = arrive(queue, clock, "B", cost=100.0)
    kept = arrive(queue, clock, "B", cost=100.0)
    assert queue.cancel(gone) == []
    assert gone.state is State.DONE
    # B's next request inherits the place (start tag 0), not a tag behind the gone one.
    assert queue.complete(flood[0]) == [kept]


def test_past_use_counts_for_one_request_at_most() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    for _ in range(5):
        arrive(queue, clock, "A", cost=10.0)
    assert drain(queue, clock) == ["A"] * 5
    # A used 50 while alone; only its last request (10) still counts against it: B, which
    # arrives behind two of A's, goes second.
    first = arrive(queue, clock, "A", cost=10.0)
    arrive(queue, clock, "A", cost=10.0)
    arrive(queue, clock, "B", cost=10.0)
    assert queue.admitted() == [first]
    assert drain(queue, clock) == ["A", "B", "A"]


def test_each_request_goes_to_the_backend_up_to_its_own_parallel() -> None:
    clock = FakeClock()
    queue = fair_queue(clock, depth=1)
    two = [arrive(queue, clock, "A", cost=1.0, depth=2) for _ in range(3)]
    assert queue.admitted() == two[:2]
    assert [e.state for e in two] == [State.ADMITTED, State.ADMITTED, State.QUEUED]
    queue.complete(two[0])
    assert queue.admitted() == two[1:]


def test_a_head_that_may_not_go_yet_stops_admission_instead_of_being_passed() -> None:
    clock = FakeClock()
    queue = fair_queue(clock, depth=1)
    wide = arrive(queue, clock, "A", cost=1.0, depth=2)
    narrow = arrive(queue, clock, "B", cost=1.0, depth=1)
    later = arrive(queue, clock, "A", cost=1.0, depth=2)
    # B is next by share but its backend takes one at a time: A's next does not jump it.
    assert queue.admitted() == [wide]
    assert narrow.state is State.QUEUED and later.state is State.QUEUED
    # Then B goes, and A's next joins it: its backend takes two.
    assert queue.complete(wide) == [narrow, later]


def test_borrowed_requests_compete_by_their_owners_keys_after_the_helpers_own() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    own = arrive(queue, clock, "H", cost=1.0)
    for _ in range(3):
        arrive(queue, clock, "X", cost=1.0, borrowed=True)
    arrive(queue, clock, "Y", cost=1.0, borrowed=True)
    native = arrive(queue, clock, "H", cost=1.0)
    assert queue.complete(own) == [native]
    assert drain(queue, clock) == ["H", "X", "Y", "X", "X"]


def test_lent_requests_leave_the_fair_order_and_cost_nothing() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    first = arrive(queue, clock, "A", cost=1.0)
    a_rest = [arrive(queue, clock, "A", cost=1.0, work=(10.0, 10.0)) for _ in range(2)]
    b = arrive(queue, clock, "B", cost=1.0, work=(10.0, 10.0))
    lent = queue.withdraw("M", 1, helper=("n2", "M"))
    assert lent == [b]
    assert queue.complete(first) == [a_rest[0]]
    assert drain(queue, clock) == ["A", "A"]


def test_the_snapshot_names_each_waiting_requests_key() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    arrive(queue, clock, "A", cost=1.0)
    arrive(queue, clock, "A", cost=1.0)
    arrive(queue, clock, "", cost=1.0)
    assert [row["key"] for row in queue.snapshot(clock())] == ["A", None]


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "3", True, None])
def test_a_weight_or_cost_that_is_no_positive_number_counts_as_one(value: object) -> None:
    assert clean_weight(value) == 1.0
    assert clean_cost(value, 1.0) == 1.0
    clock = FakeClock()
    queue = fair_queue(clock)
    bad = Entry("M", clock(), tenant="A", weight=value, cost=value)  # type: ignore[arg-type]
    queue.enqueue(bad)
    queue.enqueue(Entry("M", clock(), tenant="A"))
    assert drain(queue, clock) == ["A", "A"]


def test_random_traffic_admits_every_live_request_once_in_key_order() -> None:
    rng = random.Random(7)
    clock = FakeClock()
    queue = fair_queue(clock, depth=2)
    tenants = [f"k{i}" for i in range(20)]
    arrived: dict[str, list[Entry]] = {t: [] for t in tenants}
    admitted: list[Entry] = []
    cancelled: set[int] = set()
    for _ in range(3000):
        roll = rng.random()
        if roll < 0.5:
            tenant = rng.choice(tenants)
            entry = Entry("M", clock(), tenant=tenant, cost=rng.choice([1.0, 5.0]))
            arrived[tenant].append(entry)
            admitted.extend(queue.enqueue(entry))
        elif roll < 0.6 and queue.pending():
            victim = rng.choice(queue.pending())
            cancelled.add(id(victim))
            admitted.extend(queue.cancel(victim))
        elif queue.admitted():
            admitted.extend(queue.complete(queue.admitted()[0]))
        clock.advance(0.01)
    while queue.admitted():
        admitted.extend(queue.complete(queue.admitted()[0]))
    assert not queue.pending()
    ids = [id(e) for e in admitted]
    assert len(ids) == len(set(ids))
    assert not cancelled & set(ids)
    for tenant in tenants:
        # Admitted entries include the ones enqueue admitted at once (not in `admitted`).
        kept = [e for e in arrived[tenant] if id(e) not in cancelled]
        assert [e for e in kept if e.state is State.DONE] == kept
        order = [e for e in admitted if e.tenant == tenant]
        assert order == sorted(order, key=lambda e: e.seq)


def test_the_core_with_many_keys_picks_the_smallest_start_tag() -> None:
    fair: FairShare[Entry] = FairShare(lambda e: e.state is State.QUEUED)
    entries = []
    for i in range(1000):
        entry = Entry("M", 0.0, tenant=f"k{i}", cost=float(i + 1), seq=i + 1)
        fair.push(entry)
        entries.append(entry)
    # All start at 0: arrival order breaks the tie; each then moves by its own cost.
    for expected in entries[:3]:
        head = fair.head()
        assert head is expected
        fair.admitted(expected)
        expected.state = State.ADMITTED
    assert fair.finish_tag("k2") == 3.0
    assert fair.start_tag("k3") == 0.0
    assert fair.waiting()["k999"] == 1
    assert len(fair) == 997


# ----- lending keeps its rules ------------------------------------------------------------------


def test_a_request_back_from_a_helper_goes_first_whatever_its_keys_share() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    running = arrive(queue, clock, "A", cost=1.0)
    lent_one = arrive(queue, clock, "A", cost=1.0, work=(1.0, 1.0))
    other = arrive(queue, clock, "B", cost=1.0, work=(1.0, 1.0))
    assert queue.withdraw("M", 1, helper=("n2", "M"), size=lambda e: e.tenant == "A") == [lent_one]
    queue.lent_returned(lent_one)
    # B is next by share, but the returned request keeps the head of the queue.
    assert queue.complete(running) == [lent_one]
    assert queue.complete(lent_one) == [other]


def test_lending_still_takes_the_largest_waiting_requests_whatever_their_keys() -> None:
    clock = FakeClock()
    queue = fair_queue(clock)
    arrive(queue, clock, "A", cost=1.0)
    small = arrive(queue, clock, "A", cost=1.0, work=(10.0, 1.0))
    big = arrive(queue, clock, "B", cost=1.0, work=(900.0, 1.0))
    mid = arrive(queue, clock, "C", cost=1.0, work=(500.0, 1.0))
    taken = queue.withdraw("M", 2, helper=("n2", "M"), size=lambda e: e.work[0])
    assert taken == [big, mid]
    assert queue.pending() == [small]


def test_a_request_held_for_a_helper_blocks_only_its_own_model() -> None:
    clock = FakeClock()

    def hold_x(entry: Entry, queue: LaneQueue, now: float) -> bool:
        return entry.model_id == "X"

    queue = LaneQueue("text", depth=2, clock=clock, fair=True, hold=hold_x)
    earlier = Entry("Y", clock(), tenant="B", cost=5.0)
    queue.enqueue(earlier)
    running = Entry("X", clock(), tenant="A", cost=1.0)
    queue.enqueue(running)
    queue.complete(earlier)
    held = Entry("X", clock(), tenant="A", cost=1.0)  # start tag 1
    queue.enqueue(held)
    assert held.state is State.HELD
    other = Entry("Y", clock(), tenant="B", cost=1.0)  # start tag 5: behind the held one
    # The held request is next by share, but it blocks only model X: Y takes the free slot.
    assert queue.enqueue(other) == [other]
    assert held.state is State.HELD
