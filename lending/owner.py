"""The owner's side of lending: report queue events, install leases, lend held requests.

The master decides; the owner executes. An owner reports every queue event of a model that
lends (a new held request, a finished own job, a finished or returned lent job) to the master,
coalesced per (lane, model): one report in flight, one queued behind it, the latest trigger
wins. Each answer is a lease (helper, slots, ttl) or none. Under a live lease the owner lends
its newest held requests (never pinned or returned ones) until `slots` are out; it never
recalls one. A lease lapses at its TTL on the owner's own clock.

A lent request stays with the client's own coroutine: its wait for admission ends with the
lease instead of a slot, and that coroutine relays the request through the master and answers
its client. If the request comes back (409, or the helper fails before answering), it goes to
the head of the queue with its first arrival time and the owner runs it itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lending.hold import entry_prices, lease_helper_finish_ms, own_job_ms, owner_fit
from lending.planner import Lease
from lending.pricing import owner_finish_ms
from lending.queue import Entry, State

if TYPE_CHECKING:
    from lending.ports import ServingNode

logger = logging.getLogger(__name__)

# Reason on a `lent` row written when a finished lent request's slot was filled at once.
REFILLED = "refilled"
# Reason on a `lent` row for a request sent to a helper with a free slot instead of into the
# owner's second slot, because the helper finishes it first.
HELPER_FINISHES_SOONER = "helper_finishes_sooner"


@dataclass
class LiveLease:
    lease: Lease
    expires_at: float  # on this owner's clock


class OwnerLending:
    """Per router process: live leases by (lane, model) and the event coalescer."""

    def __init__(self, node: ServingNode) -> None:
        self.node = node
        self.leases: dict[tuple[str, str], LiveLease] = {}
        self._inflight: set[tuple[str, str]] = set()
        self._queued: dict[tuple[str, str], str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.image_entries: set[int] = set()
        """Queue entries whose request carries an image (by id)."""

    # -- leases -------------------------------------------------------------------------------

    def live(self, lane: str, model_id: str) -> Lease | None:
        held = self.leases.get((lane, model_id))
        if held is None:
            return None
        if held.expires_at <= self.node.lending.clock():
            del self.leases[(lane, model_id)]
            return None
        return held.lease

    def lent_out(self, lane: str, model_id: str) -> int:
        queue = self.node.lending.queues.get(lane)
        return len(queue.lent(model_id)) if queue is not None else 0

    def lent_to(self, lane: str, lease: Lease) -> list[Entry]:
        """Requests of the lease's model out with the lease's helper, in the order lent.

        A lease says how many requests *that helper* may hold; requests still out with a
        helper the lease has moved away from do not use its slots.
        """
        queue = self.node.lending.queues.get(lane)
        if queue is None:
            return []
        return queue.lent_to(lease.owner_model_id, (lease.helper_node_id, lease.helper_model_id))

    def refill(self, lane: str, model_id: str) -> None:
        """A lent slot is free (a lent request finished, or a request was held while a slot
        stood empty): lend the next held request into it at once.

        Only under a priced lease (a probe is one request, and the master's next answer
        decides whether more follow), and only while the helper would hand the next request
        back before the owner could drain its backlog alone: the master's cost rule, asked
        here so that the tail of a backlog is not sent to a helper the owner would beat.
        """
        lease = self.live(lane, model_id)
        if lease is None or not lease.knows_speeds():
            return
        if self._helper_drains_sooner(lane, model_id, lease):
            self.lend(lane, model_id, reason=REFILLED)

    def lend_held(self, lane: str, entry: Entry) -> None:
        """Lend a request the hold kept for a helper with a free slot (`lending/hold.py`): the
        held request goes first; lending it lets admission go on behind it."""
        if entry.state is State.HELD:  # not admitted or lent meanwhile
            self.lend(lane, entry.model_id, reason=HELPER_FINISHES_SOONER)

    def _helper_drains_sooner(self, lane: str, model_id: str, lease: Lease) -> bool:
        lending = self.node.lending
        queue = lending.queues.get(lane)
        if queue is None:
            return False
        waiting = [e for e in queue.pending(model_id) if not e.borrowed]
        if not waiting:
            return False
        now_ms = lending.clock() * 1000.0
        job = lease.owner_job_ms or 0.0
        service = lease.helper_service_ms or 0.0
        fit = owner_fit(self.node, lane, model_id)
        # Each request priced as itself: a lease priced on other traffic (uncached first
        # turns, say) must not send out a request the owner's cache makes cheap at home.
        prices = [entry_prices(fit, e, job, service) for e in waiting]
        drain = sum(own for own, _ in prices)
        admitted = queue.admitted(model_id)
        starts = [e.admitted_at * 1000.0 for e in admitted if e.admitted_at is not None]
        if starts:
            # The held requests follow the admitted jobs.
            owner = (
                owner_finish_ms(
                    now_ms=now_ms,
                    oldest_admitted_start_ms=min(starts),
                    last_own_completion_ms=lending.last_completion_ms.get((lane, model_id)),
                    in_flight=len(admitted),
                    job_ms=own_job_ms(fit, admitted, job),
                    this_job_ms=0.0,
                )
                + drain
            )
        else:
            owner = now_ms + drain
        # The largest lendable request goes first (`LaneQueue.withdraw`); streams and
        # requests that came back are never lent.
        lendable = [
            h for (_, h), e in zip(prices, waiting, strict=True) if not (e.pinned or e.returned)
        ]
        this = max(lendable, default=service)
        return lease_helper_finish_ms(now_ms, self.lent_to(lane, lease), lease, fit, this) < owner

    def apply(self, lane: str, model_id: str, lease: Lease | None) -> None:
        """The master's answer for (lane, model): install the lease and lend, or clear it."""
        lending = self.node.lending
        log = self.node.decisions
        key = (lane, model_id)
        if lease is None:
            if self.leases.pop(key, None) is not None:
                log.record(
                    kind="dispatch",
                    lane=lane,
                    owner_node_id=self.node.node_id,
                    owner_model_id=model_id,
                    outcome="lease_cleared",
                    lent_out=self.lent_out(lane, model_id),
                )
            self._reevaluate(lane)
            return
        if not lending.is_owner(lane, lease.owner_model_id):
            # A helper-only model never lends (spec): refuse whatever the master says.
            log.record(
                kind="dispatch",
                lane=lane,
                owner_node_id=self.node.node_id,
                owner_model_id=lease.owner_model_id,
                helper_node_id=lease.helper_node_id,
                helper_model_id=lease.helper_model_id,
                outcome="lease_refused",
                reason="not_an_owner",
            )
            return
        self.leases[key] = LiveLease(lease, lending.clock() + lease.ttl_ms / 1000.0)
        self._arm_expiry(lane, model_id, lease.ttl_ms / 1000.0)
        log.record(
            kind="dispatch",
            lane=lane,
            owner_node_id=self.node.node_id,
            owner_model_id=model_id,
            helper_node_id=lease.helper_node_id,
            helper_model_id=lease.helper_model_id,
            outcome="lease_updated",
            slots=lease.helper_slots,
            lent_out=self.lent_out(lane, model_id),
            switch_ms=lease.helper_switch_ms or 0,
            service_ms=lease.helper_service_ms or 0,
            owner_job_ms=lease.owner_job_ms or 0,
        )
        self.lend(lane, model_id)

    def _arm_expiry(self, lane: str, model_id: str, ttl_secs: float) -> None:
        # A held request must not wait on a lease that lapsed: re-run admission at expiry.
        loop = asyncio.get_running_loop()
        loop.call_later(ttl_secs + 0.001, self._reevaluate, lane)

    def lend(self, lane: str, model_id: str, *, reason: str = "") -> None:
        """Lend held requests, largest first, until the live lease's slots are all out.

        ``reason`` marks the ``lent`` rows: empty when the master's answer lent them,
        ``refilled`` when a finished lent request's slot was filled at once.
        """
        lease = self.live(lane, model_id)
        queue = self.node.lending.queues.get(lane)
        if lease is None or queue is None:
            return
        free = max(1, lease.helper_slots) - len(self.lent_to(lane, lease))
        if free <= 0:
            return
        capacity, vision = self._helper_traits(lease)
        images = self.image_entries

        def fits(entry: Entry) -> bool:
            # The dispatch-time gates: a request too large for the helper's context window, or
            # carrying an image the helper cannot read, stays with the owner.
            if lane == "text" and capacity and entry.context > capacity:
                return False
            return vision or id(entry) not in images

        taken = queue.withdraw(
            model_id,
            free,
            fits=fits,
            helper=(lease.helper_node_id, lease.helper_model_id),
            size=self._job_price(lane, model_id),
        )
        now = self.node.lending.clock()
        # Each row counts what was out the moment its request left, this one included.
        out_before = len(queue.lent(model_id)) - len(taken)
        for number, entry in enumerate(taken, start=1):
            self.node.decisions.record(
                kind="dispatch",
                lane=lane,
                owner_node_id=self.node.node_id,
                owner_model_id=model_id,
                helper_node_id=lease.helper_node_id,
                helper_model_id=lease.helper_model_id,
                outcome="lent",
                reason=reason,
                slots=lease.helper_slots,
                lent_out=out_before + number,
                wait_ms=int((now - entry.arrived_at) * 1000),
                request_id=entry.request_id,
                key_name=entry.tenant or None,
            )
            future = entry.payload
            if isinstance(future, asyncio.Future) and not future.done():
                future.set_result(lease)
        if taken:
            self._reevaluate(lane)

    def _job_price(self, lane: str, model_id: str) -> Callable[[Entry], float] | None:
        """This owner's price of one held request, when its fit tells sizes apart.

        Without a fit, or with a fit that knows one size only, every request costs the same
        and the newest go first.
        """
        fit = owner_fit(self.node, lane, model_id)
        if fit is None or not any(fit.slopes_ms):
            return None

        def price(entry: Entry) -> float:
            value = fit.predict(entry.work) if entry.work else None
            return -1.0 if value is None else value

        return price

    def _helper_traits(self, lease: Lease) -> tuple[int, bool]:
        """(context window, reads images) of the leased helper model, from the registry."""
        wanted = (lease.helper_node_id, lease.helper_model_id)
        for replicas in self.node.cluster.by_public_id.values():
            for replica in replicas:
                if (replica.node_id, replica.local_id) == wanted:
                    value = replica.record.get("context_size")
                    context = value if isinstance(value, int) else 0
                    return context, bool(replica.record.get("has_multimodal"))
        return 0, False

    def _reevaluate(self, lane: str) -> None:
        from lending.runtime import _wake

        queue = self.node.lending.queues.get(lane)
        if queue is not None:
            _wake(queue.reevaluate())

    def returned(self, lane: str, entry: Entry, lease: Lease) -> None:
        queue = self.node.lending.queue(lane)
        self.node.decisions.record(
            kind="dispatch",
            lane=lane,
            owner_node_id=self.node.node_id,
            owner_model_id=entry.model_id,
            helper_node_id=lease.helper_node_id,
            helper_model_id=lease.helper_model_id,
            outcome="returned",
            lent_out=max(0, len(queue.lent(entry.model_id)) - 1),
            request_id=entry.request_id,
            key_name=entry.tenant or None,
        )

    # -- events ---------------------------------------------------------------------------------

    def report(self, lane: str, model_id: str, trigger: str) -> None:
        """A queue event of a model that lends: ask the master for a decision (coalesced)."""
        node = self.node
        if node.role == "standalone" or not node.lending.is_owner(lane, model_id):
            return
        key = (lane, model_id)
        if key in self._inflight:
            self._queued[key] = trigger  # the latest trigger wins
            return
        self._inflight.add(key)
        task = asyncio.ensure_future(self._report(key, trigger))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(self, key: tuple[str, str], trigger: str) -> None:
        lane, model_id = key
        try:
            while True:
                lease, answered = await self._ask(lane, model_id, trigger)
                if answered:
                    self.apply(lane, model_id, lease)
                nxt = self._queued.pop(key, None)
                if nxt is None:
                    return
                trigger = nxt
        finally:
            self._inflight.discard(key)

    async def _ask(self, lane: str, model_id: str, trigger: str) -> tuple[Lease | None, bool]:
        node = self.node
        body = {
            "lane": lane,
            "owner_node_id": node.node_id,
            "model_id": model_id,
            "trigger": trigger,
        }
        if node.role == "master":
            from lending.master import get_master

            lease = await get_master(node).on_event(body)
            return lease, True
        client = node.client
        assert client is not None
        from registry.nodeclient import NodeCallError

        try:
            status, doc = await client.call_json(
                "POST",
                node.config.cluster.master_url,
                "/router/v1/node/offload/event",
                json=body,
                timeout=node.config.cluster.lending_event_timeout,
            )
        except NodeCallError as exc:
            # The master is down: no answer, so the lease (if any) lapses at its TTL and the
            # owner keeps serving its own work.
            logger.warning("offload event to the master failed: %s", exc)
            return None, False
        if status != 200 or not isinstance(doc, dict):
            logger.warning("offload event answered %s: %s", status, doc)
            return None, False
        raw = doc.get("lease")
        if not raw:
            return None, True
        try:
            return Lease.from_wire(raw), True
        except ValueError as exc:
            logger.warning("the master sent a malformed lease: %s", exc)
            return None, True

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass  # what the cancel above asked for
            except Exception:
                logger.exception("an offload event report failed as the owner closed")

    def snapshot(self) -> list[dict[str, Any]]:
        now = self.node.lending.clock()
        out = []
        for (lane, model_id), held in sorted(self.leases.items()):
            if held.expires_at > now:
                doc = held.lease.to_wire()
                doc["expires_in_ms"] = int((held.expires_at - now) * 1000)
                doc["lent_out"] = self.lent_out(lane, model_id)
                out.append(doc)
        return out
