"""The master's side of lending: plan leases, keep the lease book, relay lent requests.

On every owner event (coalesced per owner model), on the tick and when a probe falls due, the
master polls every node's runtime status concurrently (a node that does not answer in time
contributes nothing, and later plans skip it until it answers again; calls that arrive while a
round polls share the next round; under `cluster.lending_event_poll: linked` an event's round
polls only the nodes its owner's plan can involve), merges the cost fits the nodes publish,
builds the planner's view of each lane from the registry and the link set (lending/planinputs.py,
rebuilt where a status changed), runs the pure planner (lending/incremental.py over
lending/planner.py), replaces its lease book with the result and the live leases it keeps for
owners with nothing to lend (lending/carry.py), logs one `plan` row per evaluated pair and kept
lease, re-arms the probe timer, and delivers every lease: to the asking owner as the answer to
its event, to the others through `offload/grant`. A live lease the plan dropped is cleared at
its owner through the same route (`cleared: true`).

Lent requests come back through the master (`offload/request`): it checks its own live lease,
rewrites the model to the helper's own ID and forwards to the helper, or serves in-process
when the helper is itself. It logs `relay_refused` for every request it cannot pass on and
answers 409, so the owner runs the request itself.

A node that misses the short runtime-status poll of a plan is *silent*: plans skip it and relays
to it are refused until a background re-probe or a health poll finds it answering. A slow answer
is not a "no", though: the work lent to it stays where it is, and one longer question
(`cluster.health_timeout`) follows. Only when that goes unanswered too, or the registry's health
poll fails (its own `health_timeout`), or the stall check gets no answer in that time, is the
node gone: every request lent to it that it has not started answering goes back to its owner at
once. Taking work back closes its relay connection; the helper's router sees its client go and
cancels the backend request, so the work does not also finish there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp

from access.keyheader import key_name_header
from lending.carry import Kept, kept_leases
from lending.incremental import LanePlanner
from lending.planinputs import CostCache, LaneInputs
from lending.planner import Endpoint, Lease, LinkTarget, PlanResult, Settings
from lending.pricing import LANES, CostTable
from registry.bodies import set_body_model
from registry.httpclient import get_session
from registry.nodeclient import NodeCallError, NodeClient

if TYPE_CHECKING:
    from lending.ports import ServingNode
    from registry.cluster import RemoteNode

logger = logging.getLogger(__name__)

# The stall loop never wakes more often than this, however short the stall timeout: a loop
# that woke at once would take the event loop from the requests it watches.
STALL_CHECK_FLOOR_SECS = 0.05


class RelayRefused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _for_helper(body: bytes, helper_model_id: str) -> bytes:
    """A lent request's body addressed to the helper's model."""
    try:
        return set_body_model(body, helper_model_id)
    except ValueError:
        return body  # not JSON: the helper sees the body as the owner sent it


class _Round:
    """One poll round and plan, and the callers it answers."""

    def __init__(self, trigger: str) -> None:
        # The plan rows of a shared round carry the trigger of the call that opened it.
        self.trigger = trigger
        self.asking: set[tuple[str, str, str]] = set()
        self.everyone = False  # a call for no owner (tick, probe): every node is polled
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def join(self, asking: tuple[str, str, str] | None) -> None:
        if asking is None:
            self.everyone = True
        else:
            self.asking.add(asking)


class MasterLending:
    def __init__(self, node: ServingNode) -> None:
        self.node = node
        self.book: dict[tuple[str, str, str], tuple[Lease, float]] = {}
        self.last_costs: CostTable | None = None
        self.last_statuses: dict[str, dict[str, Any]] = {}
        """Every node's runtime status as the last plan saw it (queues per model and lane)."""
        """Every node's fits as the last plan saw them: the cluster view of /metrics."""
        """(lane, owner node, owner model) → (lease, expires_at on the master's clock)."""
        self._plan_lock = asyncio.Lock()
        self._next_round: _Round | None = None
        self._planners = {lane: LanePlanner(lane) for lane in LANES}
        self._inputs = {lane: LaneInputs(lane) for lane in LANES}
        self._cost_cache = CostCache()
        self.rounds = 0
        self.plan_compute_secs = 0.0
        """Rounds planned, and the time their planning took past the polls (the bench's view)."""
        self._inflight: dict[tuple[str, str, str], asyncio.Future[Lease | None]] = {}
        self._queued: dict[tuple[str, str, str], tuple[str, asyncio.Future[Lease | None]]] = {}
        self._probe_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # Stall check: relays in flight per helper node and when that set last changed.
        self.relays: dict[str, set[asyncio.Task[Any]]] = {}
        self.relay_changed: dict[str, float] = {}
        self.stalled: set[asyncio.Task[Any]] = set()
        self._stall_task: asyncio.Task[None] | None = None
        self.silent: set[str] = set()
        """Nodes that did not answer: plans skip them and relays to them are refused."""
        self._reprobes: dict[str, asyncio.Task[None]] = {}
        self._confirms: dict[str, asyncio.Task[None]] = {}
        """Nodes that missed a status poll, asked once more with the longer health timeout."""
        # The registry reports health poll outcomes here (it must not import lending).
        node.cluster.health_listeners.append(self._on_health)

    # -- events ---------------------------------------------------------------------------

    async def on_event(self, body: Mapping[str, Any]) -> Lease | None:
        """One owner event → a plan (coalesced per owner model) → that owner's lease or None."""
        lane = "text" if body.get("lane") == "text" else "image"
        owner_node = str(body.get("owner_node_id", ""))
        model_id = str(body.get("model_id", ""))
        trigger = str(body.get("trigger") or "enqueued")
        key = (lane, owner_node, model_id)
        if key in self._inflight:
            # One decision in flight, one queued behind it; later events join the queued one.
            queued = self._queued.get(key)
            if queued is None:
                future: asyncio.Future[Lease | None] = asyncio.get_running_loop().create_future()
                self._queued[key] = (trigger, future)
            else:
                future = queued[1]
                self._queued[key] = (trigger, future)
            return await asyncio.shield(future)
        return await self._decide(key, trigger)

    async def _decide(self, key: tuple[str, str, str], trigger: str) -> Lease | None:
        future: asyncio.Future[Lease | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            await self.plan(trigger, asking=key)
            result = self.lease_for(*key)
            future.set_result(result)
            return result
        except Exception as exc:
            future.set_exception(exc)
            raise
        finally:
            del self._inflight[key]
            queued = self._queued.pop(key, None)
            if queued is not None:
                next_trigger, waiter = queued
                task = asyncio.ensure_future(self._decide(key, next_trigger))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                task.add_done_callback(functools.partial(_settle, waiter))

    def lease_for(self, lane: str, owner_node: str, model_id: str) -> Lease | None:
        held = self.book.get((lane, owner_node, model_id))
        if held is None or held[1] <= time.monotonic():
            return None
        return held[0]

    def live_leases(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for (_, _, _), (lease, expires) in sorted(self.book.items()):
            if expires > now:
                doc = lease.to_wire()
                doc["expires_in_ms"] = int((expires - now) * 1000)
                out.append(doc)
        return out

    # -- planning -------------------------------------------------------------------------

    async def plan(self, trigger: str, *, asking: tuple[str, str, str] | None = None) -> None:
        """Plan in the next poll round that starts from now on: a round already polling began
        before this call, so its answers may be older than what this caller reports. Every
        call that arrives while a round is in flight shares the one after it."""
        round_ = self._next_round
        if round_ is None:
            round_ = self._next_round = _Round(trigger)
            self._spawn(self._run_round())
        round_.join(asking)
        await asyncio.shield(round_.done)

    async def _run_round(self) -> None:
        round_: _Round | None = None
        try:
            async with self._plan_lock:
                round_, self._next_round = self._next_round, None
                assert round_ is not None  # one runner is spawned per round
                await self._plan_round(round_)
            round_.done.set_result(None)
        except Exception as exc:
            if round_ is not None:
                round_.done.set_exception(exc)
        finally:
            if round_ is None:
                # Cancelled before the round began (the master closes): its callers end too.
                round_, self._next_round = self._next_round, None
            if round_ is not None and not round_.done.done():
                round_.done.cancel()

    async def _plan_round(self, round_: _Round) -> None:
        statuses = await self._statuses(self._poll_targets(round_))
        started = time.perf_counter()
        results = self._plan_all(round_.trigger, statuses)
        now = time.monotonic()
        book: dict[tuple[str, str, str], tuple[Lease, float]] = {}
        held = self.book
        due: list[float] = []
        for planned_lane, result in results.items():
            for lease in result.leases:
                key = (planned_lane, lease.owner_node_id, lease.owner_model_id)
                book[key] = (lease, now + lease.ttl_ms / 1000.0)
            for row in result.rows:
                self.node.decisions.record(kind="plan", **row.as_fields())
            if result.probe_due_ms is not None:
                due.append(result.probe_due_ms)
        for key, kept in self._kept(held, book, round_.trigger, statuses, now).items():
            book[key] = (kept.lease, kept.expires)
            self.node.decisions.record(kind="plan", **kept.row.as_fields())
        self.book = book
        self.last_statuses = statuses
        self._arm_probe(min(due) if due else None)
        self.rounds += 1
        self.plan_compute_secs += time.perf_counter() - started
        self._deliver(results, round_.asking)
        # A live lease this plan dropped: its owner would keep refilling under it (and each
        # refill be refused, `no_live_lease`, and run late) until its TTL; it is told now. The
        # asking owners learn it from the answer to their events.
        for key, (_, expires) in held.items():
            if key not in book and key not in round_.asking and expires > now:
                self._spawn(self._clear(key))

    def _plan_all(
        self, trigger: str, statuses: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, PlanResult]:
        costs = self.last_costs = self._cost_cache.table(statuses)
        settings = self._settings()
        results: dict[str, PlanResult] = {}
        for lane in LANES:
            inputs = self._inputs[lane]
            inputs.index(self.node.cluster.view.records, self.node.lending.links.get(lane, []))
            results[lane] = self._planners[lane].plan(
                trigger=trigger, owners=inputs.owners(statuses), costs=costs, settings=settings
            )
        return results

    def _kept(
        self,
        held: Mapping[tuple[str, str, str], tuple[Lease, float]],
        book: Mapping[tuple[str, str, str], tuple[Lease, float]],
        trigger: str,
        statuses: Mapping[str, Mapping[str, Any]],
        now: float,
    ) -> dict[tuple[str, str, str], Kept]:
        """The live leases this round keeps although it did not grant them (lending/carry.py)."""
        owners: dict[str, list[tuple[Endpoint, list[LinkTarget]]]] = {}
        for key, (_, expires) in held.items():
            lane = key[0]
            if key in book or expires <= now or lane not in self._inputs:
                continue
            built = self._inputs[lane].owner((key[1], key[2]), statuses)
            if built is not None:
                owners.setdefault(lane, []).append(built)
        return kept_leases(held, book, owners, now, trigger) if owners else {}

    def _poll_targets(self, round_: _Round) -> set[str] | None:
        """The nodes this round polls; None: every node (the spec's rule, and the tick's)."""
        if self.node.config.cluster.lending_event_poll == "all" or round_.everyone:
            return None
        nodes: set[str] = set()
        for lane, owner_node, model_id in round_.asking:
            inputs = self._inputs[lane]  # type: ignore[index]
            inputs.index(self.node.cluster.view.records, self.node.lending.links.get(lane, []))
            nodes |= inputs.neighbourhood((owner_node, model_id))
        return nodes

    def _settings(self) -> Settings:
        s = self.node.lending.settings
        return Settings(
            probe_idle_ms=s.probe_idle_secs * 1000.0,
            faster_slots=s.faster_slots,
            slower_slots=s.slower_slots,
            probe_slots=s.probe_slots,
            grant_ttl_ms=int(s.grant_ttl_secs * 1000),
        )

    async def _statuses(self, only: set[str] | None = None) -> dict[str, dict[str, Any]]:
        """Every answering node's runtime status: polled now, or, for a node outside ``only``,
        as the last round polled it."""
        node = self.node
        statuses: dict[str, dict[str, Any]] = {node.node_id: node.runtime_status()}
        client = node.client
        if client is None:
            return statuses
        # A node answers runtime status from its event loop without any I/O, in milliseconds
        # over loopback or a LAN; every plan waits for its slowest poll.
        timeout = node.config.cluster.lending_status_timeout

        async def one(node_id: str, url: str) -> tuple[str, Any]:
            try:
                doc = await client.call_ok(
                    "GET", url, "/router/v1/node/runtime-status", timeout=timeout
                )
            except NodeCallError as exc:
                return node_id, exc
            return node_id, doc

        live = [
            n for n in node.cluster.nodes.values() if n.healthy and n.node_id not in self.silent
        ]
        if only is not None:
            for n in live:
                kept = self.last_statuses.get(n.node_id)
                if n.node_id not in only and kept is not None:
                    statuses[n.node_id] = kept
        targets = [(n.node_id, n.node_url) for n in live if n.node_id not in statuses]
        for node_id, doc in await asyncio.gather(*(one(nid, url) for nid, url in targets)):
            if isinstance(doc, NodeCallError):
                self.node_slow(node_id, f"runtime status: {doc}")
            elif isinstance(doc, dict):
                statuses[node_id] = doc
        return statuses

    # -- nodes that do not answer -----------------------------------------------------------

    def node_slow(self, node_id: str, why: str) -> None:
        """`node_id` missed a short question (a plan's status poll): plans skip it from now on,
        but its lent work stays unless a question of `cluster.health_timeout` goes unanswered
        too. A router that hiccups (a GC pause, a stopped process resumed) still runs what it
        was lent; taking that back would run it twice."""
        if node_id not in self.silent:
            logger.warning(
                "node %s does not answer its status poll in time (%s): plans skip it until it"
                " does; its lent work stays unless it misses a longer question too",
                node_id,
                why,
            )
        self._go_silent(node_id)
        if node_id not in self._confirms:
            task = asyncio.ensure_future(self._confirm(node_id))
            self._confirms[node_id] = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(functools.partial(_forget, self._confirms, node_id))

    async def _confirm(self, node_id: str) -> None:
        """The longer question after a missed status poll: no answer in `health_timeout`
        either (or no connection at all), and the node is gone."""
        node = self.node
        remote = node.cluster.nodes.get(node_id)
        if remote is None or node.client is None:
            return
        wait = node.config.cluster.health_timeout
        try:
            await node.client.call_ok(
                "GET", remote.node_url, "/router/v1/node/runtime-status", timeout=wait
            )
        except NodeCallError as exc:
            if exc.kind in ("timeout", "transport"):
                self.node_silent(node_id, f"no answer within health_timeout {wait:g}s: {exc}")
            # Otherwise it answered, with an error: alive, so it keeps its lent work, and
            # plans keep skipping it until the re-probe gets a good answer.
            return
        self.node_answers(node_id)

    def node_silent(self, node_id: str, why: str) -> None:
        """`node_id` is gone (a failed health verdict, or no answer to a question of
        `health_timeout`): the stall check's "no", and plans skip it from now on."""
        if node_id not in self.silent or self.relays.get(node_id):
            logger.warning(
                "node %s does not answer (%s): plans skip it until it does, and its lent work"
                " goes back",
                node_id,
                why,
            )
        self._go_silent(node_id)
        self._return_lent(node_id)

    def _go_silent(self, node_id: str) -> None:
        self.silent.add(node_id)
        if node_id not in self._reprobes:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop to probe on: the next successful health poll clears it
            task = asyncio.ensure_future(self._reprobe(node_id))
            self._reprobes[node_id] = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(functools.partial(_forget, self._reprobes, node_id))

    def node_answers(self, node_id: str) -> None:
        if node_id in self.silent:
            logger.info("node %s answers again: plans consider it again", node_id)
            self.silent.discard(node_id)
        task = self._reprobes.pop(node_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _on_health(self, node_id: str, healthy: bool) -> None:
        if healthy:
            self.node_answers(node_id)
        else:
            self.node_silent(node_id, "health poll failed")

    async def _reprobe(self, node_id: str) -> None:
        node = self.node
        timers = node.config.cluster
        while node_id in self.silent:
            # Spaced out: a node whose port refuses fails at once, and would be asked in a
            # tight loop.
            await asyncio.sleep(timers.lending_reprobe_interval)
            remote = node.cluster.nodes.get(node_id)
            if remote is None or node.client is None:
                self.silent.discard(node_id)  # gone from the cluster: nothing left to skip
                return
            try:
                await node.client.call_ok(
                    "GET",
                    remote.node_url,
                    "/router/v1/node/runtime-status",
                    timeout=timers.lending_reprobe_timeout,
                )
            except NodeCallError:
                continue
            self.node_answers(node_id)

    def _arm_probe(self, due_ms: float | None) -> None:
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None
        if due_ms is None:
            return
        loop = asyncio.get_running_loop()
        self._probe_timer = loop.call_later(max(0.0, due_ms / 1000.0), self._probe_due)

    def _probe_due(self) -> None:
        self._probe_timer = None
        task = asyncio.ensure_future(self.plan("probe_due"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _deliver(
        self, results: Mapping[str, PlanResult], asking: set[tuple[str, str, str]]
    ) -> None:
        for result in results.values():
            for lease in result.leases:
                key = (lease.lane, lease.owner_node_id, lease.owner_model_id)
                if key in asking:
                    continue  # it gets the lease as the answer to its event
                self._spawn(self._grant(lease))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _clear(self, key: tuple[str, str, str]) -> None:
        """Tell an owner the master cleared its lease (through the grant route)."""
        lane, owner_node, model_id = key
        node = self.node
        if key in self.book:
            return  # a later plan granted it again: that grant is what the owner must keep
        if owner_node == node.node_id:
            node.owner.apply(lane, model_id, None)
            return
        remote = node.cluster.nodes.get(owner_node)
        if remote is None or node.client is None:
            return
        doc = {"lane": lane, "owner_node_id": owner_node, "owner_model_id": model_id}
        try:
            await node.client.call_ok(
                "POST",
                remote.node_url,
                "/router/v1/node/offload/grant",
                json={**doc, "cleared": True},
            )
        except NodeCallError as exc:
            # Its lease lapses at its TTL on the owner's clock; refills till then are refused.
            logger.warning("lease clear to %s failed: %s", owner_node, exc)

    async def _grant(self, lease: Lease) -> None:
        node = self.node
        if lease.owner_node_id == node.node_id:
            node.owner.apply(lease.lane, lease.owner_model_id, lease)
            return
        remote = node.cluster.nodes.get(lease.owner_node_id)
        if remote is None or node.client is None:
            return
        try:
            await node.client.call_ok(
                "POST", remote.node_url, "/router/v1/node/offload/grant", json=lease.to_wire()
            )
        except NodeCallError as exc:
            logger.warning("grant to %s failed: %s", lease.owner_node_id, exc)

    # -- relaying lent requests -------------------------------------------------------------

    def _refuse(
        self,
        lane: str,
        owner_node: str,
        owner_model: str,
        reason: str,
        lease: Lease | None = None,
        request_id: str | None = None,
    ) -> RelayRefused:
        self.node.decisions.record(
            kind="dispatch",
            lane=lane,
            owner_node_id=owner_node,
            owner_model_id=owner_model,
            helper_node_id=lease.helper_node_id if lease else "",
            helper_model_id=lease.helper_model_id if lease else "",
            outcome="relay_refused",
            reason=reason,
            request_id=request_id or None,
        )
        return RelayRefused(reason, f"lent request refused: {reason}")

    def refuse_cut(
        self, lane: str, owner_node: str, owner_model: str, request_id: str, exc: BaseException
    ) -> RelayRefused:
        """The helper's answer broke off after its headers: the owner runs the request."""
        logger.warning("lent request %s: the helper's answer broke off: %s", request_id, exc)
        lease = self.lease_for(lane, owner_node, owner_model)
        return self._refuse(lane, owner_node, owner_model, "helper_cut_off", lease, request_id)

    def _relay_target(
        self, lane: str, owner_node: str, owner_model: str, request_id: str
    ) -> tuple[Lease, RemoteNode, NodeClient]:
        """The live lease of the owner's model, its helper node and the client to reach it;
        RelayRefused (after logging `relay_refused`) when there is none to relay to."""
        lease = self.lease_for(lane, owner_node, owner_model)
        if lease is None:
            raise self._refuse(lane, owner_node, owner_model, "no_live_lease", None, request_id)
        node = self.node
        if lease.helper_node_id == node.node_id:
            raise self._refuse(lane, owner_node, owner_model, "helper_is_master", lease, request_id)
        remote = node.cluster.nodes.get(lease.helper_node_id)
        client = node.client
        if remote is None or not remote.healthy or remote.node_id in self.silent or client is None:
            raise self._refuse(
                lane, owner_node, owner_model, "helper_unreachable", lease, request_id
            )
        return lease, remote, client

    @staticmethod
    def _relay_headers(
        lease: Lease,
        authorization: str,
        content_type: str,
        request_id: str,
        key_name: str | None,
        key_share: str | None = None,
    ) -> dict[str, str]:
        """The headers of a lent request to its helper: what the lease asks of the helper model,
        and the owner's key name (the helper's usage row counts the request under it) and share
        (the helper queues it under that key with that weight)."""
        headers = {
            "Content-Type": content_type,
            "Authorization": authorization,
            "X-Tensors-Offload": "1",
            **key_name_header(key_name),
        }
        if key_share:
            headers["X-Router-Key-Share"] = key_share
        if request_id:
            headers["X-Request-Id"] = request_id
        if lease.load_helper_model:
            headers["X-Tensors-Offload-Load"] = "1"
        if lease.restore_helper_model:
            headers["X-Tensors-Offload-Restore"] = "1"
        return headers

    @contextlib.asynccontextmanager
    async def open_helper(
        self,
        *,
        lane: str,
        owner_node: str,
        owner_model: str,
        path: str,
        body: bytes,
        content_type: str,
        request_id: str = "",
        key_name: str | None = None,
        key_share: str | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Forward a lent request to the leased helper; yields the helper's response. Raises
        RelayRefused (after logging `relay_refused`) when there is no live lease, the helper
        cannot be reached, or forwarding fails before the helper answers."""
        lease, remote, client = self._relay_target(lane, owner_node, owner_model, request_id)
        body = _for_helper(body, lease.helper_model_id)
        auth = client.authorization
        headers = self._relay_headers(lease, auth, content_type, request_id, key_name, key_share)
        helper = lease.helper_node_id
        task = asyncio.current_task()
        assert task is not None
        self._relay_begin(helper, task)
        watched = True
        try:
            try:
                url = client.checked_url(remote.node_url, "/router/v1/node/inference" + path)
                ctx = get_session().post(
                    url, data=body, headers=headers, allow_redirects=False, ssl=client.ssl
                )
                resp = await ctx.__aenter__()
            except (NodeCallError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                logger.warning("relay to %s failed: %s", helper, exc)
                raise self._refuse(
                    lane, owner_node, owner_model, "forward_failed", lease, request_id
                ) from exc
            except asyncio.CancelledError:
                if task not in self.stalled:
                    raise
                self.stalled.discard(task)
                task.uncancel()
                raise self._refuse(
                    lane, owner_node, owner_model, "helper_stalled", lease, request_id
                ) from None
            # The helper has started answering. Taking the request back now would cut an
            # answer already on its way (the owner may have begun passing it on), so it
            # leaves the set a silent or stalled helper loses. Nothing awaits between the
            # answer arriving and this line, so a loss can never land half-way through it.
            self._relay_end(helper, task)
            watched = False
            try:
                yield resp
            finally:
                await ctx.__aexit__(None, None, None)
        finally:
            if watched:
                self._relay_end(helper, task)
            self.stalled.discard(task)

    # -- stall check --------------------------------------------------------------------------
    # If the requests lent to a helper show no change for `offload_lent_stall_timeout`, ask
    # the helper whether it still runs borrowed work. Yes (or an older build without the
    # query, which answers with an error status): it keeps them. No, or no answer within
    # `health_timeout` (the same verdict as a failed health poll): every request lent to it
    # that it has not started answering comes back at once and the owners serve them.

    def _relay_begin(self, helper: str, task: asyncio.Task[Any]) -> None:
        self.relays.setdefault(helper, set()).add(task)
        self.relay_changed[helper] = time.monotonic()
        if self._stall_task is None or self._stall_task.done():
            self._stall_task = asyncio.ensure_future(self._stall_loop())

    def _relay_end(self, helper: str, task: asyncio.Task[Any]) -> None:
        self.relays.get(helper, set()).discard(task)
        self.relay_changed[helper] = time.monotonic()

    async def _stall_loop(self) -> None:
        while any(self.relays.values()):
            timeout = self.node.lending.settings.lent_stall_timeout_secs
            every = min(timeout / 4, self.node.config.cluster.lending_stall_check_interval)
            await asyncio.sleep(max(STALL_CHECK_FLOOR_SECS, every))
            now = time.monotonic()
            for helper, tasks in list(self.relays.items()):
                if tasks and now - self.relay_changed.get(helper, now) >= timeout:
                    await self._check_stalled(helper)

    async def _check_stalled(self, helper: str) -> None:
        node = self.node
        remote = node.cluster.nodes.get(helper)
        if remote is None or node.client is None:
            return
        try:
            doc = await node.client.call_ok(
                "GET",
                remote.node_url,
                "/router/v1/node/offload/borrowed",
                # As long as a health poll may take: a slow answer is not a "no".
                timeout=node.config.cluster.health_timeout,
            )
        except NodeCallError as exc:
            if exc.kind in ("timeout", "transport"):
                self.node_silent(helper, f"stall check: {exc}")
            # Otherwise it answered, with an error: an older build is treated as busy.
            self.relay_changed[helper] = time.monotonic()
            return
        if isinstance(doc, dict) and int(doc.get("borrowed", 1) or 0) == 0:
            logger.warning("helper %s runs no borrowed work: its lent requests go back", helper)
            self._return_lent(helper)
        self.relay_changed[helper] = time.monotonic()

    def _return_lent(self, helper: str) -> None:
        """Every request lent to `helper` that it has not started answering goes back now."""
        for task in list(self.relays.get(helper, set())):
            self.stalled.add(task)
            task.cancel()

    async def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.node.cluster.health_listeners.remove(self._on_health)
        if self._probe_timer is not None:
            self._probe_timer.cancel()
        if self._stall_task is not None:
            self._stall_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass  # what the cancel above asked for
            except Exception:
                logger.exception("a lending task of the master failed as it closed")


def _forget(tasks: dict[str, asyncio.Task[None]], node_id: str, task: asyncio.Task[None]) -> None:
    if tasks.get(node_id) is task:
        del tasks[node_id]


def _settle(waiter: asyncio.Future[Lease | None], task: asyncio.Task[Lease | None]) -> None:
    if waiter.done():
        return
    if task.cancelled():
        waiter.cancel()
    elif task.exception() is not None:
        waiter.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        waiter.set_result(task.result())


def get_master(node: ServingNode) -> MasterLending:
    """The node's own master side, built with the node: it lives and dies with the node."""
    master = node.master
    if master is None:
        raise RuntimeError(f"node {node.node_id} is a {node.role}: it plans no leases")
    return master
