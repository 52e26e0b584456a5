"""The lease planner, re-planning only the owners whose plan can have changed since the last one.

Pure: no Django, no I/O, no clock. ``LanePlanner.plan`` takes what ``planner.plan_lane`` takes
and returns what it returns, for the same inputs, exactly: leases, rows and probe wait.

Why that holds. ``plan_lane`` plans its owners one after the other (``planned_owners``), and
one owner's plan (``plan_owner``) is a function of the lane, the trigger, the settings, the
owner's endpoint, its link targets, a few entries of the cost table (its own fit, and each
helper's fit, load and displaced models' loads) and the claims the owners before it left on
its helpers' nodes. Its only effect on the owners after it is the claim it leaves on the node
of the helper it was granted. So each owner's last plan is kept with every input it read; an
owner whose inputs all compare equal now gets that plan again (and leaves the same claim),
any other is planned afresh. A changed owner is therefore re-planned, and so is every owner
after it whose helpers it claims differently, transitively, as far as the change reaches and
no further: an owner that shares no helper node with a changed one reads the same claims.

Kept plans are compared, not trusted: the cost of a plan is one comparison per owner and link
plus the pricing of the owners that changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from analytics.fitting import CostFit
from lending.planner import (
    Claim,
    Endpoint,
    LinkTarget,
    OwnerPlan,
    PlanResult,
    Progress,
    Settings,
    check_lane,
    merge,
    plan_owner,
    planned_owners,
)
from lending.pricing import CostTable

__all__ = ["LanePlanner"]

# What a plan reads of the cost table for one helper: its fit, its load, its displaced loads.
_HelperCosts = tuple[CostFit | None, float | None, tuple[float | None, ...]]
_CostReads = tuple[CostFit | None, tuple[_HelperCosts, ...]]


@dataclass(slots=True)
class _Kept:
    """One owner's last plan and every input it was computed from."""

    owner: Endpoint
    targets: tuple[LinkTarget, ...]
    nodes: tuple[str, ...]  # the targets' helper nodes, whose claims the plan read
    costs: _CostReads
    claims: tuple[Claim | None, ...]
    # The cost table the plan was last found current against: while the next plan's table is
    # that one, its cost reads need no comparing.
    table: CostTable
    plan: OwnerPlan | None
    trigger: str
    # The claim the plan left, on which helper node; None when it granted nothing.
    left: tuple[str, Claim] | None


def _cost_reads(
    lane: str, owner: Endpoint, targets: Sequence[LinkTarget], costs: CostTable
) -> _CostReads:
    # Every entry plan_owner may read, whether or not it reads it this time: a superset only
    # re-plans more often, never less.
    helpers = []
    for target in targets:
        helper = target.helper
        node = helper.node_id
        helpers.append(
            (
                costs.fit(node, helper.model_id, lane),
                costs.load_ms(node, helper.config_filename),
                tuple(costs.load_ms(node, config) for config in helper.displaced_configs),
            )
        )
    return costs.fit(owner.node_id, owner.model_id, lane), tuple(helpers)


def _claims(nodes: tuple[str, ...], progress: Progress) -> tuple[Claim | None, ...]:
    return tuple(map(progress.claimed.get, nodes))


def _with_trigger(plan: OwnerPlan | None, trigger: str) -> OwnerPlan | None:
    if plan is None:
        return None
    rows = [replace(row, trigger=trigger) for row in plan.rows]
    return OwnerPlan(plan.lease, rows, plan.probe_wait_ms)


class LanePlanner:
    """``plan_lane`` for one lane, keeping each owner's last plan between calls."""

    def __init__(self, lane: str) -> None:
        check_lane(lane)
        self.lane = lane
        self._kept: dict[tuple[str, str], _Kept] = {}
        self._settings: Settings | None = None
        self._table: CostTable | None = None
        self.replanned = 0
        """Owners the last plan planned afresh (the others got their kept plan)."""
        self.reused = 0

    def plan(
        self,
        *,
        trigger: str,
        owners: Sequence[tuple[Endpoint, Sequence[LinkTarget]]],
        costs: CostTable | None,
        settings: Settings,
    ) -> PlanResult:
        """What ``plan_lane`` answers for these inputs."""
        self.replanned = self.reused = 0
        if costs is None:
            self._kept = {}
            return PlanResult()
        if settings != self._settings:
            self._kept = {}
            self._settings = settings
        if self._table is not None and costs is not self._table and costs == self._table:
            # The same fits and loads in a new table: kept plans need not look them up again.
            costs = self._table
        self._table = costs
        progress = Progress()
        kept: dict[tuple[str, str], _Kept] = {}
        planned: list[OwnerPlan | None] = []
        for owner, targets in planned_owners(owners):
            key = (owner.node_id, owner.model_id)
            one = self._reuse(self._kept.get(key), owner, targets, costs, progress, trigger)
            if one is None:
                one = self._replan(owner, targets, costs, settings, progress, trigger)
            kept[key] = one
            planned.append(one.plan)
        self._kept = kept
        return merge(planned)

    def _reuse(
        self,
        last: _Kept | None,
        owner: Endpoint,
        targets: Sequence[LinkTarget],
        costs: CostTable,
        progress: Progress,
        trigger: str,
    ) -> _Kept | None:
        """The kept plan when every input it read is unchanged (its claim left again)."""
        # Identity first: an endpoint the caller kept is not compared field by field.
        if last is None or (last.owner is not owner and last.owner != owner):
            return None
        if last.targets != tuple(targets) or last.claims != _claims(last.nodes, progress):
            return None
        if last.table is not costs:
            if last.costs != _cost_reads(self.lane, owner, targets, costs):
                return None
            last.table = costs
        if last.left is not None:
            node, claim = last.left
            progress.claimed[node] = claim
        if last.trigger != trigger:
            last.plan = _with_trigger(last.plan, trigger)
            last.trigger = trigger
        self.reused += 1
        return last

    def _replan(
        self,
        owner: Endpoint,
        targets: Sequence[LinkTarget],
        costs: CostTable,
        settings: Settings,
        progress: Progress,
        trigger: str,
    ) -> _Kept:
        nodes = tuple(target.helper.node_id for target in targets)
        claims = _claims(nodes, progress)
        plan = plan_owner(self.lane, trigger, (owner, targets), costs, settings, progress)
        left = None
        if plan is not None and plan.lease is not None:
            node = plan.lease.helper_node_id
            left = (node, progress.claimed[node])
        self.replanned += 1
        return _Kept(
            owner=owner,
            targets=tuple(targets),
            nodes=nodes,
            costs=_cost_reads(self.lane, owner, targets, costs),
            claims=claims,
            table=costs,
            plan=plan,
            trigger=trigger,
            left=left,
        )
