"""The hold-for-faster-helper predicate with exact numbers (fake clock, no I/O)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from lending.hold import HoldPolicy
from lending.planner import Lease
from lending.queue import Entry, LaneQueue
from lending.tests.factories import LeaseFactory


class FakeLog:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def record(self, **fields: Any) -> None:
        self.rows.append(fields)


def lease(**overrides: Any) -> Lease:
    return LeaseFactory.build(**overrides)


class FakeOwner:
    """The owner's live lease, and the requests the hold asked it to lend at once."""

    def __init__(self, live: Lease | None) -> None:
        self.lease = live
        self.lend_held_calls: list[tuple[str, str]] = []

    def live(self, lane: str, model: str) -> Lease | None:
        return self.lease

    def lend_held(self, lane: str, entry: Entry) -> None:
        self.lend_held_calls.append((lane, entry.model_id))


def lent_at_once(policy: HoldPolicy) -> list[tuple[str, str]]:
    """What the hold asked the (fake) owner to lend at once."""
    owner = policy.node.owner
    assert isinstance(owner, FakeOwner)
    return owner.lend_held_calls


def setup(
    live: Lease | None, *, hold_setting: bool = True, costs: Any = None
) -> tuple[HoldPolicy, LaneQueue, list[float], FakeLog]:
    now = [0.0]
    log = FakeLog()
    queue: LaneQueue
    lending = SimpleNamespace(
        settings=SimpleNamespace(hold_for_faster_helper=hold_setting),
        last_completion_ms={},
        costs=costs,
        queue=lambda lane: queue,
        queues={},
    )
    node = SimpleNamespace(
        lending=lending,
        owner=FakeOwner(live),
        decisions=log,
        node_id="o",
    )
    policy = HoldPolicy(node, "text")
    queue = LaneQueue("text", depth=2, clock=lambda: now[0], hold=policy, on_held=policy.on_held)
    lending.queues["text"] = queue
    return policy, queue, now, log


def busy_pipe(queue: LaneQueue, hold: HoldPolicy) -> Entry:
    """Two admitted jobs of model a, one more lent (the one lent slot busy), one slot freed;
    built with the hold off (with a lent slot free it would send the second to the helper)."""
    queue.set_hold(None)
    queue.enqueue(Entry("a", 0.0))
    second = Entry("a", 0.0)
    queue.enqueue(second)
    lent = Entry("a", 0.0)
    queue.enqueue(lent)
    assert queue.withdraw("a", 1, helper=("h", "b")) == [lent]
    queue.complete(second)  # the owner's first job (admitted at t=0, 1000 ms) still runs
    queue.set_hold(hold)
    return lent


async def test_it_holds_the_second_slot_when_the_busy_helper_finishes_sooner() -> None:
    policy, queue, now, log = setup(lease())
    busy_pipe(queue, policy)
    now[0] = 0.1
    candidate = Entry("a", 0.05)
    queue.enqueue(candidate)
    # owner: running job done at 1000 ms, this one at 2000; helper: 200 + 200 = 400 ms
    assert candidate.state.value == "held"
    assert policy(candidate, queue, 0.1) is True
    row = log.rows[0]
    assert row["outcome"] == "held_for_helper" and row["reason"] == "helper_finishes_sooner"
    assert row["keep_ms"] == pytest.approx(1900.0)
    assert (row["wait_ms"], row["slots"], row["lent_out"]) == (50, 1, 1)
    policy.forget(candidate)


def test_it_never_holds_for_a_probe_or_unmeasured_lease_or_when_switched_off() -> None:
    for live, setting in (
        (lease(probe=True), True),
        (lease(helper_service_ms=None), True),
        (lease(), False),
        (None, True),
    ):
        policy, queue, _now, _ = setup(live, hold_setting=setting)
        busy_pipe(queue, policy)
        candidate = Entry("a", 0.05)
        queue.enqueue(candidate)
        assert candidate.state.value == "admitted"


async def test_with_a_lent_slot_free_the_second_slots_request_goes_to_the_faster_helper() -> None:
    # One of two lent slots busy: the owner finishes this at 2000 ms, the helper at 400.
    policy, queue, now, log = setup(lease(helper_slots=2))
    busy_pipe(queue, policy)
    now[0] = 0.1
    candidate = Entry("a", 0.05)

    queue.enqueue(candidate)

    assert candidate.state.value == "held"
    await asyncio.sleep(0)  # the lend is asked for once the admission pass is over
    assert lent_at_once(policy) == [("text", "a")]
    # Not a wait for the helper: the `lent` row tells it, no `held_for_helper` row.
    assert log.rows == []
    policy.forget(candidate)


@pytest.mark.parametrize(("owner_job_ms", "state"), [(150.0, "admitted"), (151.0, "held")])
async def test_with_a_lent_slot_free_the_owner_keeps_what_it_finishes_first(
    owner_job_ms: float, state: str
) -> None:
    # Nothing lent, the owner's job admitted at t=0; asked at t=0.1. Owner: 0 + job + job;
    # helper: 100 + 200 = 300 ms, strictly sooner only from a 151 ms job on.
    policy, queue, now, _ = setup(lease(helper_slots=2, owner_job_ms=owner_job_ms))
    queue.set_hold(None)
    queue.enqueue(Entry("a", 0.0))
    queue.set_hold(policy)
    now[0] = 0.1
    candidate = Entry("a", 0.1)

    queue.enqueue(candidate)

    assert candidate.state.value == state
    await asyncio.sleep(0)
    assert lent_at_once(policy) == ([("text", "a")] if state == "held" else [])
    policy.forget(candidate)


def test_a_slower_helper_is_not_waited_for() -> None:
    policy, queue, _, _ = setup(lease(helper_service_ms=3000.0))
    busy_pipe(queue, policy)
    candidate = Entry("a", 0.05)
    queue.enqueue(candidate)
    assert candidate.state.value == "admitted"


async def test_a_held_request_is_released_past_the_predicted_finish_plus_one_job() -> None:
    policy, queue, now, _ = setup(lease())
    busy_pipe(queue, policy)
    now[0] = 0.1
    candidate = Entry("a", 0.05)
    queue.enqueue(candidate)
    assert candidate.state.value == "held"
    # helper predicted at 400 ms (+200 ms one job) → released once past 600 ms
    now[0] = 0.5
    queue.reevaluate()
    assert candidate.state.value == "held"
    now[0] = 0.61
    assert queue.reevaluate() == [candidate]
    assert candidate.state.value == "admitted"
    policy.forget(candidate)


def pipe_with_a_late_lent_job(queue: LaneQueue, now: list[float], hold: HoldPolicy) -> None:
    """The owner's job runs since t=0 (1000 ms); the helper got a job at t=0.85 (500 ms)."""
    queue.set_hold(None)
    queue.enqueue(Entry("a", 0.0))
    second = Entry("a", 0.0)
    queue.enqueue(second)
    lent = Entry("a", 0.0)
    queue.enqueue(lent)
    now[0] = 0.85
    assert queue.withdraw("a", 1, helper=("h", "b")) == [lent]
    queue.complete(second)
    queue.set_hold(hold)
    now[0] = 0.9


@pytest.mark.parametrize(
    ("output_tokens", "with_fit", "state"),
    [
        # Priced as the mean (1000 ms owner, 500 ms helper): owner 2000 ms, helper 1850 ms.
        (1.0, False, "held"),
        # Its own price is 100 ms (50 ms on the helper): owner 1100 ms, helper 1400 ms.
        (1.0, True, "admitted"),
        # 3000 ms here, 1500 ms there: owner 4000 ms, helper 2850 ms.
        (30.0, True, "held"),
    ],
)
async def test_the_hold_weighs_this_requests_price_not_the_means(
    output_tokens: float, with_fit: bool, state: str
) -> None:
    from analytics.fitting import CostFit

    fit = CostFit(base_ms=0.0, slopes_ms=(0.0, 100.0), samples=5)
    costs = SimpleNamespace(models={("a", "llm"): fit}) if with_fit else None
    policy, queue, now, _ = setup(lease(owner_job_ms=1000.0, helper_service_ms=500.0), costs=costs)
    pipe_with_a_late_lent_job(queue, now, policy)
    candidate = Entry("a", 0.9, work=(10.0, output_tokens))

    queue.enqueue(candidate)

    assert candidate.state.value == state
    policy.forget(candidate)


async def test_slots_busy_with_another_helper_leave_this_leases_slot_free() -> None:
    # The lease moved to helper c; the request still out with b does not fill c's slot, so
    # the request goes to c at once.
    policy, queue, _, log = setup(lease(helper_node_id="c", helper_model_id="d"))
    busy_pipe(queue, policy)
    candidate = Entry("a", 0.05)

    queue.enqueue(candidate)

    await asyncio.sleep(0)
    assert lent_at_once(policy) == [("text", "a")]
    assert log.rows == []
    policy.forget(candidate)


@pytest.mark.parametrize(("service_ms", "holds"), [(1249.0, True), (1250.0, False)])
def test_the_owner_is_timed_from_its_oldest_admitted_job(service_ms: float, holds: bool) -> None:
    # Admitted at t=0 and t=0.5, one lent at t=0.5; asked at t=0.6. The backend has been
    # busy since t=0: the owner finishes this job at max(0 + 1000, 600) + 1000 + 1000 = 3000
    # ms (timed from the newer start, 3500). The helper: 500 + 2 x service.
    policy, queue, now, _ = setup(lease(helper_service_ms=service_ms))
    queue.set_hold(None)
    queue.enqueue(Entry("a", 0.0))
    now[0] = 0.5
    queue.enqueue(Entry("a", 0.5))
    queue.enqueue(Entry("a", 0.5))
    assert len(queue.withdraw("a", 1, helper=("h", "b"))) == 1
    assert sorted(e.admitted_at or 0.0 for e in queue.admitted("a")) == [0.0, 0.5]
    now[0] = 0.6

    assert policy(Entry("a", 0.6), queue, 0.6) is holds


@pytest.mark.parametrize(("cached", "state"), [((), "held"), ((90.0, 0.0), "admitted")])
async def test_a_prompt_the_owner_has_cached_is_priced_without_it_and_stays_home(
    cached: tuple[float, ...], state: str
) -> None:
    from analytics.fitting import CostFit

    # 10 ms a prompt token. The owner's job (200 ms) runs since t=0; asked at t=0.1 with a
    # lent slot free. 100 prompt tokens: the helper 100 + 100 x 1000 / 200 = 600 ms; the
    # owner 200 + 1000 = 1200 ms, or 200 + 100 = 300 ms with 90 of them in its cache.
    fit = CostFit(base_ms=0.0, slopes_ms=(10.0, 0.0), samples=5)
    costs = SimpleNamespace(models={("a", "llm"): fit})
    policy, queue, now, _ = setup(
        lease(helper_slots=2, owner_job_ms=200.0, helper_service_ms=100.0), costs=costs
    )
    queue.set_hold(None)
    queue.enqueue(Entry("a", 0.0))
    queue.set_hold(policy)
    now[0] = 0.1
    candidate = Entry("a", 0.1, work=(100.0, 0.0), cached=cached)

    queue.enqueue(candidate)

    assert candidate.state.value == state
    await asyncio.sleep(0)
    policy.forget(candidate)
