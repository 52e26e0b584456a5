"""The owner's refill of a finished lent slot, with exact numbers on a fake clock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from lending.owner import LiveLease, OwnerLending
from lending.planner import Lease
from lending.queue import Entry, LaneQueue, State


class FakeLog:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def record(self, **fields: Any) -> None:
        self.rows.append(fields)


def make(
    *, owner_job_ms: float, service_ms: float, probe: bool = False, costs: Any = None
) -> tuple[OwnerLending, LaneQueue, list[float], FakeLog]:
    now = [0.0]
    queue = LaneQueue("text", depth=2, clock=lambda: now[0])
    log = FakeLog()
    lending = SimpleNamespace(
        clock=lambda: now[0],
        queues={"text": queue},
        queue=lambda lane: queue,
        last_completion_ms={},
        costs=costs,
        is_owner=lambda lane, model: True,
    )
    node = SimpleNamespace(
        lending=lending,
        decisions=log,
        node_id="o",
        cluster=SimpleNamespace(by_public_id={}),
    )
    owner = OwnerLending(node)
    lease = Lease(
        lane="text",
        owner_node_id="o",
        owner_model_id="a",
        helper_node_id="h",
        helper_model_id="b",
        load_helper_model=True,
        restore_helper_model=False,
        helper_slots=1,
        probe=probe,
        ttl_ms=30_000,
        owner_job_ms=owner_job_ms,
        helper_switch_ms=0.0,
        helper_service_ms=service_ms,
    )
    owner.leases[("text", "a")] = LiveLease(lease, expires_at=1_000.0)
    return owner, queue, now, log


def backlog(queue: LaneQueue, held: int) -> Entry:
    """Two admitted at t=0, ``held`` waiting, and one more lent to the helper at t=0."""
    for _ in range(2 + held + 1):
        queue.enqueue(Entry("a", 0.0))
    (lent,) = queue.withdraw("a", 1, helper=("h", "b"))
    return lent


def refilled(log: FakeLog) -> list[dict[str, Any]]:
    return [r for r in log.rows if r["outcome"] == "lent" and r["reason"] == "refilled"]


def test_a_finished_lent_slot_goes_to_the_next_held_request_at_once() -> None:
    owner, queue, now, log = make(owner_job_ms=1000.0, service_ms=250.0)
    lent = backlog(queue, held=3)
    now[0] = 0.25
    queue.lent_finished(lent, admit=False)

    owner.refill("text", "a")

    # Owner alone: 1000 + 1000 + 3 x 1000 = 5000 ms; the helper hands one back at 500 ms.
    (row,) = refilled(log)
    assert (row["helper_node_id"], row["slots"], row["lent_out"]) == ("h", 1, 1)
    assert len(queue.lent("a")) == 1
    assert [e.state for e in queue.pending("a")] == [State.QUEUED, State.QUEUED]


def test_the_tail_of_a_backlog_stays_with_an_owner_that_finishes_no_later() -> None:
    # A slower helper: at t=0.4 the owner finishes its two admitted jobs and the last held
    # one at 400 + 200 + 200 = 800 ms; the helper would too (400 + 400). Not sooner: kept.
    owner, queue, now, log = make(owner_job_ms=200.0, service_ms=400.0)
    lent = backlog(queue, held=1)
    now[0] = 0.4
    queue.lent_finished(lent, admit=False)

    owner.refill("text", "a")

    assert refilled(log) == []
    assert queue.lent("a") == []


def test_one_millisecond_sooner_is_enough_to_refill() -> None:
    owner, queue, now, log = make(owner_job_ms=200.0, service_ms=399.0)
    lent = backlog(queue, held=1)
    now[0] = 0.4
    queue.lent_finished(lent, admit=False)

    owner.refill("text", "a")

    assert len(refilled(log)) == 1


def test_a_probe_lease_is_never_refilled() -> None:
    owner, queue, now, log = make(owner_job_ms=1000.0, service_ms=250.0, probe=True)
    lent = backlog(queue, held=3)
    now[0] = 0.25
    queue.lent_finished(lent, admit=False)

    owner.refill("text", "a")

    assert refilled(log) == []


@pytest.mark.parametrize(("service_ms", "refills"), [(500.0, True), (700.0, False)])
def test_with_nothing_of_its_own_admitted_the_owner_drains_the_held_requests_one_by_one(
    service_ms: float, refills: bool
) -> None:
    # Another model fills both backend slots; model a has two held and one lent.
    owner, queue, now, log = make(owner_job_ms=300.0, service_ms=service_ms)
    queue.enqueue(Entry("x", 0.0))
    queue.enqueue(Entry("x", 0.0))
    for _ in range(3):
        queue.enqueue(Entry("a", 0.0))
    (lent,) = queue.withdraw("a", 1, helper=("h", "b"))
    now[0] = 0.5
    queue.lent_finished(lent, admit=False)

    owner.refill("text", "a")

    # Owner: 500 + 2 x 300 = 1100 ms; helper: 500 + 500 (or 700).
    assert (len(refilled(log)) == 1) is refills


@pytest.mark.parametrize(("service_ms", "refills"), [(799.0, True), (800.0, False)])
def test_the_owner_is_timed_from_its_oldest_admitted_job(service_ms: float, refills: bool) -> None:
    # Admitted at t=0 and at t=0.3, one held, one lent at t=0.3 and back at t=0.6. The
    # backend has been busy since t=0: the owner finishes at max(0 + 400, 600) + 400 + 400
    # = 1400 ms (timed from the newer start it would be 1500). The helper: 600 + service.
    owner, queue, now, log = make(owner_job_ms=400.0, service_ms=service_ms)
    queue.enqueue(Entry("a", 0.0))
    now[0] = 0.3
    for _ in range(3):
        queue.enqueue(Entry("a", 0.3))
    assert sorted(e.admitted_at or 0.0 for e in queue.admitted("a")) == [0.0, 0.3]
    (lent,) = queue.withdraw("a", 1, helper=("h", "b"))
    now[0] = 0.6
    queue.lent_finished(lent, admit=False)

    owner.refill("text", "a")

    assert (len(refilled(log)) == 1) is refills


def heard(owner: OwnerLending) -> list[tuple[str, str, str]]:
    """What the owner reports to the master from now on (lane, model, trigger)."""
    reports: list[tuple[str, str, str]] = []

    def report(lane: str, model_id: str, trigger: str) -> None:
        reports.append((lane, model_id, trigger))

    owner.report = report  # type: ignore[method-assign]
    owner.node.owner = owner  # type: ignore[misc]
    return reports


def test_a_request_held_while_a_lent_slot_stands_free_is_lent_at_once() -> None:
    # The helper's last lent job finished when nothing was held, so its slot stayed free; a
    # new request that has to wait goes into it now, and the master still hears of it.
    from lending.flow import report_enqueued

    owner, queue, now, log = make(owner_job_ms=1000.0, service_ms=250.0)
    lent = backlog(queue, held=0)
    now[0] = 0.25
    queue.lent_finished(lent, admit=False)
    owner.refill("text", "a")
    assert refilled(log) == []
    reports = heard(owner)
    entry = Entry("a", 0.25)
    queue.enqueue(entry)

    report_enqueued(owner.node, "text", entry)

    (row,) = refilled(log)
    assert (row["helper_node_id"], row["lent_out"]) == ("h", 1)
    assert queue.lent("a") == [entry]
    assert reports == [("text", "a", "enqueued")]


def test_a_request_admitted_on_arrival_is_neither_lent_nor_reported() -> None:
    from lending.flow import report_enqueued

    owner, queue, _, log = make(owner_job_ms=1000.0, service_ms=250.0)
    reports = heard(owner)
    entry = Entry("a", 0.0)
    queue.enqueue(entry)

    report_enqueued(owner.node, "text", entry)

    assert entry.state is State.ADMITTED
    assert (refilled(log), reports) == ([], [])


@pytest.mark.parametrize(("cached", "refills"), [((), True), ((90.0, 0.0), False)])
def test_each_held_request_is_priced_as_itself_so_a_cached_one_stays_home(
    cached: tuple[float, ...], refills: bool
) -> None:
    from analytics.fitting import CostFit

    # A lease priced on 1000 ms requests (the helper 1200 ms), now over requests of 100
    # prompt tokens at 10 ms a token. One admitted at t=0 (1000 ms), one held, one lent and
    # back at t=0.1. Owner: 1000 + 1000 = 2000 ms, or 1000 + 100 = 1100 ms with 90 of the
    # tokens in its cache; helper: 100 + 1200 = 1300 ms.
    fit = CostFit(base_ms=0.0, slopes_ms=(10.0, 0.0), samples=5)
    owner, queue, now, log = make(
        owner_job_ms=1000.0, service_ms=1200.0, costs=SimpleNamespace(models={("a", "llm"): fit})
    )
    work = (100.0, 0.0)
    queue.enqueue(Entry("a", 0.0, work=work))
    queue.set_depth(1)  # one backend slot, so the next two wait
    queue.enqueue(Entry("a", 0.0, work=work, cached=cached))
    queue.enqueue(Entry("a", 0.0, work=work))
    (lent,) = queue.withdraw("a", 1, helper=("h", "b"))
    now[0] = 0.1
    queue.lent_finished(lent, admit=False)

    owner.refill("text", "a")

    assert (len(refilled(log)) == 1) is refills
