"""The lease planner: cost rule, probes, claims, skip reasons and the lease wire form.

Numbers follow reference-lending.md section 3. Image fits here are flat (slope 0), so a
job's price is its base whatever its size; one image job's work is 20e6 (1 Mpx x 20 steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from analytics.fitting import CostFit
from lending.planner import (
    Endpoint,
    Lease,
    LinkTarget,
    PlanResult,
    PlanRow,
    Settings,
    plan_lane,
)
from lending.pricing import CostTable

JOB_WORK = 20e6
SETTINGS = Settings(
    probe_idle_ms=5_000, faster_slots=2, slower_slots=1, probe_slots=1, grant_ttl_ms=30_000
)
# Distinct slot counts, so a test can tell which rule chose them.
SLOT_SETTINGS = Settings(
    probe_idle_ms=5_000, faster_slots=3, slower_slots=2, probe_slots=1, grant_ttl_ms=30_000
)
LONG_IDLE_MS = 600_000.0


def flat(ms: float) -> CostFit:
    return CostFit(base_ms=ms, slopes_ms=(0.0,), samples=20)


def owner(
    held: int,
    *,
    node: str = "own",
    model: str = "m",
    admitted: int = 0,
    config: str = "m.yaml",
) -> Endpoint:
    backlog = held + admitted
    return Endpoint(
        node_id=node,
        model_id=model,
        config_filename=config,
        loaded=True,
        accepting_borrowed=False,
        idle_for_ms=0.0,
        context_capacity=0,
        pending_count=held,
        pending_work=(held * JOB_WORK,),
        sized_count=held,
        sized_work=(held * JOB_WORK,),
        backlog_count=backlog,
        backlog_work=(backlog * JOB_WORK,),
    )


def helper(
    node: str,
    *,
    model: str = "h",
    loaded: bool = True,
    idle: float = LONG_IDLE_MS,
    accepting: bool = True,
    displaced: tuple[str, ...] = (),
    capacity: int = 0,
    eligible: bool = True,
) -> Endpoint:
    return Endpoint(
        node_id=node,
        model_id=model,
        config_filename=f"{model}.yaml",
        loaded=loaded,
        accepting_borrowed=accepting,
        idle_for_ms=idle,
        context_capacity=capacity,
        eligible=eligible,
        displaced_configs=displaced,
    )


def link(endpoint: Endpoint, *, load: bool = True, restore: bool = False) -> LinkTarget:
    return LinkTarget(helper=endpoint, load_if_unloaded=load, restore_after_borrow=restore)


def table(
    fits: dict[tuple[str, str], CostFit] | None = None,
    loads: dict[tuple[str, str], float] | None = None,
    section: str = "image",
) -> CostTable:
    return CostTable(
        fits={(node, model, section): fit for (node, model), fit in (fits or {}).items()},
        loads=loads or {},
    )


def plan(
    owners: Sequence[tuple[Endpoint, Sequence[LinkTarget]]],
    costs: CostTable | None,
    *,
    lane: str = "image",
    settings: Settings = SETTINGS,
    trigger: str = "enqueued",
) -> PlanResult:
    return plan_lane(lane=lane, trigger=trigger, owners=owners, costs=costs, settings=settings)


def only_row(result: PlanResult) -> PlanRow:
    assert len(result.rows) == 1
    return result.rows[0]


def rows_by_helper(result: PlanResult) -> dict[str, PlanRow]:
    return {row.helper_node_id: row for row in result.rows}


# -- cost rule ---------------------------------------------------------------------------


def test_a_deep_backlog_pays_for_loading_the_helper_model() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)}, {("h1", "h.yaml"): 2000})
    result = plan([(owner(40), [link(helper("h1", loaded=False))])], costs)

    row = only_row(result)
    assert (row.outcome, row.reason) == ("granted", "")
    assert row.keep_ms == 40_000
    assert row.switch_ms == 2_000
    assert row.restore_ms == 0
    assert row.service_ms == 250
    assert row.owner_job_ms == 1_000
    assert row.service_source == "helper"
    assert row.slots == 2
    assert result.leases == [
        Lease(
            lane="image",
            owner_node_id="own",
            owner_model_id="m",
            helper_node_id="h1",
            helper_model_id="h",
            load_helper_model=True,
            restore_helper_model=False,
            helper_slots=2,
            probe=False,
            ttl_ms=30_000,
            owner_job_ms=1_000,
            helper_switch_ms=2_000,
            helper_service_ms=250,
        )
    ]
    assert result.probe_due_ms is None


def test_a_shallow_backlog_does_not_pay_for_the_same_load() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)}, {("h1", "h.yaml"): 2000})
    # Idle long enough not to be recently busy, not long enough for an unloaded probe (60 s).
    result = plan([(owner(2), [link(helper("h1", loaded=False, idle=10_000))])], costs)

    row = only_row(result)
    assert (row.outcome, row.reason) == ("skipped", "cost_rejected")
    assert row.keep_ms == 2_000
    assert row.switch_ms + row.service_ms == 2_250
    assert result.leases == []
    assert result.probe_due_ms == 50_000


def test_a_loaded_helper_pays_off_even_for_a_shallow_backlog() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)}, {("h1", "h.yaml"): 2000})
    result = plan([(owner(2), [link(helper("h1", loaded=True, idle=0))])], costs)

    row = only_row(result)
    assert (row.outcome, row.switch_ms, row.keep_ms) == ("granted", 0, 2_000)
    assert result.leases[0].helper_switch_ms == 0


def test_admitted_jobs_count_towards_the_drain_time() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)}, {("h1", "h.yaml"): 2000})
    # 2 held alone do not pay for 2250 ms, 2 held behind 2 admitted jobs (4000 ms) do.
    result = plan([(owner(2, admitted=2), [link(helper("h1", loaded=False))])], costs)

    row = only_row(result)
    assert (row.outcome, row.pending_count, row.backlog_count, row.keep_ms) == (
        "granted",
        2,
        4,
        4_000,
    )


def test_a_total_equal_to_the_drain_time_is_rejected() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)}, {("h1", "h.yaml"): 1750})
    result = plan([(owner(2), [link(helper("h1", loaded=False, idle=10_000))])], costs)
    assert only_row(result).reason == "cost_rejected"
    assert result.leases == []


def test_the_restore_price_counts_against_the_helper() -> None:
    costs = table(
        {("own", "m"): flat(1000), ("h1", "h"): flat(250)},
        {("h1", "h.yaml"): 2000, ("h1", "a.yaml"): 1500, ("h1", "b.yaml"): 500},
    )
    unloaded = helper("h1", loaded=False, displaced=("a.yaml", "b.yaml"))
    # Without the restore 2250 < 4000; with it 2000 + 2000 + 250 = 4250 >= 4000.
    result = plan([(owner(4), [link(unloaded)])], costs)

    row = only_row(result)
    assert (row.reason, row.switch_ms, row.restore_ms) == ("cost_rejected", 2_000, 2_000)
    deep = plan([(owner(5), [link(unloaded, restore=True)])], costs)
    assert deep.leases[0].helper_switch_ms == 4_000
    assert deep.leases[0].restore_helper_model is True


# -- eligibility ---------------------------------------------------------------------------


def test_a_helper_whose_link_forbids_loading_is_never_used_while_unloaded() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)}, {("h1", "h.yaml"): 2000})
    result = plan([(owner(40), [link(helper("h1", loaded=False), load=False)])], costs)

    assert only_row(result).reason == "load_forbidden"
    assert result.leases == []
    assert result.probe_due_ms is None


def test_a_link_that_forbids_loading_still_uses_a_helper_already_loaded() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)}, {("h1", "h.yaml"): 2000})
    result = plan([(owner(40), [link(helper("h1", loaded=True), load=False)])], costs)

    row = only_row(result)
    assert (row.outcome, row.reason, row.switch_ms) == ("granted", "", 0)
    (lease,) = result.leases
    assert (lease.helper_node_id, lease.load_helper_model, lease.helper_switch_ms) == (
        "h1",
        False,
        0,
    )


def test_a_helper_not_accepting_borrowed_work_is_skipped_before_anything_else() -> None:
    costs = table({("own", "m"): flat(1000)})
    result = plan(
        [(owner(40), [link(helper("h1", loaded=False, accepting=False), load=False)])], costs
    )
    assert only_row(result).reason == "helper_not_accepting"
    assert result.probe_due_ms is None


def test_an_ineligible_helper_model_is_skipped_without_a_row() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    result = plan(
        [(owner(40), [link(helper("h1", eligible=False)), link(helper("h2", idle=0))])], costs
    )
    assert [row.helper_node_id for row in result.rows] == ["h2"]
    assert result.leases[0].helper_node_id == "h2"


def test_an_ineligible_owner_model_is_not_planned() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    stale = Endpoint(**{**owner(40).__dict__, "eligible": False})
    assert plan([(stale, [link(helper("h1"))])], costs) == PlanResult()


def test_a_helper_that_served_its_own_work_recently_is_not_displaced() -> None:
    costs = table(
        {("own", "m"): flat(1000), ("h1", "h"): flat(250)},
        {("h1", "h.yaml"): 2000, ("h1", "a.yaml"): 3000},
    )
    busy = helper("h1", loaded=False, idle=4_999, displaced=("a.yaml",))
    result = plan([(owner(40), [link(busy)])], costs)
    assert only_row(result).reason == "helper_recently_busy"
    assert result.leases == []
    assert result.probe_due_ms is None

    quiet = helper("h1", loaded=False, idle=5_000, displaced=("a.yaml",))
    granted = plan([(owner(40), [link(quiet)])], costs)
    assert only_row(granted).outcome == "granted"


def test_recently_busy_applies_only_to_a_fully_priced_helper() -> None:
    # The owner is unpriced and the helper has no fit, so service is unpriced: the idle
    # check against a 90 s switch does not apply and the 60 s probe bar decides alone.
    costs = table(loads={("h1", "h.yaml"): 90_000})
    result = plan([(owner(3), [link(helper("h1", loaded=False, idle=70_000))])], costs)
    assert (only_row(result).outcome, only_row(result).reason) == ("probe", "owner_unpriced")

    priced = table({("h1", "h"): flat(250)}, {("h1", "h.yaml"): 90_000})
    blocked = plan([(owner(3), [link(helper("h1", loaded=False, idle=70_000))])], priced)
    assert only_row(blocked).reason == "helper_recently_busy"
    assert blocked.leases == []


# -- unpriced helpers --------------------------------------------------------------------


def test_a_helper_without_a_measured_load_is_switch_unpriced() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    result = plan([(owner(40), [link(helper("h1", loaded=False, idle=10_000))])], costs)
    assert only_row(result).reason == "switch_unpriced"
    assert result.leases == []


def test_a_missing_switch_price_outranks_a_missing_restore_price() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    unloaded = helper("h1", loaded=False, idle=10_000, displaced=("a.yaml",))
    assert only_row(plan([(owner(40), [link(unloaded)])], costs)).reason == "switch_unpriced"


def test_displacing_a_model_with_no_measured_load_is_restore_unpriced() -> None:
    costs = table(
        {("own", "m"): flat(1000), ("h1", "h"): flat(250)},
        {("h1", "h.yaml"): 2000, ("h1", "a.yaml"): 1000},
    )
    unloaded = helper("h1", loaded=False, idle=10_000, displaced=("a.yaml", "b.yaml"))
    result = plan([(owner(40), [link(unloaded)])], costs)
    row = only_row(result)
    assert (row.reason, row.switch_ms, row.restore_ms) == ("restore_unpriced", 2_000, 0)
    assert result.leases == []


def test_a_helper_without_a_fit_is_priced_with_the_owner_fit() -> None:
    costs = table({("own", "m"): flat(1000)})
    result = plan([(owner(3), [link(helper("h1", idle=0))])], costs)

    row = only_row(result)
    assert (row.outcome, row.service_ms, row.service_source) == ("granted", 1_000, "owner_fallback")
    # As fast as the owner counts as "at most the owner's time per job".
    assert row.slots == 2


def test_the_helper_fit_replaces_the_fallback_once_it_exists() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(1200)})
    row = only_row(plan([(owner(3), [link(helper("h1", idle=0))])], costs))
    assert (row.service_ms, row.service_source) == (1_200, "helper")


def test_an_unpriced_owner_only_ever_probes() -> None:
    costs = table({("h1", "h"): flat(250)})
    result = plan([(owner(40), [link(helper("h1", idle=5_000))])], costs)

    row = only_row(result)
    assert (row.outcome, row.reason, row.slots) == ("probe", "owner_unpriced", 1)
    assert row.keep_ms == 0 and row.owner_job_ms == 0
    # Service is unpriced without the owner's fit to fall back on, but the helper's own fit
    # still prices it.
    assert (row.service_ms, row.service_source) == (250, "helper")
    lease = result.leases[0]
    assert lease.probe is True
    assert lease.knows_speeds() is False


def test_an_unpriced_owner_with_a_fitless_helper_logs_no_service_price() -> None:
    result = plan([(owner(40), [link(helper("h1", idle=5_000))])], table())
    row = only_row(result)
    assert (row.outcome, row.reason, row.service_ms, row.service_source) == (
        "probe",
        "owner_unpriced",
        0,
        "",
    )
    assert result.leases[0].helper_service_ms is None


# -- slots ----------------------------------------------------------------------------------


def test_a_helper_at_most_as_slow_as_the_owner_gets_the_faster_slots() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(999)})
    result = plan([(owner(3), [link(helper("h1"))])], costs, settings=SLOT_SETTINGS)
    assert (only_row(result).slots, result.leases[0].helper_slots) == (3, 3)


def test_a_slower_helper_that_still_pays_off_gets_the_slower_slots() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(1500)})
    result = plan([(owner(3), [link(helper("h1"))])], costs, settings=SLOT_SETTINGS)
    assert (only_row(result).outcome, only_row(result).slots) == ("granted", 2)
    assert result.leases[0].helper_slots == 2


def test_a_probe_gets_the_probe_slots() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(5000)})
    result = plan([(owner(3), [link(helper("h1", idle=5_000))])], costs, settings=SLOT_SETTINGS)
    row = only_row(result)
    assert (row.outcome, row.reason, row.slots) == ("probe", "cost_rejected", 1)
    assert result.leases[0].helper_slots == 1


def test_a_lease_always_allows_at_least_one_slot() -> None:
    settings = Settings(
        probe_idle_ms=5_000, faster_slots=0, slower_slots=0, probe_slots=0, grant_ttl_ms=1
    )
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    result = plan([(owner(3), [link(helper("h1"))])], costs, settings=settings)
    assert result.leases[0].helper_slots == 1


# -- choice between helpers ----------------------------------------------------------------


def test_the_cheapest_paying_helper_wins_and_the_other_is_outranked() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(400), ("h2", "h"): flat(250)})
    result = plan([(owner(10), [link(helper("h1")), link(helper("h2"))])], costs)

    rows = rows_by_helper(result)
    assert (rows["h2"].outcome, rows["h2"].reason) == ("granted", "")
    assert (rows["h1"].outcome, rows["h1"].reason, rows["h1"].slots) == ("skipped", "outranked", 0)
    assert [lease.helper_node_id for lease in result.leases] == ["h2"]


def test_equal_totals_go_to_the_smallest_helper_node_id() -> None:
    costs = table({("own", "m"): flat(1000), ("hb", "h"): flat(250), ("ha", "h"): flat(250)})
    result = plan([(owner(10), [link(helper("hb")), link(helper("ha"))])], costs)
    assert result.leases[0].helper_node_id == "ha"
    assert rows_by_helper(result)["hb"].reason == "outranked"


def test_a_loaded_helper_can_beat_a_faster_one_that_must_load() -> None:
    costs = table(
        {("own", "m"): flat(1000), ("fast", "h"): flat(100), ("near", "h"): flat(1200)},
        {("fast", "h.yaml"): 5000},
    )
    helpers = [link(helper("fast", loaded=False)), link(helper("near"))]
    result = plan([(owner(10), helpers)], costs)
    rows = rows_by_helper(result)
    assert rows["near"].outcome == "granted"
    assert rows["fast"].reason == "outranked"
    # Slower than the owner per job, though it pays off: the slower slot count.
    assert rows["near"].slots == 1


# -- claims and ordering -------------------------------------------------------------------


def test_a_helper_is_shared_when_waiting_behind_the_first_owner_still_pays() -> None:
    costs = table(
        {("big", "m"): flat(1000), ("small", "m"): flat(1000), ("h1", "h"): flat(250)},
    )
    shared = helper("h1")
    result = plan(
        [
            (owner(5, node="small"), [link(shared)]),
            (owner(40, node="big"), [link(shared)]),
        ],
        costs,
    )
    rows = [(r.owner_node_id, r.outcome, r.reason, r.slots) for r in result.rows]
    # small's first lent job waits behind big's two: 3 x 250 = 750 ms < 5 x 1000 ms alone;
    # its second, 4 x 250 = 1000 ms, pays off too: the helper is faster, so two slots.
    assert rows == [("big", "granted", "", 2), ("small", "granted", "", 2)]
    big, small = result.leases
    assert (big.helper_slots, big.helper_switch_ms) == (2, 0)
    assert (small.helper_slots, small.helper_switch_ms) == (2, 500)


def test_a_shared_helpers_second_slot_is_given_only_when_it_pays_off() -> None:
    costs = table(
        {("big", "m"): flat(1000), ("small", "m"): flat(1100), ("h1", "h"): flat(300)},
    )
    shared = helper("h1")
    result = plan(
        [(owner(40, node="big"), [link(shared)]), (owner(1, node="small"), [link(shared)])],
        costs,
    )
    # small alone: 1100 ms. Behind big's two: its first lent job ends at 3 x 300 = 900 ms,
    # its second would end at 4 x 300 = 1200 ms, later than alone: one slot.
    assert [(r.owner_node_id, r.outcome, r.slots) for r in result.rows] == [
        ("big", "granted", 2),
        ("small", "granted", 1),
    ]
    # With 1201 ms alone the second slot pays off (1200 < 1201); with 1200 exactly it does not.
    for alone_ms, slots in ((1201, 2), (1200, 1)):
        costs = table(
            {("big", "m"): flat(1000), ("small", "m"): flat(alone_ms), ("h1", "h"): flat(300)},
        )
        rows = plan(
            [(owner(40, node="big"), [link(shared)]), (owner(1, node="small"), [link(shared)])],
            costs,
        ).rows
        assert rows[1].slots == slots, alone_ms


def test_a_shared_helper_slower_than_the_owner_adds_the_fewer_slots() -> None:
    costs = table(
        {("big", "m"): flat(1000), ("small", "m"): flat(200), ("h1", "h"): flat(250)},
    )
    shared = helper("h1")
    result = plan(
        [(owner(40, node="big"), [link(shared)]), (owner(40, node="small"), [link(shared)])],
        costs,
    )
    # 250 ms a job on the helper against small's 200: slower, so the slower slots (1), however
    # much small has held.
    assert [(r.owner_node_id, r.outcome, r.slots) for r in result.rows] == [
        ("big", "granted", 2),
        ("small", "granted", 1),
    ]


def test_a_shared_helper_that_no_longer_pays_is_claimed() -> None:
    costs = table(
        {("big", "m"): flat(1000), ("small", "m"): flat(1000), ("h1", "h"): flat(400)},
    )
    shared = helper("h1")
    result = plan(
        [(owner(40, node="big"), [link(shared)]), (owner(1, node="small"), [link(shared)])],
        costs,
    )
    # 3 x 400 = 1200 ms behind big's two slots against 1000 ms alone: not worth it.
    assert [(r.owner_node_id, r.outcome, r.reason) for r in result.rows] == [
        ("big", "granted", ""),
        ("small", "skipped", "helper_claimed"),
    ]
    assert [lease.owner_node_id for lease in result.leases] == ["big"]


def test_sharing_prices_the_wait_behind_every_earlier_grant() -> None:
    # Three owners on one 250 ms helper: 2 slots, then 1, then the third waits behind 3.
    costs = table(
        {("a", "m"): flat(1000), ("b", "m"): flat(1000), ("c", "m"): flat(1000)}
        | {("h1", "h"): flat(250)},
    )
    shared = helper("h1")
    owners = [(owner(n, node=name), [link(shared)]) for name, n in (("a", 9), ("b", 8), ("c", 1))]
    result = plan(owners, costs)
    # b behind a's two: its second job ends at 4 x 250 = 1000 ms < 8000 ms alone, so two.
    # c alone: 1000 ms; behind 4 lent jobs: 5 x 250 = 1250 ms, not sooner.
    assert [(r.owner_node_id, r.outcome, r.reason, r.slots) for r in result.rows] == [
        ("a", "granted", "", 2),
        ("b", "granted", "", 2),
        ("c", "skipped", "helper_claimed", 0),
    ]


def test_a_claim_covers_every_model_of_the_helper_node() -> None:
    costs = table({("a", "m"): flat(1000), ("b", "m"): flat(1000), ("h1", "x"): flat(250)})
    result = plan(
        [
            (owner(40, node="a"), [link(helper("h1", model="x"))]),
            (owner(40, node="b"), [link(helper("h1", model="y")), link(helper("h2", idle=0))]),
        ],
        costs,
    )
    rows = [(r.owner_node_id, r.helper_node_id, r.helper_model_id, r.reason) for r in result.rows]
    assert rows == [
        ("a", "h1", "x", ""),
        ("b", "h1", "y", "helper_claimed"),
        ("b", "h2", "h", ""),
    ]
    # Owner b's helper h2 has no fit: it is priced with b's own fit.
    assert [(lease.owner_node_id, lease.helper_node_id) for lease in result.leases] == [
        ("a", "h1"),
        ("b", "h2"),
    ]


def test_a_probe_claims_the_helper_node_too() -> None:
    result = plan(
        [
            (owner(5, node="a"), [link(helper("h1", idle=9_000))]),
            (owner(3, node="b"), [link(helper("h1", idle=9_000))]),
        ],
        table(),
    )
    assert [(r.owner_node_id, r.outcome, r.reason) for r in result.rows] == [
        ("a", "probe", "owner_unpriced"),
        ("b", "skipped", "helper_claimed"),
    ]


def test_owners_are_planned_by_backlog_size_then_node_then_model() -> None:
    owners = [
        (owner(3, node="n2", model="b"), [link(helper("h", idle=0))]),
        (owner(3, node="n2", model="a"), [link(helper("h", idle=0))]),
        (owner(3, node="n1", model="z"), [link(helper("h", idle=0))]),
        (owner(9, node="n9", model="a"), [link(helper("h", idle=0))]),
        (owner(0, node="n0", model="a"), [link(helper("h", idle=0))]),
    ]
    result = plan(owners, table())
    assert [(row.owner_node_id, row.owner_model_id) for row in result.rows] == [
        ("n9", "a"),
        ("n1", "z"),
        ("n2", "a"),
        ("n2", "b"),
    ]


def test_an_owner_with_nothing_held_is_not_planned() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    # Two admitted jobs, none held: nothing can be lent.
    assert plan([(owner(0, admitted=2), [link(helper("h1"))])], costs) == PlanResult()


# -- probes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loaded", "idle", "outcome", "due"),
    [
        (True, 4_999, "skipped", 1),
        (True, 5_000, "probe", None),
        (False, 59_999, "skipped", 1),
        (False, 60_000, "probe", None),
    ],
)
def test_a_probe_waits_for_the_idle_bar_and_twelve_times_longer_for_a_switch(
    loaded: bool, idle: float, outcome: str, due: float | None
) -> None:
    costs = table(loads={("h1", "h.yaml"): 1000})
    result = plan([(owner(3), [link(helper("h1", loaded=loaded, idle=idle))])], costs)
    assert only_row(result).outcome == outcome
    assert result.probe_due_ms == due
    assert len(result.leases) == (1 if outcome == "probe" else 0)


def test_a_probe_goes_to_the_longest_idle_helper() -> None:
    helpers = [
        link(helper("h1", idle=6_000)),
        link(helper("h2", idle=9_000)),
        link(helper("h3", loaded=False, idle=61_000)),
    ]
    result = plan([(owner(3), helpers)], table(loads={("h3", "h.yaml"): 1000}))
    assert result.leases[0].helper_node_id == "h3"
    assert result.leases[0].load_helper_model is True
    assert [(r.helper_node_id, r.outcome) for r in result.rows] == [
        ("h1", "skipped"),
        ("h2", "skipped"),
        ("h3", "probe"),
    ]
    # Not chosen by the probe: each keeps its cost-rule reason, not "outranked".
    assert {r.reason for r in result.rows} == {"owner_unpriced"}


def test_equally_idle_probe_candidates_go_to_the_smallest_node_id() -> None:
    helpers = [link(helper("hb", idle=9_000)), link(helper("ha", idle=9_000))]
    result = plan([(owner(3), helpers)], table())
    assert result.leases[0].helper_node_id == "ha"


def test_probes_happen_when_the_owner_is_faster() -> None:
    costs = table({("own", "m"): flat(250), ("h1", "h"): flat(1000)})
    result = plan([(owner(3), [link(helper("h1", idle=5_000))])], costs)
    row = only_row(result)
    assert (row.outcome, row.reason) == ("probe", "cost_rejected")
    assert row.keep_ms == 750


def test_the_probe_due_time_is_the_shortest_wait_over_every_owner() -> None:
    helpers_a = [
        link(helper("h1", idle=1_000)),  # 4000 to go
        link(helper("h2", loaded=False, idle=50_000)),  # 10000 to go
        link(helper("h3", idle=4_900, accepting=False)),  # cannot take work: no wait
    ]
    helpers_b = [link(helper("h4", idle=2_500))]  # 2500 to go
    result = plan(
        [(owner(3, node="a"), helpers_a), (owner(3, node="b"), helpers_b)],
        table(loads={("h2", "h.yaml"): 1000}),
    )
    assert result.leases == []
    assert result.probe_due_ms == 2_500


def test_an_owner_that_got_a_lease_schedules_no_probe() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    result = plan(
        [(owner(10), [link(helper("h1", idle=0)), link(helper("h2", idle=1_000))])], costs
    )
    assert result.leases[0].helper_node_id == "h1"
    assert result.probe_due_ms is None


def test_without_a_cost_source_nothing_is_planned() -> None:
    result = plan([(owner(40), [link(helper("h1", idle=LONG_IDLE_MS))])], None)
    assert result == PlanResult(leases=[], rows=[], probe_due_ms=None)


def test_an_empty_cost_table_still_allows_probes() -> None:
    result = plan([(owner(40), [link(helper("h1", idle=5_000))])], table())
    assert result.leases[0].probe is True


# -- text lane: context gate ---------------------------------------------------------------


TEXT_FIT = CostFit(base_ms=40.0, slopes_ms=(0.5, 20.0), samples=30)


def text_owner(
    *, held: int, sized: int, sized_context: int, pending_context: int, cached_prompt: float = 0.0
) -> Endpoint:
    # Each sized request: 1000 prompt tokens, 100 output tokens, `cached_prompt` of its prompt
    # in the owner's prompt cache; unsized ones add no work.
    cached = (sized * cached_prompt, 0.0) if cached_prompt else ()
    return Endpoint(
        node_id="own",
        model_id="m",
        config_filename="m.yaml",
        loaded=True,
        accepting_borrowed=False,
        idle_for_ms=0.0,
        context_capacity=32_768,
        pending_count=held,
        pending_work=(sized * 1000.0, sized * 100.0),
        pending_context=pending_context,
        sized_count=sized,
        sized_work=(sized * 1000.0, sized * 100.0),
        sized_context=sized_context,
        backlog_count=held,
        backlog_work=(sized * 1000.0, sized * 100.0),
        sized_cached=cached,
        backlog_cached=cached,
    )


def test_a_text_helper_whose_window_is_below_the_mean_context_is_skipped() -> None:
    costs = table({("own", "m"): TEXT_FIT, ("h1", "h"): TEXT_FIT}, section="llm")
    queue = text_owner(held=4, sized=4, sized_context=24_000, pending_context=24_000)
    result = plan([(queue, [link(helper("h1", capacity=4_096))])], costs, lane="text")
    assert only_row(result).reason == "context_too_small"
    assert result.leases == []
    assert result.probe_due_ms is None

    roomy = plan([(queue, [link(helper("h1", capacity=6_000))])], costs, lane="text")
    assert only_row(roomy).outcome == "granted"


def test_unsized_requests_do_not_dilute_the_mean_context() -> None:
    costs = table({("own", "m"): TEXT_FIT, ("h1", "h"): TEXT_FIT}, section="llm")
    # 2 of 10 held requests are sized at 6000 tokens each; the reference would average
    # 12000 over all 10 (1200) and let a 4096-token helper through.
    queue = text_owner(held=10, sized=2, sized_context=12_000, pending_context=12_000)
    result = plan([(queue, [link(helper("h1", capacity=4_096))])], costs, lane="text")
    assert only_row(result).reason == "context_too_small"


def test_unsized_requests_do_not_dilute_the_mean_job_price() -> None:
    costs = table({("own", "m"): TEXT_FIT}, section="llm")
    queue = text_owner(held=10, sized=2, sized_context=0, pending_context=0)
    row = only_row(plan([(queue, [link(helper("h1", capacity=4_096))])], costs, lane="text"))
    # One mean sized job: 40 + 0.5 * 1000 + 20 * 100.
    assert row.owner_job_ms == 2_540
    # The drain time covers every held request: 10 * 40 + 0.5 * 2000 + 20 * 200.
    assert row.keep_ms == 5_400


def test_a_queue_with_no_size_estimates_passes_the_context_gate() -> None:
    costs = table({("own", "m"): TEXT_FIT, ("h1", "h"): TEXT_FIT}, section="llm")
    queue = text_owner(held=5, sized=0, sized_context=0, pending_context=0)
    result = plan([(queue, [link(helper("h1", capacity=512))])], costs, lane="text")
    row = only_row(result)
    assert row.reason != "context_too_small"
    # Zero work per job: the mean job is the base price.
    assert row.owner_job_ms == 40


def test_the_context_gate_does_not_apply_to_the_image_lane() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    queue = Endpoint(**{**owner(10).__dict__, "sized_context": 99_999, "pending_context": 99_999})
    result = plan([(queue, [link(helper("h1", capacity=0))])], costs)
    assert only_row(result).outcome == "granted"


# -- rows and wire form -----------------------------------------------------------------------


def test_plan_rows_carry_the_trigger_and_the_decision_columns() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})
    result = plan([(owner(3), [link(helper("h1", idle=1_234.9))])], costs, trigger="probe_due")
    fields = only_row(result).as_fields()
    assert fields == {
        "trigger": "probe_due",
        "lane": "image",
        "owner_node_id": "own",
        "owner_model_id": "m",
        "helper_node_id": "h1",
        "helper_model_id": "h",
        "outcome": "granted",
        "reason": "",
        "pending_count": 3,
        "backlog_count": 3,
        "keep_ms": 3_000,
        "switch_ms": 0,
        "restore_ms": 0,
        "service_ms": 250,
        "owner_job_ms": 1_000,
        "service_source": "helper",
        "helper_idle_ms": 1_234,
        "slots": 2,
    }


def test_the_planner_rejects_an_unknown_lane() -> None:
    with pytest.raises(ValueError):
        plan([(owner(3), [link(helper("h1"))])], table(), lane="audio")


LEASE = Lease(
    lane="text",
    owner_node_id="own",
    owner_model_id="m",
    helper_node_id="h1",
    helper_model_id="h",
    load_helper_model=True,
    restore_helper_model=True,
    helper_slots=2,
    probe=False,
    ttl_ms=30_000,
    owner_job_ms=1_000.0,
    helper_switch_ms=2_500.0,
    helper_service_ms=250.0,
)


def test_a_lease_survives_the_wire() -> None:
    doc = LEASE.to_wire()
    assert "probe" not in doc
    assert Lease.from_wire(doc) == LEASE
    assert LEASE.knows_speeds() is True


def test_a_probe_lease_says_so_on_the_wire_and_leaves_out_unknown_speeds() -> None:
    probe = Lease(
        **{**LEASE.__dict__, "probe": True, "owner_job_ms": None, "helper_service_ms": None}
    )
    doc = probe.to_wire()
    assert doc["probe"] is True
    assert "owner_job_ms" not in doc and "helper_service_ms" not in doc
    assert Lease.from_wire(doc) == probe
    assert probe.knows_speeds() is False


def test_a_lease_without_both_speeds_does_not_know_them() -> None:
    assert Lease(**{**LEASE.__dict__, "helper_service_ms": None}).knows_speeds() is False
    assert Lease(**{**LEASE.__dict__, "owner_job_ms": None}).knows_speeds() is False


@pytest.mark.parametrize("missing", ["owner_model_id", "helper_node_id", "helper_model_id"])
def test_a_lease_that_does_not_name_both_sides_is_refused(missing: str) -> None:
    doc = LEASE.to_wire()
    del doc[missing]
    with pytest.raises(ValueError):
        Lease.from_wire(doc)
    doc[missing] = ""
    with pytest.raises(ValueError):
        Lease.from_wire(doc)


def test_a_wire_lease_with_no_slots_lets_one_request_out() -> None:
    doc = {**LEASE.to_wire(), "helper_slots": 0}
    assert Lease.from_wire(doc).helper_slots == 1


def test_wire_speeds_that_are_not_measurements_read_as_unknown() -> None:
    doc = {**LEASE.to_wire(), "owner_job_ms": True, "helper_service_ms": "fast"}
    lease = Lease.from_wire(doc)
    assert (lease.owner_job_ms, lease.helper_service_ms) == (None, None)


# -- what is planned ------------------------------------------------------------------------


def test_a_backlog_of_streams_only_is_not_planned_and_leaves_the_helper_free() -> None:
    costs = table({("own", "m"): flat(1000), ("o2", "m"): flat(1000), ("h1", "h"): flat(250)})
    h1 = helper("h1")
    # The larger backlog is planned first; it holds nothing that can be lent.
    streams = Endpoint(**{**owner(9).__dict__, "lendable_count": 0})
    lendable = Endpoint(**{**owner(3, node="o2").__dict__, "lendable_count": 3})

    result = plan([(streams, [link(h1)]), (lendable, [link(h1)])], costs)

    assert [(lease.owner_node_id, lease.helper_node_id) for lease in result.leases] == [
        ("o2", "h1")
    ]
    assert [row.owner_node_id for row in result.rows] == ["o2"]


def test_an_owner_that_does_not_report_lendable_work_counts_every_held_request() -> None:
    costs = table({("own", "m"): flat(1000), ("h1", "h"): flat(250)})

    result = plan([(owner(3), [link(helper("h1"))])], costs)

    assert only_row(result).outcome == "granted"


def template_fit(base: float, per_output: float) -> CostFit:
    # One system prompt of ~300 tokens, answers of varying length.
    return CostFit(
        base_ms=base,
        slopes_ms=(0.0, per_output),
        samples=10,
        constant_work=(300.0, None),
        match_floor=16.0,
    )


def template_owner(held: int, prompt: float, output: float) -> Endpoint:
    # Every held request sized: `prompt` prompt tokens and `output` answer tokens on average.
    base = text_owner(held=held, sized=held, sized_context=0, pending_context=0)
    work = (held * prompt, held * output)
    return Endpoint(
        **{**base.__dict__, "pending_work": work, "sized_work": work, "backlog_work": work}
    )


def test_template_traffic_is_priced_by_its_answer_length() -> None:
    costs = table(
        {("own", "m"): template_fit(190, 20), ("h1", "h"): template_fit(50, 5)}, section="llm"
    )
    # Prompts three tokens longer than the fit saw, answers of 50 tokens on average.
    result = plan([(template_owner(4, 303, 50), [link(helper("h1"))])], costs, lane="text")

    row = only_row(result)
    assert (row.outcome, row.service_source) == ("granted", "helper")
    assert row.owner_job_ms == pytest.approx(190 + 20 * 50)
    assert row.keep_ms == pytest.approx(4 * 190 + 20 * 200)
    assert row.service_ms == pytest.approx(50 + 5 * 50)


def test_template_traffic_with_another_prompt_is_unpriced() -> None:
    costs = table(
        {("own", "m"): template_fit(190, 20), ("h1", "h"): template_fit(50, 5)}, section="llm"
    )

    result = plan([(template_owner(4, 400, 50), [link(helper("h1"))])], costs, lane="text")

    assert only_row(result).reason == "owner_unpriced"


# -- the owner's prompt cache ------------------------------------------------------------


# Prompt-heavy: a whole job is 100 + 1000 x 2 + 100 x 5 = 2600 ms; with 900 prompt tokens
# cached it is 100 + 100 x 2 + 500 = 800 ms.
PROMPT_FIT = CostFit(base_ms=100.0, slopes_ms=(2.0, 5.0), samples=20)


def test_the_owner_prices_its_work_without_the_cached_prefix_and_the_helper_with_it() -> None:
    costs = table({("own", "m"): PROMPT_FIT, ("h1", "h"): PROMPT_FIT}, section="llm")
    result = plan(
        [
            (
                text_owner(
                    held=4, sized=4, sized_context=0, pending_context=0, cached_prompt=900.0
                ),
                [link(helper("h1"))],
            )
        ],
        costs,
        lane="text",
    )

    row = only_row(result)
    assert row.owner_job_ms == 800
    assert row.keep_ms == 3_200
    # The helper holds no cache for these prompts: the whole 1000 tokens.
    assert row.service_ms == 2_600
    assert row.outcome == "granted"
    assert result.leases[0].owner_job_ms == 800


def test_a_cached_conversation_stays_home_where_lending_it_would_pay_without_the_cache() -> None:
    costs = table({("own", "m"): PROMPT_FIT, ("h1", "h"): PROMPT_FIT}, section="llm")
    uncached = plan(
        [
            (
                text_owner(held=2, sized=2, sized_context=0, pending_context=0, cached_prompt=0.0),
                [link(helper("h1", idle=1_000))],
            )
        ],
        costs,
        lane="text",
    )
    cached = plan(
        [
            (
                text_owner(
                    held=2, sized=2, sized_context=0, pending_context=0, cached_prompt=900.0
                ),
                [link(helper("h1", idle=1_000))],
            )
        ],
        costs,
        lane="text",
    )

    # The helper is idle too briefly for a probe. 2 x 2600 ms at home against one 2600 ms job
    # on the helper: lending pays.
    assert (only_row(uncached).outcome, only_row(uncached).keep_ms) == ("granted", 5_200)
    # 2 x 800 ms at home: the helper's 2600 ms no longer pays.
    assert (only_row(cached).outcome, only_row(cached).reason) == ("skipped", "cost_rejected")
    assert only_row(cached).keep_ms == 1_600


def test_cached_work_of_another_shape_is_ignored() -> None:
    costs = table({("own", "m"): PROMPT_FIT, ("h1", "h"): PROMPT_FIT}, section="llm")
    odd = dataclasses.replace(
        text_owner(held=2, sized=2, sized_context=0, pending_context=0), sized_cached=(900.0,)
    )
    assert only_row(plan([(odd, [link(helper("h1"))])], costs, lane="text")).keep_ms == 5_200
