"""The master's lease planner: which helper, if any, each owner may lend held work to.

Pure: no Django, no I/O, no clock. The master builds one ``Endpoint`` per linked model from
every node's runtime status and link set, calls ``plan_lane`` once per lane on every owner
event, on its tick and when a probe falls due, replaces its lease book with the leases and
writes the rows to the decision log (``kind="plan"``). Rules: reference-lending.md 3.3-3.9.

Where we deliberately differ from the reference:
* means of held work and context use only the entries that have a size estimate
  (``sized_*``), so unsized entries do not pull the mean towards zero and let a too-small
  helper past the context gate;
* plan rows log ``restore_ms`` beside ``switch_ms``, since the restore is part of the price;
* a helper granted to one owner may also serve another owner in the same plan (same helper
  model, priced lease) when that owner's first lent job still pays off after waiting behind
  the slots granted before it, with the spec's slots when the last of them still pays off
  too and the fewer slots otherwise; the reference gives each helper node to one owner per
  plan, and two owners then take the helper from each other on every event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from analytics.fitting import CostFit
from lending.pricing import LANE_IMAGE, LANE_TEXT, CostTable, owner_demand, service_price
from lending.wire import wire_bool, wire_int, wire_ms, wire_str

__all__ = [
    "OUTCOME_GRANTED",
    "OUTCOME_PROBE",
    "OUTCOME_SKIPPED",
    "Claim",
    "Endpoint",
    "HelperCost",
    "Lease",
    "LinkTarget",
    "OwnerPlan",
    "PlanResult",
    "PlanRow",
    "Progress",
    "Settings",
    "check_lane",
    "merge",
    "plan_lane",
    "plan_owner",
    "planned_owners",
]

OUTCOME_GRANTED = "granted"
OUTCOME_PROBE = "probe"
OUTCOME_SKIPPED = "skipped"

REASON_NOT_ACCEPTING = "helper_not_accepting"
REASON_CLAIMED = "helper_claimed"
REASON_LOAD_FORBIDDEN = "load_forbidden"
REASON_CONTEXT_TOO_SMALL = "context_too_small"
REASON_SWITCH_UNPRICED = "switch_unpriced"
REASON_RESTORE_UNPRICED = "restore_unpriced"
REASON_SERVICE_UNPRICED = "service_unpriced"
REASON_RECENTLY_BUSY = "helper_recently_busy"
REASON_OWNER_UNPRICED = "owner_unpriced"
REASON_COST_REJECTED = "cost_rejected"
REASON_OUTRANKED = "outranked"

# A helper that must switch models to take a probe waits this many probe-idle periods: a
# probe has no price to weigh against the helper's own traffic, and a switch is the costly
# part of a detour (spec "Probes").
UNLOADED_PROBE_IDLE_FACTOR = 12

# Work terms per lane, used for the mean of a queue whose entries are all unsized.
_LANE_WORK_TERMS: Mapping[str, int] = {LANE_IMAGE: 1, LANE_TEXT: 2}


@dataclass(frozen=True)
class Endpoint:
    """One model on one node as the planner sees it this instant."""

    node_id: str
    model_id: str
    config_filename: str
    loaded: bool
    accepting_borrowed: bool
    idle_for_ms: float
    context_capacity: int
    eligible: bool = True
    pending_count: int = 0
    # Held requests that can be lent (no streams, none that came back); None = not reported,
    # every held request counts.
    lendable_count: int | None = None
    pending_work: tuple[float, ...] = ()
    pending_context: int = 0
    sized_count: int = 0
    sized_work: tuple[float, ...] = ()
    sized_context: int = 0
    backlog_count: int = 0
    backlog_work: tuple[float, ...] = ()
    # Of sized_work and backlog_work, what this owner's prompt cache covers: () when none.
    sized_cached: tuple[float, ...] = ()
    backlog_cached: tuple[float, ...] = ()
    displaced_configs: tuple[str, ...] = ()

    @property
    def lendable(self) -> int:
        """Held requests that can be lent. A backlog of streams only can never be: a lease for
        it would tie up a helper that another owner could use."""
        return self.pending_count if self.lendable_count is None else self.lendable_count


@dataclass(frozen=True)
class LinkTarget:
    """A helper an owner links to, with that link's flags."""

    helper: Endpoint
    load_if_unloaded: bool
    restore_after_borrow: bool


@dataclass(frozen=True)
class Settings:
    probe_idle_ms: float
    faster_slots: int
    slower_slots: int
    probe_slots: int
    grant_ttl_ms: int


@dataclass(frozen=True)
class Lease:
    """Permission for an owner to keep up to ``helper_slots`` held requests lent to a helper."""

    lane: str
    owner_node_id: str
    owner_model_id: str
    helper_node_id: str
    helper_model_id: str
    load_helper_model: bool
    restore_helper_model: bool
    helper_slots: int
    probe: bool
    # The owner times the lease on its own clock, so master/owner clock skew cannot end it early.
    ttl_ms: int
    owner_job_ms: float | None
    helper_switch_ms: float | None  # switch plus restore, as planned
    helper_service_ms: float | None

    def knows_speeds(self) -> bool:
        """Whether the hold predicate may compare finish times under this lease."""
        if self.probe:
            return False
        return self.owner_job_ms is not None and self.helper_service_ms is not None

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "lane": self.lane,
            "owner_node_id": self.owner_node_id,
            "owner_model_id": self.owner_model_id,
            "helper_node_id": self.helper_node_id,
            "helper_model_id": self.helper_model_id,
            "load_helper_model": self.load_helper_model,
            "restore_helper_model": self.restore_helper_model,
            "helper_slots": self.helper_slots,
            "ttl_ms": self.ttl_ms,
        }
        if self.probe:
            doc["probe"] = True
        # An unmeasured speed is left out rather than sent as 0, which would read as "instant".
        for key, value in (
            ("owner_job_ms", self.owner_job_ms),
            ("helper_switch_ms", self.helper_switch_ms),
            ("helper_service_ms", self.helper_service_ms),
        ):
            if value is not None:
                doc[key] = value
        return doc

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> Lease:
        """Read a lease the master sent; ValueError when it does not say who lends to whom."""
        if not isinstance(doc, Mapping):
            raise ValueError("a lease must be a JSON object")
        for key in ("owner_model_id", "helper_node_id", "helper_model_id"):
            if not wire_str(doc, key):
                raise ValueError(f"lease has no {key}")
        return cls(
            lane=wire_str(doc, "lane"),
            owner_node_id=wire_str(doc, "owner_node_id"),
            owner_model_id=wire_str(doc, "owner_model_id"),
            helper_node_id=wire_str(doc, "helper_node_id"),
            helper_model_id=wire_str(doc, "helper_model_id"),
            load_helper_model=wire_bool(doc, "load_helper_model"),
            restore_helper_model=wire_bool(doc, "restore_helper_model"),
            # A lease always lets at least one request out (reference 3.9: <1 is treated as 1).
            helper_slots=max(1, wire_int(doc, "helper_slots", 1)),
            probe=wire_bool(doc, "probe"),
            ttl_ms=max(0, wire_int(doc, "ttl_ms", 0)),
            owner_job_ms=wire_ms(doc, "owner_job_ms"),
            helper_switch_ms=wire_ms(doc, "helper_switch_ms"),
            helper_service_ms=wire_ms(doc, "helper_service_ms"),
        )


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One ``plan`` decision-log row: how one helper was judged for one owner."""

    trigger: str
    lane: str
    owner_node_id: str
    owner_model_id: str
    helper_node_id: str
    helper_model_id: str
    outcome: str
    reason: str
    pending_count: int
    backlog_count: int
    keep_ms: float
    switch_ms: float
    restore_ms: float
    service_ms: float
    owner_job_ms: float
    service_source: str
    helper_idle_ms: float
    slots: int

    def as_fields(self) -> dict[str, Any]:
        """The row as ``offload_decisions`` columns (the caller adds ``kind="plan"``)."""
        return {
            "trigger": self.trigger,
            "lane": self.lane,
            "owner_node_id": self.owner_node_id,
            "owner_model_id": self.owner_model_id,
            "helper_node_id": self.helper_node_id,
            "helper_model_id": self.helper_model_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "pending_count": self.pending_count,
            "backlog_count": self.backlog_count,
            "keep_ms": self.keep_ms,
            "switch_ms": self.switch_ms,
            "restore_ms": self.restore_ms,
            "service_ms": self.service_ms,
            "owner_job_ms": self.owner_job_ms,
            "service_source": self.service_source,
            # An INTEGER column.
            "helper_idle_ms": int(self.helper_idle_ms),
            "slots": self.slots,
        }


@dataclass(frozen=True)
class PlanResult:
    leases: list[Lease] = field(default_factory=list)
    rows: list[PlanRow] = field(default_factory=list)
    # Milliseconds until some helper held back only by its idle time may take a probe.
    probe_due_ms: float | None = None


@dataclass(slots=True)
class _Demand:
    """What an owner's held work looks like and what it costs the owner alone."""

    mean_work: tuple[float, ...]
    mean_context: int
    keep_ms: float | None
    job_ms: float | None
    priced: bool
    # The owner's fit, set only when the owner is priced: a helper without a fit of its own
    # is then priced with it (reference 2.6).
    fallback_fit: CostFit | None


@dataclass(slots=True)
class HelperCost:
    """The part of a helper's price that does not depend on the owner (once per plan)."""

    endpoint: Endpoint
    fit: CostFit | None
    switch_ms: float | None
    restore_ms: float | None
    probe_bar_ms: float


@dataclass(slots=True)
class _Candidate:
    """One helper evaluated for one owner."""

    target: LinkTarget
    ineligible: str  # first failing eligibility check, "" when eligible
    unpriced: str  # first missing price, "" when fully priced
    switch_ms: float | None
    restore_ms: float | None
    service_ms: float | None
    service_source: str
    total_ms: float | None  # switch + restore + service, None unless fully priced
    probe_bar_ms: float
    # Slots this plan already granted other owners on the same helper model: this owner's
    # first lent job waits behind them.
    ahead: int = 0


@dataclass(frozen=True, slots=True)
class Claim:
    """What a plan already granted on one helper node."""

    model_id: str
    slots: int
    probe: bool


def _backlog_magnitude(owner: Endpoint) -> float:
    return sum(owner.backlog_work)


def uncached(work: tuple[float, ...], cached: tuple[float, ...]) -> tuple[float, ...]:
    """`work` less what the owner's cache covers; `cached` of another shape is ignored."""
    if len(cached) != len(work):
        return work
    return tuple(max(0.0, w - c) for w, c in zip(work, cached, strict=True))


def _demand(lane: str, owner: Endpoint, costs: CostTable) -> _Demand:
    # Unsized entries (no token profile, image without a size) carry zero work; averaging
    # over them as the reference does understates both the job price and the context the
    # queue needs, so the means use the sized entries whenever there are any.
    cached: tuple[float, ...] = ()
    if owner.sized_count > 0:
        count, work, context = owner.sized_count, owner.sized_work, owner.sized_context
        cached = owner.sized_cached
    else:
        count, work, context = owner.pending_count, owner.pending_work, owner.pending_context
        if not work:
            work = (0.0,) * _LANE_WORK_TERMS.get(lane, 1)
    mean_work = tuple(w / count for w in work)
    fit = costs.fit(owner.node_id, owner.model_id, lane)
    # The owner prices its own work without the prompt prefixes its backend holds in cache;
    # a helper has no cache for them, so its service price keeps the whole work (mean_work).
    keep_ms, job_ms = owner_demand(
        fit,
        mean_work=tuple(w / count for w in uncached(work, cached)),
        backlog_count=owner.backlog_count,
        backlog_work=uncached(owner.backlog_work, owner.backlog_cached),
    )
    priced = keep_ms is not None and job_ms is not None
    return _Demand(
        mean_work=mean_work,
        mean_context=context // count,
        keep_ms=keep_ms,
        job_ms=job_ms,
        priced=priced,
        fallback_fit=fit if priced else None,
    )


def _restore_ms(helper: Endpoint, costs: CostTable) -> float | None:
    if helper.loaded:
        return 0.0
    total = 0.0
    for config in helper.displaced_configs:
        load = costs.load_ms(helper.node_id, config)
        if load is None:
            # Displacing a model whose way back is unknown could cost the helper anything.
            return None
        total += load
    return total


def _helper_cost(lane: str, helper: Endpoint, costs: CostTable, settings: Settings) -> HelperCost:
    return HelperCost(
        endpoint=helper,
        fit=costs.fit(helper.node_id, helper.model_id, lane),
        switch_ms=0.0 if helper.loaded else costs.load_ms(helper.node_id, helper.config_filename),
        restore_ms=_restore_ms(helper, costs),
        probe_bar_ms=settings.probe_idle_ms * (1 if helper.loaded else UNLOADED_PROBE_IDLE_FACTOR),
    )


def _first_ineligibility(
    lane: str, demand: _Demand, target: LinkTarget, claim: Claim | None, shared: bool
) -> str:
    """The first check this helper fails before any price is looked at ("" when none)."""
    helper = target.helper
    if not helper.accepting_borrowed:
        return REASON_NOT_ACCEPTING
    if claim is not None and not shared:
        return REASON_CLAIMED
    if not helper.loaded and not target.load_if_unloaded:
        return REASON_LOAD_FORBIDDEN
    if (
        lane == LANE_TEXT
        and demand.mean_context > 0
        and helper.context_capacity < demand.mean_context
    ):
        return REASON_CONTEXT_TOO_SMALL
    return ""


def _unpriced(switch_ms: float | None, restore_ms: float | None, service_ms: float | None) -> str:
    if switch_ms is None:
        return REASON_SWITCH_UNPRICED
    if restore_ms is None:
        return REASON_RESTORE_UNPRICED
    if service_ms is None:
        return REASON_SERVICE_UNPRICED
    return ""


def _evaluate(
    *,
    lane: str,
    demand: _Demand,
    target: LinkTarget,
    cost: HelperCost,
    claimed: Mapping[str, Claim],
) -> _Candidate:
    helper = target.helper
    claim = claimed.get(helper.node_id)
    # A helper already granted to another owner may be shared, but only on the same model
    # (another model would switch it back and forth) and only under a priced lease.
    shared = claim is not None and claim.model_id == helper.model_id and not claim.probe
    ahead = claim.slots if claim is not None and shared else 0
    ineligible = _first_ineligibility(lane, demand, target, claim, shared)

    switch_ms, restore_ms = cost.switch_ms, cost.restore_ms
    service_ms, source = service_price(cost.fit, demand.fallback_fit, demand.mean_work)
    unpriced = _unpriced(switch_ms, restore_ms, service_ms)
    total_ms: float | None = None
    if not unpriced:
        assert switch_ms is not None and restore_ms is not None and service_ms is not None
        total_ms = switch_ms + restore_ms + service_ms * (1 + ahead)
        if not ineligible and not helper.loaded and helper.idle_for_ms < switch_ms + restore_ms:
            # Its own traffic is likely back before the detour pays for itself.
            ineligible = REASON_RECENTLY_BUSY
    if claim is not None and not ineligible:
        keep = demand.keep_ms if demand.priced else None
        if total_ms is None or keep is None or total_ms >= keep:
            # Waiting behind the other owner's lent work does not pay (or cannot be priced).
            ineligible = REASON_CLAIMED

    return _Candidate(
        target=target,
        ineligible=ineligible,
        unpriced=unpriced,
        switch_ms=switch_ms,
        restore_ms=restore_ms,
        service_ms=service_ms,
        service_source=source,
        total_ms=total_ms,
        probe_bar_ms=cost.probe_bar_ms,
        ahead=ahead,
    )


def _cost_reason(candidate: _Candidate, demand: _Demand) -> str:
    """Why the cost rule did not grant this helper, ignoring the other helpers."""
    if candidate.ineligible:
        return candidate.ineligible
    if not demand.priced:
        return REASON_OWNER_UNPRICED
    if candidate.unpriced:
        return candidate.unpriced
    total = candidate.total_ms
    assert total is not None and demand.keep_ms is not None
    if total >= demand.keep_ms:
        return REASON_COST_REJECTED
    return ""


def _node_order(candidate: _Candidate) -> tuple[str, str]:
    helper = candidate.target.helper
    return helper.node_id, helper.model_id


def _grant(
    lane: str,
    owner: Endpoint,
    demand: _Demand,
    best: _Candidate,
    choice: _Choice,
    claimed: dict[str, Claim],
    settings: Settings,
) -> Lease:
    """The lease of the chosen candidate; its helper node is claimed for the rest of the plan,
    with every slot granted on it so far."""
    chosen = best.target.helper
    before = claimed.get(chosen.node_id)
    claimed[chosen.node_id] = Claim(
        chosen.model_id,
        choice.slots + (before.slots if before is not None else 0),
        choice.outcome == OUTCOME_PROBE,
    )
    return _lease(
        lane=lane,
        owner=owner,
        demand=demand,
        candidate=best,
        slots=choice.slots,
        probe=choice.outcome == OUTCOME_PROBE,
        settings=settings,
    )


def _lease(
    *,
    lane: str,
    owner: Endpoint,
    demand: _Demand,
    candidate: _Candidate,
    slots: int,
    probe: bool,
    settings: Settings,
) -> Lease:
    switch = candidate.switch_ms
    restore = candidate.restore_ms
    service = candidate.service_ms
    # The hold's helper clock starts with the whole detour: restore, and on a shared helper the
    # other owners' lent jobs this owner's first job waits behind.
    detour = None
    if switch is not None and restore is not None:
        detour = switch + restore + (service or 0.0) * candidate.ahead
    return Lease(
        lane=lane,
        owner_node_id=owner.node_id,
        owner_model_id=owner.model_id,
        helper_node_id=candidate.target.helper.node_id,
        helper_model_id=candidate.target.helper.model_id,
        load_helper_model=candidate.target.load_if_unloaded,
        restore_helper_model=candidate.target.restore_after_borrow,
        helper_slots=max(1, slots),
        probe=probe,
        ttl_ms=settings.grant_ttl_ms,
        owner_job_ms=demand.job_ms,
        helper_switch_ms=detour,
        helper_service_ms=service,
    )


@dataclass(frozen=True, slots=True)
class _Choice:
    """Which candidate an owner gets, how, and with how many slots (index None: nobody)."""

    index: int | None
    outcome: str
    slots: int


_NOBODY = _Choice(None, OUTCOME_SKIPPED, 0)


def _candidates(
    lane: str,
    demand: _Demand,
    targets: Sequence[LinkTarget],
    costs: CostTable,
    settings: Settings,
    claimed: Mapping[str, Claim],
    helper_costs: dict[int, HelperCost],
) -> list[_Candidate]:
    out: list[_Candidate] = []
    for target in targets:
        helper = target.helper
        if not helper.eligible:
            # A model whose config became ineligible is skipped silently, as if unlinked.
            continue
        # A helper linked from several owners is priced once. Keyed by identity (hashing the
        # whole frozen Endpoint costs more than pricing it); the stored endpoint guards
        # against an id reused by a caller that builds endpoints on the fly.
        cost = helper_costs.get(id(helper))
        if cost is None or cost.endpoint is not helper:
            cost = helper_costs[id(helper)] = _helper_cost(lane, helper, costs, settings)
        out.append(_evaluate(lane=lane, demand=demand, target=target, cost=cost, claimed=claimed))
    return out


def _choose(
    candidates: Sequence[_Candidate], reasons: Sequence[str], demand: _Demand, settings: Settings
) -> _Choice:
    """The cost rule's cheapest paying helper, else the longest-idle probe, else nobody."""
    paying = [i for i, reason in enumerate(reasons) if not reason]
    if paying:
        index = min(paying, key=lambda i: (candidates[i].total_ms, *_node_order(candidates[i])))
        service, job = candidates[index].service_ms, demand.job_ms
        assert service is not None and job is not None
        slots = settings.faster_slots if service <= job else settings.slower_slots
        if candidates[index].ahead:
            slots = _shared_slots(candidates[index], demand, slots, settings)
        return _Choice(index, OUTCOME_GRANTED, slots)
    idle_enough = [
        i
        for i, candidate in enumerate(candidates)
        if not candidate.ineligible
        and candidate.target.helper.idle_for_ms >= candidate.probe_bar_ms
    ]
    if not idle_enough:
        return _NOBODY
    index = min(
        idle_enough,
        key=lambda i: (-candidates[i].target.helper.idle_for_ms, *_node_order(candidates[i])),
    )
    return _Choice(index, OUTCOME_PROBE, settings.probe_slots)


def _shared_slots(candidate: _Candidate, demand: _Demand, slots: int, settings: Settings) -> int:
    """The slots an owner gets on a helper another owner was granted first in this plan.

    The helper's queue is shared, so the spec's slots (more when the helper is no slower) hold
    only while the last of them, queued behind every slot granted before, still finishes
    before the owner would alone; otherwise the owner adds the fewer slots.
    """
    if slots <= settings.slower_slots:
        return slots
    total, service, keep = candidate.total_ms, candidate.service_ms, demand.keep_ms
    assert total is not None and service is not None and keep is not None
    last = total + service * (slots - 1)
    return slots if last < keep else settings.slower_slots


def _rows(
    *,
    trigger: str,
    lane: str,
    owner: Endpoint,
    demand: _Demand,
    candidates: Sequence[_Candidate],
    reasons: Sequence[str],
    choice: _Choice,
) -> list[PlanRow]:
    rows: list[PlanRow] = []
    for i, candidate in enumerate(candidates):
        helper = candidate.target.helper
        if i == choice.index:
            # A probe keeps the reason the cost rule passed it over.
            outcome, reason, slots = choice.outcome, reasons[i], choice.slots
        else:
            outcome, reason, slots = OUTCOME_SKIPPED, reasons[i] or REASON_OUTRANKED, 0
        # Positional: this runs once per evaluated pair on every owner event.
        rows.append(
            PlanRow(
                trigger,
                lane,
                owner.node_id,
                owner.model_id,
                helper.node_id,
                helper.model_id,
                outcome,
                reason,
                owner.pending_count,
                owner.backlog_count,
                demand.keep_ms or 0.0,
                candidate.switch_ms or 0.0,
                candidate.restore_ms or 0.0,
                candidate.service_ms or 0.0,
                demand.job_ms or 0.0,
                candidate.service_source,
                helper.idle_for_ms,
                slots,
            )
        )
    return rows


def _probe_wait(candidates: Sequence[_Candidate]) -> float | None:
    """How long until the first helper held back only by its idle time may take a probe."""
    waits = [
        candidate.probe_bar_ms - candidate.target.helper.idle_for_ms
        for candidate in candidates
        if not candidate.ineligible
    ]
    positive = [wait for wait in waits if wait > 0]
    return min(positive) if positive else None


@dataclass(frozen=True, slots=True)
class OwnerPlan:
    """What planning one owner gave: its lease or none, its rows, and its probe wait."""

    lease: Lease | None
    rows: list[PlanRow]
    # Until a helper held back only by its idle time may take a probe; only when no lease.
    probe_wait_ms: float | None


@dataclass(slots=True)
class Progress:
    """What one plan carries from one owner to the next: the claims granted so far, and the
    helpers already priced (the planner's result does not depend on the latter)."""

    claimed: dict[str, Claim] = field(default_factory=dict)
    helper_costs: dict[int, HelperCost] = field(default_factory=dict)


def planned_owners(
    owners: Sequence[tuple[Endpoint, Sequence[LinkTarget]]],
) -> list[tuple[Endpoint, Sequence[LinkTarget]]]:
    """The owners a plan considers, in the order it grants them: the deepest backlog first."""
    return sorted(
        (item for item in owners if item[0].lendable > 0 and item[0].eligible),
        key=lambda item: (-_backlog_magnitude(item[0]), item[0].node_id, item[0].model_id),
    )


def plan_owner(
    lane: str,
    trigger: str,
    owner: tuple[Endpoint, Sequence[LinkTarget]],
    costs: CostTable,
    settings: Settings,
    progress: Progress,
) -> OwnerPlan | None:
    """Plan one owner after the owners before it; None when none of its helpers is eligible.

    Reads ``progress.claimed`` only for its own helpers' nodes, and adds its grant's claim.
    """
    endpoint, targets = owner
    demand = _demand(lane, endpoint, costs)
    candidates = _candidates(
        lane, demand, targets, costs, settings, progress.claimed, progress.helper_costs
    )
    if not candidates:
        return None
    reasons = [_cost_reason(candidate, demand) for candidate in candidates]
    choice = _choose(candidates, reasons, demand, settings)
    rows = _rows(
        trigger=trigger,
        lane=lane,
        owner=endpoint,
        demand=demand,
        candidates=candidates,
        reasons=reasons,
        choice=choice,
    )
    if choice.index is None:
        # Nothing granted: wake the master again once some helper has idled long enough.
        return OwnerPlan(None, rows, _probe_wait(candidates))
    best = candidates[choice.index]
    lease = _grant(lane, endpoint, demand, best, choice, progress.claimed, settings)
    return OwnerPlan(lease, rows, None)


def plan_lane(
    *,
    lane: str,
    trigger: str,
    owners: Sequence[tuple[Endpoint, Sequence[LinkTarget]]],
    costs: CostTable | None,
    settings: Settings,
) -> PlanResult:
    """Plan one lane: at most one lease per owner.

    A helper node granted to one owner is claimed for the rest of the plan: another owner
    may share it only on the same helper model, under a priced lease, when its first lent job
    still pays off after waiting behind the slots granted before it (with the fewer slots
    unless its last slot pays off too: ``_shared_slots``); otherwise that owner sees it as
    ``helper_claimed``.
    """
    if costs is None:
        # No cost source yet: the reference plans nothing at all, not even probes.
        return PlanResult()
    check_lane(lane)
    progress = Progress()
    planned = [
        plan_owner(lane, trigger, item, costs, settings, progress)
        for item in planned_owners(owners)
    ]
    return merge(planned)


def check_lane(lane: str) -> None:
    if lane not in _LANE_WORK_TERMS:
        raise ValueError(f"unknown lane {lane!r}")


def merge(planned: Sequence[OwnerPlan | None]) -> PlanResult:
    """One lane's result from its owners' plans, in plan order."""
    leases: list[Lease] = []
    rows: list[PlanRow] = []
    waits: list[float] = []
    for one in planned:
        if one is None:
            continue
        rows.extend(one.rows)
        if one.lease is not None:
            leases.append(one.lease)
        if one.probe_wait_ms is not None:
            waits.append(one.probe_wait_ms)
    return PlanResult(leases=leases, rows=rows, probe_due_ms=min(waits) if waits else None)
