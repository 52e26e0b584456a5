"""Which live leases a plan keeps although it did not grant them again (pure).

The planner plans only owners with held requests, so the plan after an owner lent its last
held request drops its lease. Under a steady stream a little faster than the owner, that is
two requests in three behind the owner's jobs: each arrival finds no lease, goes into the
owner's second slot, and only the one after it is held, reported, granted and lent.

A lease is kept instead, unchanged and not renewed (it still lapses at the expiry it was
granted with), while all of these hold:
- its owner has no request the plan could lend (none held, or only streams) but still runs
  its own work: the next arrival lands behind a running job, where the owner's hold may send
  it to the helper at once (`lending/hold.py`) instead of a master round trip later. An owner
  that has gone idle loses it: its next burst starts with a plan of its own, and the first
  requests of a burst do not go out one by one on a lease priced for other traffic (measured:
  a template burst 1.05x its optimum this way, 1.11x keeping the lease through idle time);
- it knows both speeds (never a probe: a probe is one request, and the next is the master's
  call);
- its helper is still linked, still accepting borrowed work, and no lease of this plan names
  the helper's node: an owner with held requests always comes first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from lending.planner import Endpoint, Lease, LinkTarget, PlanRow

LeaseKey = tuple[str, str, str]
"""(lane, owner node, owner model)."""

OUTCOME_KEPT = "kept"
REASON_NOTHING_HELD = "nothing_held"


@dataclasses.dataclass(frozen=True)
class Kept:
    """A lease a plan keeps: the lease (its TTL what it has left), its expiry, and its row."""

    lease: Lease
    expires: float
    row: PlanRow


def kept_leases(
    held: Mapping[LeaseKey, tuple[Lease, float]],
    planned: Mapping[LeaseKey, tuple[Lease, float]],
    owners: Mapping[str, Sequence[tuple[Endpoint, Sequence[LinkTarget]]]],
    now: float,
    trigger: str,
) -> dict[LeaseKey, Kept]:
    """The leases of ``held`` (the book before this plan: lease and expiry, in the master's
    seconds) that this plan keeps beside ``planned``, each with the milliseconds it has left
    as its TTL, so that an owner told of it again ends it when the master does.

    ``owners`` is this plan's owners by lane, with their link targets.
    """
    claimed = {(key[0], lease.helper_node_id) for key, (lease, _) in planned.items()}
    by_owner = {
        (lane, owner.node_id, owner.model_id): (owner, targets)
        for lane, items in owners.items()
        for owner, targets in items
    }
    kept: dict[LeaseKey, Kept] = {}
    for key, (lease, expires) in held.items():
        left_ms = int((expires - now) * 1000.0)
        if key in planned or left_ms <= 0 or not lease.knows_speeds():
            continue
        found = by_owner.get(key)
        if found is None or (key[0], lease.helper_node_id) in claimed:
            continue
        owner, targets = found
        if owner.lendable > 0 or owner.backlog_count <= 0:
            continue
        wanted = (lease.helper_node_id, lease.helper_model_id)
        helper = next(
            (t.helper for t in targets if (t.helper.node_id, t.helper.model_id) == wanted), None
        )
        if helper is None or not helper.eligible or not helper.accepting_borrowed:
            continue
        row = PlanRow(
            trigger,
            key[0],
            owner.node_id,
            owner.model_id,
            helper.node_id,
            helper.model_id,
            OUTCOME_KEPT,
            REASON_NOTHING_HELD,
            owner.pending_count,
            owner.backlog_count,
            0.0,
            lease.helper_switch_ms or 0.0,
            0.0,
            lease.helper_service_ms or 0.0,
            lease.owner_job_ms or 0.0,
            "",
            helper.idle_for_ms,
            lease.helper_slots,
        )
        kept[key] = Kept(dataclasses.replace(lease, ttl_ms=left_ms), expires, row)
    return kept
