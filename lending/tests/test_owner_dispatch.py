"""The owner's dispatch rules and event coalescing, on a fake clock.

`apply` installs (or clears, or refuses) the master's answer; `lend` hands held requests to the
leased helper; `report` sends queue events to the master, one in flight per (lane, model) and
one queued behind it, the latest trigger winning.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from analytics.fitting import CostFit
from lending.owner import OwnerLending
from lending.planner import Lease
from lending.queue import Entry, LaneQueue, State
from lending.runtime import Lending

START_SECS = 100.0
WAIT_SECS = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = START_SECS

    def __call__(self) -> float:
        return self.now


class FakeLog:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def record(self, **fields: Any) -> None:
        self.rows.append(fields)

    def outcomes(self) -> list[str]:
        return [row["outcome"] for row in self.rows]


def link(owner: tuple[str, str], helper: tuple[str, str]) -> dict[str, Any]:
    return {
        "owner_node_id": owner[0],
        "owner_model_id": owner[1],
        "helper_node_id": helper[0],
        "helper_model_id": helper[1],
        "load_if_unloaded": True,
        "restore_after_borrow": False,
    }


@dataclass
class Owner:
    owner: OwnerLending
    lending: Lending
    clock: FakeClock
    log: FakeLog

    @property
    def queue(self) -> LaneQueue:
        return self.lending.queue("text")

    def arrive(self, model_id: str = "big", **fields: Any) -> Entry:
        entry = Entry(model_id, self.clock(), **fields)
        entry.payload = asyncio.get_running_loop().create_future()
        self.queue.enqueue(entry)
        self.clock.now += 1.0
        return entry


def make(*, role: str = "slave", depth: int = 1) -> Owner:
    """Node `o` owns `big` and `big2` (lending to h/fast) and is only a helper for x's `theirs`
    (with its model `mine`). Helper h/fast has a 2048-token window and reads no images;
    h2/seer has 8192 and reads images."""
    clock = FakeClock()
    lending = Lending(
        node_id="o", file_values={"scheduling_backend_depth": str(depth)}, clock=clock
    )
    lending.set_links(
        {
            "text": [
                link(("o", "big"), ("h", "fast")),
                link(("o", "big2"), ("h", "fast")),
                link(("x", "theirs"), ("o", "mine")),
            ],
            "image": [],
        }
    )
    log = FakeLog()
    helpers: dict[tuple[str, str], dict[str, Any]] = {
        ("h", "fast"): {"context_size": 2048, "has_multimodal": False},
        ("h2", "seer"): {"context_size": 8192, "has_multimodal": True},
    }
    replicas = {
        model: [SimpleNamespace(node_id=node, local_id=model, record=record)]
        for (node, model), record in helpers.items()
    }
    node = SimpleNamespace(
        node_id="o",
        role=role,
        lending=lending,
        decisions=log,
        cluster=SimpleNamespace(by_public_id=replicas),
    )
    return Owner(OwnerLending(node), lending, clock, log)


def lease(
    *,
    model: str = "big",
    helper: tuple[str, str] = ("h", "fast"),
    slots: int = 2,
    ttl_ms: int = 30_000,
) -> Lease:
    return Lease(
        lane="text",
        owner_node_id="o",
        owner_model_id=model,
        helper_node_id=helper[0],
        helper_model_id=helper[1],
        load_helper_model=True,
        restore_helper_model=False,
        helper_slots=slots,
        probe=False,
        ttl_ms=ttl_ms,
        owner_job_ms=1000.0,
        helper_switch_ms=200.0,
        helper_service_ms=250.0,
    )


# -- apply: the master's answer ------------------------------------------------------------


async def test_a_lease_lives_for_its_ttl_and_lends_the_newest_held_requests() -> None:
    o = make()
    running = o.arrive()
    held = [o.arrive() for _ in range(4)]  # arrived at 101 .. 104; now 105
    granted = lease(slots=2)

    o.owner.apply("text", "big", granted)

    assert o.log.outcomes() == ["lease_updated", "lent", "lent"]
    updated = o.log.rows[0]
    assert (updated["slots"], updated["lent_out"]) == (2, 0)
    assert (updated["switch_ms"], updated["service_ms"], updated["owner_job_ms"]) == (
        200.0,
        250.0,
        1000.0,
    )
    # Each `lent` row counts the requests out the moment it left, itself included.
    lent_rows = o.log.rows[1:]
    assert [(r["lent_out"], r["wait_ms"], r["reason"]) for r in lent_rows] == [
        (1, 1000, ""),
        (2, 2000, ""),
    ]
    assert o.queue.lent("big") == [held[3], held[2]]
    assert held[3].payload.result() is granted and held[2].payload.result() is granted
    assert [e.state for e in held[:2]] == [State.QUEUED, State.QUEUED]
    assert running.state is State.ADMITTED
    # The TTL runs on the owner's clock from the moment the answer arrived (105 s).
    assert o.owner.leases[("text", "big")].expires_at == 135.0
    o.clock.now = 134.999
    assert o.owner.live("text", "big") is granted
    o.clock.now = 135.0
    assert o.owner.live("text", "big") is None
    assert ("text", "big") not in o.owner.leases


async def test_a_model_this_node_only_helps_with_never_lends() -> None:
    o = make()
    o.arrive("mine")
    o.arrive("mine")

    o.owner.apply("text", "mine", lease(model="mine"))

    (row,) = o.log.rows
    assert (row["outcome"], row["reason"], row["owner_model_id"]) == (
        "lease_refused",
        "not_an_owner",
        "mine",
    )
    assert o.owner.leases == {}
    assert o.queue.lent() == []


async def test_clearing_a_lease_is_logged_once_and_recalls_nothing() -> None:
    o = make()
    o.arrive()
    (held,) = [o.arrive()]
    o.owner.apply("text", "big", lease(slots=1))
    assert held.state is State.LENT

    o.owner.apply("text", "big", None)
    o.owner.apply("text", "big", None)

    assert o.log.outcomes() == ["lease_updated", "lent", "lease_cleared"]
    assert o.log.rows[-1]["lent_out"] == 1
    assert o.owner.live("text", "big") is None
    assert held.state is State.LENT


async def test_slots_count_only_the_requests_out_with_the_leased_helper() -> None:
    o = make()
    o.arrive()
    held = [o.arrive() for _ in range(4)]
    o.owner.apply("text", "big", lease(slots=2))
    assert len(o.queue.lent("big")) == 2

    # The same lease again: both slots are in use, nothing more goes out.
    o.owner.apply("text", "big", lease(slots=2))
    assert len(o.queue.lent("big")) == 2

    # The lease moves to another helper: the two still out with h do not use its slot.
    moved = lease(helper=("h2", "seer"), slots=1)
    o.owner.apply("text", "big", moved)
    assert o.owner.lent_to("text", moved) == [held[1]]
    assert len(o.queue.lent("big")) == 3


async def test_a_lease_with_no_slots_still_lets_one_request_out() -> None:
    o = make()
    o.arrive()
    held = [o.arrive() for _ in range(3)]

    o.owner.apply("text", "big", lease(slots=0))

    assert o.queue.lent("big") == [held[2]]


async def test_a_request_larger_than_the_helpers_window_stays_with_the_owner() -> None:
    o = make()
    o.arrive()
    fits_exactly = o.arrive(context=2048)
    o.arrive(context=2049)

    o.owner.apply("text", "big", lease(slots=2))

    assert o.queue.lent("big") == [fits_exactly]


async def test_a_request_with_an_image_goes_only_to_a_helper_that_reads_images() -> None:
    o = make()
    o.arrive()
    plain = o.arrive()
    pictured = o.arrive()
    o.owner.image_entries.add(id(pictured))

    o.owner.apply("text", "big", lease(slots=2))
    assert o.queue.lent("big") == [plain]

    seer = lease(helper=("h2", "seer"), slots=1)
    o.owner.apply("text", "big", seer)
    assert o.owner.lent_to("text", seer) == [pictured]


@pytest.mark.parametrize(
    ("slopes", "expected"),
    [
        # A fit that prices answer length: the two longest answers go, whatever their age.
        ((0.0, 10.0), [0, 2]),
        # A flat fit prices every request alike: the newest go.
        ((0.0, 0.0), [3, 2]),
    ],
)
async def test_the_largest_held_requests_go_first_when_the_fit_tells_sizes_apart(
    slopes: tuple[float, float], expected: list[int]
) -> None:
    o = make()
    o.lending.costs = SimpleNamespace(  # type: ignore[assignment]
        models={("big", "llm"): CostFit(base_ms=100.0, slopes_ms=slopes, samples=20)}
    )
    o.arrive(work=(10.0, 10.0))
    held = [o.arrive(work=(10.0, out)) for out in (90.0, 20.0, 60.0, 30.0)]

    o.owner.apply("text", "big", lease(slots=2))

    assert o.queue.lent("big") == [held[i] for i in expected]


# -- report: queue events to the master ----------------------------------------------------


@dataclass
class FakeMaster:
    """Stands in for the owner's call to the master: each ask waits until the test answers."""

    asks: list[tuple[str, str, str]] = field(default_factory=list)
    answers: list[asyncio.Future[tuple[Lease | None, bool]]] = field(default_factory=list)
    asked: asyncio.Event = field(default_factory=asyncio.Event)

    async def ask(self, lane: str, model_id: str, trigger: str) -> tuple[Lease | None, bool]:
        answer: asyncio.Future[tuple[Lease | None, bool]] = (
            asyncio.get_running_loop().create_future()
        )
        self.asks.append((lane, model_id, trigger))
        self.answers.append(answer)
        self.asked.set()
        return await answer

    async def wait_asks(self, count: int) -> None:
        async with asyncio.timeout(WAIT_SECS):
            while len(self.asks) < count:
                self.asked.clear()
                await self.asked.wait()


def with_master(o: Owner, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeMaster, list[Any]]:
    master = FakeMaster()
    applied: list[Any] = []
    monkeypatch.setattr(o.owner, "_ask", master.ask)
    real_apply = o.owner.apply

    def apply(lane: str, model_id: str, answer: Lease | None) -> None:
        applied.append((model_id, answer))
        real_apply(lane, model_id, answer)

    monkeypatch.setattr(o.owner, "apply", apply)
    return master, applied


async def settle(o: Owner) -> None:
    async with asyncio.timeout(WAIT_SECS):
        await asyncio.gather(*o.owner._tasks)


async def test_events_of_one_model_are_coalesced_and_the_latest_trigger_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    o = make()
    master, applied = with_master(o, monkeypatch)
    first, second = lease(slots=1), lease(slots=2)

    o.owner.report("text", "big", "enqueued")
    await master.wait_asks(1)
    o.owner.report("text", "big", "completed")
    o.owner.report("text", "big", "lent_finished")
    # Another model's event is not held up by big's.
    o.owner.report("text", "big2", "enqueued")
    await master.wait_asks(2)
    assert master.asks == [("text", "big", "enqueued"), ("text", "big2", "enqueued")]

    master.answers[0].set_result((first, True))
    await master.wait_asks(3)
    assert master.asks[2] == ("text", "big", "lent_finished")
    master.answers[1].set_result((None, True))
    master.answers[2].set_result((second, True))
    await settle(o)

    assert len(master.asks) == 3
    assert applied == [("big", first), ("big2", None), ("big", second)]
    # Nothing is left in flight: the next event asks at once.
    o.owner.report("text", "big", "enqueued")
    await master.wait_asks(4)
    master.answers[3].set_result((None, True))
    await settle(o)


async def test_an_event_the_master_did_not_answer_leaves_the_lease_to_its_ttl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    o = make()
    granted = lease(slots=1)
    o.owner.apply("text", "big", granted)
    master, applied = with_master(o, monkeypatch)

    o.owner.report("text", "big", "enqueued")
    await master.wait_asks(1)
    master.answers[0].set_result((None, False))
    await settle(o)

    assert applied == []
    assert o.owner.live("text", "big") is granted
    assert "lease_cleared" not in o.log.outcomes()


@pytest.mark.parametrize(("role", "model"), [("standalone", "big"), ("slave", "mine")])
async def test_no_event_is_sent_by_a_standalone_node_or_for_a_model_that_does_not_lend(
    monkeypatch: pytest.MonkeyPatch, role: str, model: str
) -> None:
    o = make(role=role)
    master, _ = with_master(o, monkeypatch)

    o.owner.report("text", model, "enqueued")
    await settle(o)

    assert master.asks == []
