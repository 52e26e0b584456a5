"""Lending on the request path: the owner's turn (admit, or lend and relay) and the helper's.

`forward()` (proxy/forwarding.py) calls these for a request of an enrolled model (owner side)
or a borrowed request (helper side, marked by the node protocol, never by a client header).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from lending.planner import Lease
from lending.queue import Entry, State
from lending.runtime import RETURNED, _wake
from routerproject.errors import RouterError

if TYPE_CHECKING:
    from proxy.forwarding import Ctx, Job
    from proxy.node import Node
    from proxy.runtimes import Runtime

Shaper = Callable[["Ctx", "Job", aiohttp.ClientResponse], Awaitable[None]]

# The spec's cutoff for a lent request whose helper has not started answering.
CUTOFF_FACTOR = 3.0
CUTOFF_GRACE_SECS = 30.0


def offload_returned(message: str) -> RouterError:
    return RouterError(409, message, type="offload_returned", code="offload_returned")


# -- owner ------------------------------------------------------------------------------------


async def owner_turn(ctx: Ctx, node: Node, job: Job, entry: Entry, shape: Shaper) -> bool:
    """Wait for admission; if lent meanwhile, relay. True when the client was answered."""
    lending = node.lending
    owner = node.owner
    lane, model_id = job.lane, job.model_id
    requeued = False
    while True:
        outcome = await lending.admit(
            lane, entry, requeued=requeued, on_enqueued=lambda: report_enqueued(node, lane, entry)
        )
        if outcome is None:
            _log_waited(node, lane, entry)
            return False
        lease: Lease = outcome
        answered = await relay(ctx, node, job, lease, shape)
        queue = lending.queue(lane)
        if answered:
            # The freed lent slot goes to the next held request before admission runs: else
            # the hold, seeing a free lent slot, would release that request into the owner's
            # backend a round trip before the master's answer could lend it.
            queue.lent_finished(entry, admit=False)
            owner.refill(lane, model_id)
            _wake(queue.reevaluate())
            owner.report(lane, model_id, "borrowed_completed")
            return True
        owner.returned(lane, entry, lease)
        _wake(queue.lent_returned(entry))
        owner.report(lane, model_id, "borrowed_completed")
        requeued = True


def report_enqueued(node: Node, lane: str, entry: Entry) -> None:
    if entry.state is not State.ADMITTED and not entry.borrowed:
        node.owner.report(lane, entry.model_id, "enqueued")


class Takeback(asyncio.Future[None]):
    """Resolved when the helper's own work takes back a borrowed request still waiting for its
    runtime (or for the helper model to load).

    It knows that runtime, so a native request can tell the borrowed work it really waits
    behind (holding the runtime) from the borrowed work it is about to hand back.
    """

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(loop=asyncio.get_running_loop())
        self.runtime_key = id(runtime)


def borrowed_running_on(node: Node, lane: str, runtime: Runtime) -> int:
    """Borrowed requests that hold `runtime` now: admitted to it and no longer waiting for it."""
    admitted = node.restore.borrowed_on(runtime)
    if not admitted:
        return 0
    waiting = sum(
        1
        for takeback in node.lending.borrowed_waiting.get(lane, ())
        if getattr(takeback, "runtime_key", None) == id(runtime)
    )
    return max(0, admitted - waiting)


def yield_borrowed(node: Node, lane: str) -> None:
    """A native request arrived: every borrowed request not yet running goes back to its owner.

    That covers borrowed requests still queued in the router and those admitted but still
    waiting for the runtime or for the helper model to load; one that holds the runtime and
    generates always finishes.
    """
    for takeback in list(node.lending.borrowed_waiting.get(lane, ())):
        if not takeback.done():
            takeback.set_result(None)
    queue = node.lending.queues.get(lane)
    if queue is None:
        return
    for entry in queue.return_pending_borrowed():
        future = entry.payload
        if isinstance(future, asyncio.Future) and not future.done():
            future.set_result(RETURNED)


def _log_waited(node: Node, lane: str, entry: Entry) -> None:
    if entry.borrowed:
        return
    log_waited_behind_borrowed(node, lane, entry.model_id, entry.borrowed_ahead, entry.arrived_at)


def log_waited_behind_borrowed(
    node: Node, lane: str, model_id: str, borrowed_ahead: int, arrived_at: float
) -> None:
    """The helper row for a native request that had borrowed work ahead of it on arrival."""
    if borrowed_ahead <= 0:
        return
    node.decisions.record(
        kind="helper",
        lane=lane,
        owner_node_id=node.node_id,
        owner_model_id=model_id,
        outcome="native_waited_behind_borrowed",
        borrowed_ahead=borrowed_ahead,
        wait_ms=int((node.lending.clock() - arrived_at) * 1000),
    )


def _cutoff(lease: Lease) -> float | None:
    if not lease.knows_speeds():
        return None  # probes and unmeasured leases have no such limit
    switch = lease.helper_switch_ms or 0.0
    job = lease.helper_service_ms or 0.0
    return CUTOFF_FACTOR * (switch + job) / 1000.0 + CUTOFF_GRACE_SECS


async def relay(ctx: Ctx, node: Node, job: Job, lease: Lease, shape: Shaper) -> bool:
    """Send a lent request owner → master → helper; answer the client from the helper.

    False when it came back (409, a helper error, an unreachable master or helper, or the
    cutoff): the owner then runs it itself, so the client still gets exactly one answer.
    """
    from registry.httpclient import get_session
    from registry.nodeclient import NodeCallError

    content_type = job.content_type.decode("latin-1")
    try:
        async with contextlib.AsyncExitStack() as stack:
            cutoff = await stack.enter_async_context(asyncio.timeout(_cutoff(lease)))
            if node.role == "master":
                from lending.master import RelayRefused, get_master

                try:
                    resp = await stack.enter_async_context(
                        get_master(node).open_helper(
                            lane=job.lane,
                            owner_node=node.node_id,
                            owner_model=job.model_id,
                            path=job.backend_path,
                            body=job.body,
                            content_type=content_type,
                        )
                    )
                except RelayRefused:
                    return False
            else:
                client = node.client
                assert client is not None
                url = client.checked_url(
                    node.config.cluster.master_url, "/router/v1/node/offload/request"
                )
                headers = {
                    "Content-Type": content_type,
                    "Authorization": client.authorization,
                    "X-Tensors-Offload-Owner": node.node_id,
                    "X-Tensors-Offload-Owner-Model": job.model_id,
                    "X-Tensors-Offload-Path": job.backend_path,
                    "X-Tensors-Offload-Lane": job.lane,
                }
                resp = await stack.enter_async_context(
                    get_session().post(url, data=job.body, headers=headers, allow_redirects=False)
                )
            # The cutoff is for a helper that has not started answering. This one has: a long
            # answer now streams back whole instead of being cut off half-way.
            cutoff.reschedule(None)
            if resp.status == 409 or resp.status >= 500:
                return False
            # The helper answers under its own model ID; the client sees the ID it asked for.
            lent_job = dataclasses.replace(job, model_id=lease.helper_model_id)
            await shape(ctx, lent_job, resp)
            job.lent = True
            return True
    except (aiohttp.ClientError, OSError, TimeoutError, NodeCallError):
        if ctx.started:
            raise
        return False


# -- helper -----------------------------------------------------------------------------------


def _helper_row(node: Node, lane: str, model_id: str, reason: str, **fields: Any) -> None:
    node.decisions.record(
        kind="helper",
        lane=lane,
        helper_node_id=node.node_id,
        helper_model_id=model_id,
        outcome="borrowed_returned",
        reason=reason,
        **fields,
    )


async def borrowed_acquire(node: Node, job: Job, acquiring: Awaitable[Any]) -> Any:
    """Wait for the runtime (maybe a model load) unless the helper's own work takes it back."""
    lane = job.lane
    takeback = Takeback(node.runtimes.runtime_for(job.cfg, lane))
    waiting = node.lending.borrowed_waiting.setdefault(lane, set())
    waiting.add(takeback)
    task = asyncio.ensure_future(acquiring)
    try:
        await asyncio.wait({task, takeback}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        waiting.discard(takeback)
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    _helper_row(node, lane, job.model_id, "own_work_arrived")
    raise offload_returned("the helper's own work arrived before this request started")


async def helper_turn(ctx: Ctx, node: Node, job: Job) -> Entry:
    """Queue a borrowed request behind every native one; 409 whenever it must go back."""
    lending = node.lending
    lane = job.lane
    if lane not in ("text", "image"):
        raise offload_returned("this lane does not take borrowed work")
    if not lending.accepting_borrowed(lane):
        _helper_row(node, lane, job.model_id, "helper_busy_on_arrival")
        raise offload_returned("the helper is busy with its own work")
    if not ctx.offload_load and not node.runtimes.is_loaded(job.cfg):
        _helper_row(node, lane, job.model_id, "load_forbidden")
        raise offload_returned("serving would need a model load that the link forbids")
    entry = Entry(job.model_id, lending.clock(), borrowed=True)
    outcome = await lending.admit(lane, entry)
    if outcome == RETURNED:
        _helper_row(node, lane, job.model_id, "own_work_arrived")
        raise offload_returned("the helper's own work arrived")
    return entry
