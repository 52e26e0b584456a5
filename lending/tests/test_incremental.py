"""The incremental planner answers exactly what the full planner answers, on random clusters.

Each seed builds a small cluster (few nodes, so that owners share helper nodes and claim them
from each other), plans it, then changes a few of its inputs between events (queues, idle
times, loaded models, fits, loads, links, the trigger, now and then the settings) and plans
again: every plan of ``LanePlanner`` must equal ``plan_lane``'s, leases, rows and probe wait.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from analytics.fitting import SECTION_IMAGE, SECTION_LLM, CostFit
from lending.incremental import LanePlanner
from lending.planner import (
    OUTCOME_GRANTED,
    OUTCOME_PROBE,
    Endpoint,
    LinkTarget,
    PlanResult,
    Settings,
    plan_lane,
)
from lending.pricing import CostTable

SEEDS = 1000
EVENTS = 6
LANES = ("image", "text")
SECTIONS = {"image": SECTION_IMAGE, "text": SECTION_LLM}
TRIGGERS = ("enqueued", "completed", "borrowed_completed", "probe_due", "tick")
SETTINGS = Settings(
    probe_idle_ms=5_000, faster_slots=3, slower_slots=1, probe_slots=1, grant_ttl_ms=30_000
)

Cluster = dict[str, object]


def _work(rng: random.Random, lane: str, count: int) -> tuple[float, ...]:
    if lane == "image":
        return (float(count * rng.choice([4e6, 20e6, 40e6])),)
    return (float(count * rng.randint(50, 4000)), float(count * rng.randint(10, 500)))


def _endpoint(rng: random.Random, lane: str, node: str, model: str) -> Endpoint:
    held = rng.choice([0, 0, 1, 2, 5, 12, 30])
    sized = rng.randint(0, held)
    backlog = held + rng.randint(0, 3)
    loaded = rng.random() < 0.5
    return Endpoint(
        node_id=node,
        model_id=model,
        config_filename=f"{model}.kcpps",
        loaded=loaded,
        accepting_borrowed=rng.random() < 0.85,
        idle_for_ms=rng.choice([0.0, 800.0, 4_000.0, 6_000.0, 70_000.0, 600_000.0]),
        context_capacity=rng.choice([0, 2048, 8192]),
        eligible=rng.random() < 0.95,
        pending_count=held,
        lendable_count=rng.choice([None, held, max(0, held - 1)]),
        pending_work=_work(rng, lane, held) if held else (),
        pending_context=held * rng.randint(0, 3000),
        sized_count=sized,
        sized_work=_work(rng, lane, sized) if sized else (),
        sized_context=sized * rng.randint(0, 3000),
        backlog_count=backlog,
        backlog_work=_work(rng, lane, backlog),
        displaced_configs=()
        if loaded
        else tuple(rng.sample(["x.kcpps", "y.kcpps"], rng.randint(0, 2))),
    )


def _fit(rng: random.Random, lane: str) -> CostFit | None:
    if rng.random() < 0.2:
        return None
    terms = 1 if lane == "image" else 2
    slopes = tuple(rng.choice([0.0, 1e-6, 2e-5, 0.01]) for _ in range(terms))
    return CostFit(
        base_ms=rng.choice([50.0, 400.0, 2_000.0, 9_000.0]), slopes_ms=slopes, samples=20
    )


class RandomCluster:
    """A small cluster's planner inputs for both lanes, changed a little between events."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.nodes = [f"n{i}" for i in range(rng.randint(2, 9))]
        self.models = {lane: [f"{lane[0]}{j}" for j in range(rng.randint(1, 2))] for lane in LANES}
        self.endpoints: dict[tuple[str, str, str], Endpoint] = {}
        for lane in LANES:
            for node in self.nodes:
                for model in self.models[lane]:
                    self.endpoints[(lane, node, model)] = _endpoint(rng, lane, node, model)
        self.links: dict[str, list[tuple[str, str, str, str, bool, bool]]] = {}
        for lane in LANES:
            self.links[lane] = [
                self._link(lane) for _ in range(rng.randint(1, 3 * len(self.nodes)))
            ]
        self.fits: dict[tuple[str, str, str], CostFit] = {}
        for lane, node, model in self.endpoints:
            fit = _fit(rng, lane)
            if fit is not None:
                self.fits[(node, model, SECTIONS[lane])] = fit
        self.loads: dict[tuple[str, str], float] = {}
        for node in self.nodes:
            for config in self._configs():
                if rng.random() < 0.75:
                    self.loads[(node, config)] = rng.choice([500.0, 3_000.0, 20_000.0])
        self.settings = SETTINGS

    def _configs(self) -> list[str]:
        return ["x.kcpps", "y.kcpps"] + [f"{m}.kcpps" for lane in LANES for m in self.models[lane]]

    def _link(self, lane: str) -> tuple[str, str, str, str, bool, bool]:
        rng = self.rng
        owner, helper = rng.sample(self.nodes, 2)
        return (
            owner,
            rng.choice(self.models[lane]),
            helper,
            rng.choice(self.models[lane]),
            rng.random() < 0.8,
            rng.random() < 0.5,
        )

    def owners(self, lane: str) -> list[tuple[Endpoint, list[LinkTarget]]]:
        grouped: dict[tuple[str, str], list[LinkTarget]] = {}
        for owner, model, helper, helper_model, load, restore in self.links[lane]:
            target = LinkTarget(self.endpoints[(lane, helper, helper_model)], load, restore)
            grouped.setdefault((owner, model), []).append(target)
        return [
            (self.endpoints[(lane, node, model)], targets)
            for (node, model), targets in grouped.items()
        ]

    def costs(self) -> CostTable:
        return CostTable(fits=dict(self.fits), loads=dict(self.loads))

    def change(self) -> None:
        """A few of the inputs an event can change; most of the cluster stays as it was."""
        rng = self.rng
        for _ in range(rng.randint(1, 3)):
            what = rng.random()
            lane = rng.choice(LANES)
            node = rng.choice(self.nodes)
            model = rng.choice(self.models[lane])
            key = (lane, node, model)
            if what < 0.45:
                self.endpoints[key] = _endpoint(rng, lane, node, model)
            elif what < 0.6:
                idle = rng.choice([0.0, 4_999.0, 5_000.0, 60_000.0, 59_999.0, 600_000.0])
                self.endpoints[key] = replace(self.endpoints[key], idle_for_ms=idle)
            elif what < 0.72:
                fit = _fit(rng, lane)
                if fit is None:
                    self.fits.pop((node, model, SECTIONS[lane]), None)
                else:
                    self.fits[(node, model, SECTIONS[lane])] = fit
            elif what < 0.82:
                config = rng.choice(self._configs())
                if rng.random() < 0.3:
                    self.loads.pop((node, config), None)
                else:
                    self.loads[(node, config)] = rng.choice([500.0, 3_000.0, 20_000.0])
            elif what < 0.92:
                links = self.links[lane]
                if links and rng.random() < 0.5:
                    links.pop(rng.randrange(len(links)))
                else:
                    links.append(self._link(lane))
            elif what < 0.96:
                self.settings = replace(SETTINGS, faster_slots=rng.choice([1, 2, 3]))
            # else: nothing changed at all


def _plans(seed: int, tally: Counter[str]) -> None:
    rng = random.Random(seed)
    cluster = RandomCluster(rng)
    planners = {lane: LanePlanner(lane) for lane in LANES}
    for event in range(EVENTS):
        if event:
            cluster.change()
        trigger = rng.choice(TRIGGERS)
        costs = cluster.costs()
        for lane in LANES:
            owners = cluster.owners(lane)
            full = plan_lane(
                lane=lane, trigger=trigger, owners=owners, costs=costs, settings=cluster.settings
            )
            kept = planners[lane].plan(
                trigger=trigger, owners=owners, costs=costs, settings=cluster.settings
            )
            assert kept == full, f"seed {seed}, event {event}, lane {lane}"
            _tally(tally, full, planners[lane])


def _tally(tally: Counter[str], result: PlanResult, planner: LanePlanner) -> None:
    tally["reused"] += planner.reused
    tally["replanned"] += planner.replanned
    for lease in result.leases:
        tally["probe" if lease.probe else "granted"] += 1
    for row in result.rows:
        tally[row.reason] += 1
        if row.outcome in (OUTCOME_GRANTED, OUTCOME_PROBE):
            tally[f"outcome:{row.outcome}"] += 1
    if result.probe_due_ms is not None:
        tally["probe_due"] += 1


def test_the_incremental_planner_gives_the_full_planners_result_on_random_clusters() -> None:
    tally: Counter[str] = Counter()
    for seed in range(SEEDS):
        _plans(seed, tally)
    # The clusters reach every branch that makes one owner's plan depend on another's, and
    # kept plans were actually reused (else the equality above proves nothing about them).
    for seen in (
        "granted",
        "probe",
        "probe_due",
        "helper_claimed",
        "outranked",
        "cost_rejected",
        "helper_recently_busy",
        "restore_unpriced",
        "reused",
        "replanned",
    ):
        assert tally[seen] > 0, seen
    assert tally["reused"] > tally["replanned"] // 4


def _shared_helper_cluster() -> tuple[list[tuple[Endpoint, list[LinkTarget]]], CostTable]:
    rng = random.Random(7)
    helper = replace(
        _endpoint(rng, "image", "h", "m"), loaded=True, accepting_borrowed=True, eligible=True
    )
    owners = []
    for i, held in enumerate((30, 20, 10)):
        owner = replace(
            _endpoint(rng, "image", f"o{i}", "m"),
            eligible=True,
            pending_count=held,
            lendable_count=held,
            sized_count=held,
            sized_work=(held * 20e6,),
            backlog_count=held,
            backlog_work=(held * 20e6,),
        )
        owners.append((owner, [LinkTarget(helper, True, False)]))
    flat = CostFit(base_ms=1_000.0, slopes_ms=(0.0,), samples=20)
    fits = {(node, "m", SECTION_IMAGE): flat for node in ("o0", "o1", "o2", "h")}
    return owners, CostTable(fits=fits, loads={})


@pytest.mark.parametrize(
    ("changed", "change", "replanned"),
    [
        # The first owner's own plan and claim stay the same: nobody after it is re-planned.
        (0, {"idle_for_ms": 1.0}, 1),
        # The last owner in plan order: nobody plans after it.
        (2, {"idle_for_ms": 1.0}, 1),
        # The first owner leaves the plan: both owners behind it on the helper see other claims.
        (0, {"lendable_count": 0}, 2),
    ],
)
def test_a_change_replans_the_owner_and_those_after_it_that_see_other_claims(
    changed: int, change: dict[str, Any], replanned: int
) -> None:
    owners, costs = _shared_helper_cluster()
    planner = LanePlanner("image")
    first = planner.plan(trigger="enqueued", owners=owners, costs=costs, settings=SETTINGS)
    assert (planner.replanned, len(first.leases)) == (3, 3)
    again = planner.plan(trigger="enqueued", owners=owners, costs=costs, settings=SETTINGS)
    assert (planner.replanned, planner.reused) == (0, 3)
    assert again == first
    owner, targets = owners[changed]
    owners[changed] = (replace(owner, **change), targets)
    after = planner.plan(trigger="tick", owners=owners, costs=costs, settings=SETTINGS)
    assert planner.replanned == replanned
    assert after == plan_lane(
        lane="image", trigger="tick", owners=owners, costs=costs, settings=SETTINGS
    )
