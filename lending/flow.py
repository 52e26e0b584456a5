"""Lending on the request path, asked once per request through the node's `RequestLending`.

`forward()` (proxy/forwarding/local.py) asks `ask()` what to do with a request it would run on a
local runtime, and calls `done()` when the request is over. An unlinked model skips the router
queue on one set lookup. An enrolled model's own request waits for admission, and may be lent
and relayed to a helper meanwhile (the owner's turn). A borrowed request (marked by the node
protocol, never by a client header) queues behind every native one and goes back to its owner
with a 409 whenever it must (the helper's turn).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import aiohttp

from access.identity import MASTER, caller_of
from access.keyheader import key_name_header
from lending.fairshare import clean_cost, clean_weight
from lending.planner import Lease
from lending.ports import LendingRuntime, RequestCtx, RequestJob, ServingNode
from lending.pricing import LANES, section_fit
from lending.queue import Entry, State
from lending.runtime import RETURNED, _wake
from registry.httpclient import get_session
from registry.nodeclient import NodeCallError
from routerproject.errors import RouterError

C = TypeVar("C", bound=RequestCtx)
J = TypeVar("J", bound=RequestJob)
T = TypeVar("T")

Shaper = Callable[[C, J, aiohttp.ClientResponse], Awaitable[None]]
"""Answers the client from a backend's (or a helper's) response: the proxy's, passed in."""

# A request another node serves (lent, or passed on) carries its key's share beside its name
# (access/keyheader.py): it waits there under that key. Read on the node protocol only.
KEY_SHARE_HEADER = "X-Router-Key-Share"
KEY_SHARE_HEADER_BYTES = KEY_SHARE_HEADER.lower().encode("ascii")
KEY_NAME_MAX_CHARS = 200
# The fair-share cost of a request its model's fit cannot price yet: about one job (ms).
UNPRICED_COST_MS = 1000.0

# The spec's cutoff for a lent request whose helper has not started answering.
CUTOFF_FACTOR = 3.0
CUTOFF_GRACE_SECS = 30.0


def offload_returned(message: str) -> RouterError:
    return RouterError(409, message, type="offload_returned", code="offload_returned")


# -- the seam ----------------------------------------------------------------------------------


class Turn(Generic[T]):
    """One request's part in lending, from `RequestLending.ask` to `RequestLending.done`."""

    __slots__ = ("borrowed", "entry", "guarding", "job", "launch")

    def __init__(self, job: RequestJob, borrowed: bool) -> None:
        self.job = job
        self.borrowed = borrowed
        self.launch: T | None = None
        """What `acquire` gave to run the request here; None when a helper answered the client."""
        self.entry: Entry | None = None
        """Its router-queue entry: an enrolled model's own request, or a borrowed one."""
        self.guarding = False
        """It runs as a guardian of a text-only model here, which is loaded back after."""


class RequestLending:
    """The proxy's one question to lending per request, held by the node as `lending_gate`."""

    def __init__(self, node: ServingNode) -> None:
        self.node = node

    async def ask(
        self,
        ctx: C,
        job: J,
        runtime: LendingRuntime,
        acquire: Callable[[], Awaitable[T]],
        shape: Shaper[C, J],
    ) -> Turn[T]:
        """Admit, relay, or give back: what to do with a request bound for `runtime`.

        Returns when the request runs here, with `turn.launch` from `acquire` (which waits for
        the runtime, maybe for a model load), or when a helper already answered the client
        through `shape` (`turn.launch` is None). Raises RouterError 409 (`offload_returned`)
        when a borrowed request goes back to its owner. After a return the caller ends the turn
        with `done`; after a raise (this one, the client leaving, `acquire` failing) it is over.
        """
        if ctx.borrowed:
            return await self._helper(ctx, job, acquire)
        node = self.node
        lending = node.lending
        turn: Turn[T] = Turn(job, False)
        lending.own_begin()
        try:
            lane = job.lane
            arrived = lending.clock()
            enrolled = lending.is_queued(lane, job.model_id)
            # An enrolled request's wait behind borrowed work is logged by its router queue;
            # an unlinked model goes straight to the runtime, so it is counted here: only the
            # borrowed jobs holding the runtime, not those the line below hands back.
            ahead = 0 if enrolled else borrowed_running_on(node, lane, runtime)
            # The node's own request, enrolled or not: borrowed work it has not started goes
            # back to its owners now, so its own work goes first.
            yield_borrowed(node, lane)
            if enrolled and await self._owner(ctx, job, turn, shape):
                return turn  # a helper answered the client
            if job.guardian_restore:
                node.restore.guardian_started(job)
                turn.guarding = True
            else:
                node.restore.own_started(job)
            turn.launch = await acquire()
            log_waited_behind_borrowed(
                node,
                lane,
                job.model_id,
                ahead,
                arrived,
                request_id=ctx.request_id,
                key_name=tenant_of(ctx)[0] if ahead else None,
            )
        except BaseException:
            self.done(turn)
            raise
        return turn

    def done(self, turn: Turn[Any]) -> None:
        """The request is over (answered, failed or cancelled): free what its turn holds."""
        node = self.node
        lending = node.lending
        job = turn.job
        entry = turn.entry
        if entry is not None:
            admitted = entry.state is State.ADMITTED
            lending.release(job.lane, entry)
            if admitted and not turn.borrowed:
                node.owner.report(job.lane, job.model_id, "completed")
        if turn.borrowed:
            node.restore.borrowed_finished(job)
        else:
            if turn.guarding:
                node.restore.guardian_finished(job)
            lending.own_end()

    async def _owner(self, ctx: C, job: J, turn: Turn[T], shape: Shaper[C, J]) -> bool:
        """An enrolled model's own request: True when a helper answered it."""
        node = self.node
        entry = turn.entry = queue_entry(node, job)
        entry.request_id = ctx.request_id
        entry.tenant, entry.weight = tenant_of(ctx)
        if job.has_image:
            node.owner.image_entries.add(id(entry))
        try:
            return await owner_turn(ctx, node, job, entry, shape)
        finally:
            node.owner.image_entries.discard(id(entry))

    async def _helper(self, ctx: C, job: J, acquire: Callable[[], Awaitable[T]]) -> Turn[T]:
        node = self.node
        turn: Turn[T] = Turn(job, True)
        try:
            turn.entry = await helper_turn(ctx, node, job)
            node.restore.borrowed_started(job, ctx.offload_restore)
            turn.launch = await borrowed_acquire(
                node, job, acquire(), request_id=ctx.request_id, key_name=tenant_of(ctx)[0]
            )
        except BaseException:
            self.done(turn)
            raise
        return turn


def queue_entry(node: ServingNode, job: RequestJob) -> Entry:
    """A router-queue entry with this request's size estimate (for pricing and the context gate).

    Text sizes come from the model's measured token profile; without one the entry is unsized
    (the spec's discipline: no estimate before enough measured traffic). Streams are pinned:
    only a buffered, replayable body can be lent; so is what its path makes unlendable.
    """
    now = node.lending.clock()
    pinned = job.stream or not job.lendable
    if job.lane == "image" and job.image is not None:
        return fair_priced(
            node, job, Entry(job.model_id, now, work=(float(job.image.units),), pinned=pinned)
        )
    costs = node.lending.costs
    profile = costs.tokens.get(job.model_id) if costs is not None else None
    if profile is None:
        return fair_priced(node, job, Entry(job.model_id, now, pinned=pinned))
    max_tokens = job.max_tokens
    # Work is priced against fits in measured tokens, so it takes the mean ratio; only the
    # context gate below errs on the safe side with the conservative one.
    prompt = profile.expected_prompt_tokens(len(job.body))
    output = float(max_tokens) if max_tokens else profile.mean_output_tokens
    context = profile.required_context(
        len(job.body), max_tokens, node.lending.settings.context_reserve
    )
    return fair_priced(
        node,
        job,
        Entry(
            job.model_id,
            now,
            work=(float(prompt), output),
            cached=cached_work(prompt, job.cached_prompt_bytes, len(job.body)),
            context=context,
            pinned=pinned,
        ),
    )


def fair_priced(node: ServingNode, job: RequestJob, entry: Entry) -> Entry:
    """With fair share: the entry's cost (the model's fit's price of its work, in ms) and its
    depth (the backend's `parallel`)."""
    if not node.lending.fair_share:
        return entry
    entry.depth = max(1, job.cfg.parallel or 1)
    costs = node.lending.costs
    lane = job.lane
    fit = section_fit(costs.models, lane, job.model_id) if costs and lane in LANES else None
    price = fit.predict(entry.work) if fit is not None and entry.work else None
    entry.cost = clean_cost(price, UNPRICED_COST_MS)
    return entry


def tenant_of(ctx: RequestCtx) -> tuple[str, float]:
    """(key name, fair-share weight) a request waits under; ("", 1.0) without a stored key.

    The name is the one usage counts (`ctx.key_name`: the caller's, or on a node-protocol
    call the relaying node's word). A request another node let in (a lent one, or one the
    master passed on) waits under the key and share that node sent: headers read only on the
    node protocol (cluster token), never on a client's request.
    """
    name = (ctx.key_name or "")[:KEY_NAME_MAX_CHARS]
    caller = caller_of(ctx.scope)
    if ctx.borrowed or caller.kind == MASTER:
        share = ctx.header(KEY_SHARE_HEADER_BYTES) or b""
        try:
            return name, clean_weight(float(share.decode("ascii")))
        except (UnicodeDecodeError, ValueError):
            return name, 1.0
    return name, clean_weight(caller.share)


def key_share(ctx: RequestCtx) -> str | None:
    """The request's key's share as a relay to a helper carries it (None without a key)."""
    name, weight = tenant_of(ctx)
    return repr(weight) if name else None


def key_share_header(ctx: RequestCtx) -> dict[str, str]:
    """The header that carries the share beside main's `X-Router-Key-Name` (access/keyheader.py)."""
    share = key_share(ctx)
    return {KEY_SHARE_HEADER: share} if share else {}


def relayed_key_share(ctx: RequestCtx) -> str | None:
    """The master passes a lent request's share on to the helper as the owner sent it."""
    raw = ctx.header(KEY_SHARE_HEADER_BYTES)
    return raw.decode("latin-1") if raw else None


def cached_work(prompt_tokens: float, cached_bytes: int, body_bytes: int) -> tuple[float, ...]:
    """The part of a text entry's work that the owner's prompt cache covers, as (prompt, 0).

    The cached prefix is measured in bytes of the body (registry/affinity.py); the prompt's
    tokens are taken to spread evenly over them. () when nothing is cached.
    """
    if cached_bytes <= 0 or body_bytes <= 0:
        return ()
    share = min(1.0, cached_bytes / body_bytes)
    return (float(prompt_tokens) * share, 0.0)


# -- owner ------------------------------------------------------------------------------------


async def owner_turn(ctx: C, node: ServingNode, job: J, entry: Entry, shape: Shaper[C, J]) -> bool:
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


def report_enqueued(node: ServingNode, lane: str, entry: Entry) -> None:
    if entry.state is not State.ADMITTED and not entry.borrowed:
        # A lent slot left free under the live lease (nothing was held when it freed) takes
        # this request now, not a master round trip later; the master still hears of it.
        # One the hold kept with a lent slot free is already on its way (`lend_held`).
        if entry.state is not State.HELD:
            node.owner.refill(lane, entry.model_id)
        node.owner.report(lane, entry.model_id, "enqueued")


class Takeback(asyncio.Future[None]):
    """Resolved when the helper's own work takes back a borrowed request still waiting for its
    runtime (or for the helper model to load).

    It knows that runtime, so a native request can tell the borrowed work it really waits
    behind (holding the runtime) from the borrowed work it is about to hand back.
    """

    def __init__(self, runtime: LendingRuntime) -> None:
        super().__init__(loop=asyncio.get_running_loop())
        self.runtime_key = id(runtime)


def borrowed_running_on(node: ServingNode, lane: str, runtime: LendingRuntime) -> int:
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


def yield_borrowed(node: ServingNode, lane: str) -> None:
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


def _log_waited(node: ServingNode, lane: str, entry: Entry) -> None:
    if entry.borrowed:
        return
    log_waited_behind_borrowed(
        node,
        lane,
        entry.model_id,
        entry.borrowed_ahead,
        entry.arrived_at,
        request_id=entry.request_id,
        key_name=entry.tenant,
    )


def log_waited_behind_borrowed(
    node: ServingNode,
    lane: str,
    model_id: str,
    borrowed_ahead: int,
    arrived_at: float,
    *,
    request_id: str | None = None,
    key_name: str | None = None,
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
        request_id=request_id or None,
        key_name=key_name or None,
    )


def _cutoff(lease: Lease) -> float | None:
    if not lease.knows_speeds():
        return None  # probes and unmeasured leases have no such limit
    switch = lease.helper_switch_ms or 0.0
    job = lease.helper_service_ms or 0.0
    return CUTOFF_FACTOR * (switch + job) / 1000.0 + CUTOFF_GRACE_SECS


async def relay(ctx: C, node: ServingNode, job: J, lease: Lease, shape: Shaper[C, J]) -> bool:
    """Send a lent request owner → master → helper; answer the client from the helper.

    False when it came back (409, a helper error, an unreachable master or helper, or the
    cutoff): the owner then runs it itself, so the client still gets exactly one answer.
    """
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
                            request_id=ctx.request_id,
                            key_name=ctx.key_name,
                            key_share=key_share(ctx),
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
                headers = _relay_request_headers(ctx, node, job, client.authorization)
                resp = await stack.enter_async_context(
                    get_session().post(
                        url, data=job.body, headers=headers, allow_redirects=False, ssl=client.ssl
                    )
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


def _relay_request_headers(
    ctx: RequestCtx, node: ServingNode, job: RequestJob, authorization: str
) -> dict[str, str]:
    """A slave owner's lent request to the master: whose it is, where it goes, and the key it
    came with (the helper's usage row names it)."""
    return {
        "Content-Type": job.content_type.decode("latin-1"),
        "Authorization": authorization,
        "X-Tensors-Offload-Owner": node.node_id,
        "X-Tensors-Offload-Owner-Model": job.model_id,
        "X-Tensors-Offload-Path": job.backend_path,
        "X-Tensors-Offload-Lane": job.lane,
        "X-Request-Id": ctx.request_id,
        **key_name_header(ctx.key_name),
        **key_share_header(ctx),
    }


# -- helper -----------------------------------------------------------------------------------


def _helper_row(
    node: ServingNode,
    lane: str,
    model_id: str,
    reason: str,
    request_id: str | None,
    key_name: str | None = None,
) -> None:
    node.decisions.record(
        kind="helper",
        lane=lane,
        helper_node_id=node.node_id,
        helper_model_id=model_id,
        outcome="borrowed_returned",
        reason=reason,
        request_id=request_id or None,
        key_name=key_name or None,
    )


async def borrowed_acquire(
    node: ServingNode,
    job: RequestJob,
    acquiring: Awaitable[T],
    *,
    request_id: str | None = None,
    key_name: str | None = None,
) -> T:
    """Wait for the runtime (maybe a model load) unless the helper's own work takes it back."""
    lane = job.lane
    takeback = Takeback(node.runtimes.runtime_for(job.cfg, lane))
    waiting = node.lending.borrowed_waiting.setdefault(lane, set())
    waiting.add(takeback)
    task = asyncio.ensure_future(acquiring)
    either: set[asyncio.Future[Any]] = {task, takeback}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
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
    _helper_row(node, lane, job.model_id, "own_work_arrived", request_id, key_name)
    raise offload_returned("the helper's own work arrived before this request started")


async def helper_turn(ctx: RequestCtx, node: ServingNode, job: RequestJob) -> Entry:
    """Queue a borrowed request behind every native one; 409 whenever it must go back."""
    lending = node.lending
    lane = job.lane
    key_name = tenant_of(ctx)[0]
    if lane not in ("text", "image"):
        raise offload_returned("this lane does not take borrowed work")
    if not lending.accepting_borrowed(lane):
        _helper_row(node, lane, job.model_id, "helper_busy_on_arrival", ctx.request_id, key_name)
        raise offload_returned("the helper is busy with its own work")
    if not ctx.offload_load and not node.runtimes.is_loaded(job.cfg):
        _helper_row(node, lane, job.model_id, "load_forbidden", ctx.request_id, key_name)
        raise offload_returned("serving would need a model load that the link forbids")
    # Sized and priced like a native request, and queued under its owner's key.
    entry = queue_entry(node, job)
    entry.borrowed, entry.pinned, entry.request_id = True, False, ctx.request_id
    entry.tenant, entry.weight = tenant_of(ctx)
    outcome = await lending.admit(lane, entry)
    if outcome == RETURNED:
        _helper_row(node, lane, job.model_id, "own_work_arrived", ctx.request_id, key_name)
        raise offload_returned("the helper's own work arrived")
    return entry
