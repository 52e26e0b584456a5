"""Holding a request for a faster helper (owner side, `offload_hold_for_faster_helper`).

An owner that is already generating does not always fill its second backend slot with the
next waiting request: if a lease is live, every lent slot is busy, the lease knows both speeds
(never a probe), and the helper is predicted to finish that request strictly sooner than the
owner would (the owner's current job plus this one, against the helper's remaining lent jobs
plus this one), the request keeps waiting and goes to the helper on the master's next answer.
The queue consults this only for a slot behind a running job of the same model, so the owner
never idles because of a hold.

The same comparison with a lent slot free sends the request to the helper at once rather than
into the owner's second slot: a steady stream a little faster than the owner then goes to the
faster helper as it arrives, under a lease the master keeps while the owner runs
(lending/carry.py), instead of two requests in three waiting behind the owner's jobs.

A held request is released once the helper has taken longer than its predicted finish plus one
job: a timer re-runs admission at that moment, so the release does not wait for another queue
event.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from analytics.fitting import CostFit
from lending.planner import uncached
from lending.pricing import helper_finish_ms, owner_finish_ms, section_fit
from lending.queue import Entry, LaneQueue

if TYPE_CHECKING:
    from lending.planner import Lease
    from lending.ports import ServingNode


def entry_prices(
    fit: CostFit | None, entry: Entry, job_ms: float, service_ms: float
) -> tuple[float, float]:
    """(owner, helper) price of this request rather than of the mean request a lease priced.

    The lease carries both prices for the mean; this request is priced with the owner's own
    fit and the helper's price scaled by the same ratio, so a long request goes to a faster
    helper and a short one does not wait behind a long lent job for nothing. The owner's price
    leaves out the prompt prefix its backend holds in cache; the helper's keeps it (it holds
    no cache for it), so a second turn the owner has cached stays home, whatever traffic the
    lease was priced on.
    """
    whole = fit.predict(entry.work) if fit is not None and entry.work else None
    if whole is None or fit is None or job_ms <= 0:
        return job_ms, service_ms
    own = fit.predict(uncached(entry.work, entry.cached)) if entry.cached else whole
    return (whole if own is None else own), service_ms * whole / job_ms


def owner_fit(node: ServingNode, lane: str, model_id: str) -> CostFit | None:
    """This owner's own cost fit of the model, if it has one."""
    costs = node.lending.costs
    return section_fit(costs.models, lane, model_id) if costs is not None else None


def lease_helper_finish_ms(
    now_ms: float, lent: Sequence[Entry], lease: Lease, fit: CostFit | None, this_job_ms: float
) -> float:
    """When the lease's helper would finish one more job (`this_job_ms`) behind the requests
    lent to it, each priced as itself (`entry_prices`)."""
    job, service = lease.owner_job_ms or 0.0, lease.helper_service_ms or 0.0
    out = [(e.lent_at * 1000.0, e) for e in lent if e.lent_at is not None]
    return helper_finish_ms(
        now_ms=now_ms,
        lent_at_ms=[at for at, _ in out],
        switch_ms=lease.helper_switch_ms or 0.0,
        service_ms=service,
        this_job_ms=this_job_ms,
        lent_job_ms=[entry_prices(fit, e, job, service)[1] for _, e in out],
    )


def own_job_ms(fit: CostFit | None, admitted: Sequence[Entry], job_ms: float) -> float:
    """The owner's mean price of its admitted jobs, each priced as itself (`entry_prices`)."""
    if not admitted:
        return job_ms
    return statistics.fmean(entry_prices(fit, e, job_ms, 0.0)[0] for e in admitted)


class HoldPolicy:
    def __init__(self, node: ServingNode, lane: str) -> None:
        self.node = node
        self.lane = lane
        self.deadline_ms: dict[int, float] = {}
        """Held entry → the moment (ms) past which it is released regardless."""
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def _predict(self, entry: Entry, queue: LaneQueue, now_ms: float) -> tuple[float, float] | None:
        lending = self.node.lending
        if not lending.settings.hold_for_faster_helper:
            return None
        lease = self.node.owner.live(self.lane, entry.model_id)
        if lease is None or not lease.knows_speeds():
            return None
        # Slots are per helper: requests still out with a helper the lease moved away from
        # do not keep this one's slots busy.
        lent = queue.lent_to(entry.model_id, (lease.helper_node_id, lease.helper_model_id))
        admitted = queue.admitted(entry.model_id)
        starts = [e.admitted_at * 1000.0 for e in admitted if e.admitted_at is not None]
        fit = owner_fit(self.node, self.lane, entry.model_id)
        service = lease.helper_service_ms or 0.0
        own_price, helper_price = entry_prices(fit, entry, lease.owner_job_ms or 0.0, service)
        job = own_job_ms(fit, admitted, lease.owner_job_ms or 0.0)
        last = lending.last_completion_ms.get((self.lane, entry.model_id))
        owner = owner_finish_ms(
            now_ms=now_ms,
            oldest_admitted_start_ms=min(starts) if starts else now_ms,
            last_own_completion_ms=last,
            in_flight=len(admitted),
            job_ms=job,
            this_job_ms=own_price,
        )
        return owner, lease_helper_finish_ms(now_ms, lent, lease, fit, helper_price)

    def __call__(self, entry: Entry, queue: LaneQueue, now: float) -> bool:
        now_ms = now * 1000.0
        deadline = self.deadline_ms.get(id(entry))
        if deadline is not None and now_ms > deadline:
            return False
        predicted = self._predict(entry, queue, now_ms)
        if predicted is None:
            return False
        owner, helper = predicted
        return helper < owner

    def on_held(self, entry: Entry, now: float) -> None:
        """First hold of an entry: log it and arm its release timer; with a lent slot free,
        lend it as soon as this admission pass is over."""
        queue = self.node.lending.queue(self.lane)
        now_ms = now * 1000.0
        predicted = self._predict(entry, queue, now_ms)
        lease = self.node.owner.live(self.lane, entry.model_id)
        if predicted is None or lease is None:
            return
        owner, helper = predicted
        service = lease.helper_service_ms or 0.0
        self.deadline_ms[id(entry)] = helper + service
        lent = queue.lent_to(entry.model_id, (lease.helper_node_id, lease.helper_model_id))
        loop = asyncio.get_running_loop()
        if len(lent) < max(1, lease.helper_slots):
            # Not a wait: the helper has room and finishes it first, so it goes there now
            # (its `lent` row says why) instead of into the owner's second slot. The queue
            # must not change during admission, hence the next turn of the loop. Should it
            # not be lent after all, the owner's running job ending admits it.
            loop.call_soon(self.node.owner.lend_held, self.lane, entry)
            return
        delay = max(0.0, (helper + service - now_ms) / 1000.0) + 0.001
        self._timers[id(entry)] = loop.call_later(delay, self._release, id(entry))
        self.node.decisions.record(
            kind="dispatch",
            lane=self.lane,
            owner_node_id=self.node.node_id,
            owner_model_id=entry.model_id,
            helper_node_id=lease.helper_node_id,
            helper_model_id=lease.helper_model_id,
            outcome="held_for_helper",
            reason="helper_finishes_sooner",
            keep_ms=owner - now_ms,
            switch_ms=lease.helper_switch_ms or 0.0,
            service_ms=service,
            owner_job_ms=lease.owner_job_ms or 0.0,
            slots=lease.helper_slots,
            lent_out=len(queue.lent(entry.model_id)),
            wait_ms=int(now_ms - entry.arrived_at * 1000.0),
            request_id=entry.request_id,
            key_name=entry.tenant or None,
        )

    def _release(self, key: int) -> None:
        from lending.runtime import _wake

        self._timers.pop(key, None)
        queue = self.node.lending.queues.get(self.lane)
        if queue is not None:
            _wake(queue.reevaluate())

    def forget(self, entry: Entry) -> None:
        self.deadline_ms.pop(id(entry), None)
        timer = self._timers.pop(id(entry), None)
        if timer is not None:
            timer.cancel()
