"""Forwarding a request to a backend of this node (a local runtime), and the plain OpenAI shaper.

The hot path does no database work and no JSON work beyond what the answer needs: the model ID
rewritten when the public ID differs from the serving node's local ID, and `usage` read for
analytics. Analytics rows go to an in-memory buffer (analytics/recorder.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import aiohttp

from access.limits import charge_usage
from analytics.recorder import RequestSample
from guardians.routing import REFUSAL_STATUSES, ImageRefused, is_image_refusal
from lending.flow import Turn
from proxy import work
from proxy.forwarding.faults import NotSent, SentBody, backend_gone, cut_off, never_sent
from proxy.forwarding.rewrite import (
    InvalidBackendJSON,
    SSERewriter,
    UsageTracker,
    rewrite_json_model,
    usage_from_json,
)
from proxy.forwarding.streamusage import TEXT_STREAM_PATHS, UsageStripper, ask_for_usage
from proxy.node import Node
from proxy.observe import metrics
from proxy.request import JSON, SSE, Ctx
from proxy.runtimes.backends import Launch, auth_headers
from proxy.runtimes.runtime import Runtime
from registry.bodies import InvalidRequestJSON, set_body_model
from registry.httpclient import get_session
from registry.kcpps import Lane, ModelConfig
from routerproject.errors import BackendError, RouterError

logger = logging.getLogger(__name__)

CLIENT_CLOSED = 499


# -- forwarding -----------------------------------------------------------------------------


@dataclass
class Job:
    """What one forwarded request needs: target, body, and the numbers analytics records."""

    cfg: ModelConfig
    lane: Lane
    model_id: str
    public_id: str
    backend_path: str
    body: bytes
    content_type: bytes = JSON
    stream: bool = False
    prompt_bytes: int = 0
    image: work.ImageWork | None = None
    max_tokens: int | None = None
    usage: dict[str, Any] | None = None
    lent: bool = False
    """Answered by a helper: the helper records it; the owner's own fits must not see it.
    (One a helper hands back is the owner's again: the helper records nothing of it.)"""
    has_image: bool = False
    """Carries an image: never lent to a helper without vision."""
    service_ms: float | None = None
    """The backend's own time for this job (set on success; see _service_ms)."""
    guardian_fallback: bool = False
    """A guardian is set: a backend's refusal of the image raises ImageRefused instead."""
    guardian_restore: bool = False
    """Run as the guardian of a text-only model here: the displaced model is loaded back."""
    hide_usage: bool = False
    """The router asked the backend for the stream's usage; the client did not, so it is
    taken out of what the client sees."""
    not_sent: bool = False
    """Never reached the backend (it is retried): no analytics row of its own."""
    foreign_name: bool = False
    """The backend may answer under a name of its own (an upstream server, KoboldCpp, a
    served name): the answer's model is rewritten to the public ID whatever it says."""
    model_header: str | None = None
    """The client's `X-Tensors-Model`, already set to the ID the backend serves."""
    method: str = "POST"
    """The client's method: a follow-up on a stored response is a GET or a DELETE."""
    query: str = ""
    """The client's query string, for the backend (ComfyUI's `/view?filename=`)."""
    lendable: bool = True
    """Whether lending may run it on a linked helper: only the core generation paths, whose
    answers hold no state a later request must find on this node (a stored response, a job)
    and which every helper backend serves."""
    cached_prompt_bytes: int = 0
    """Leading bytes of the prompt this node's backend holds in its prompt cache (the routing
    choice's prefix match): lending prices the owner's work without them."""


async def _acquire(runtime: Runtime, job: Job, *, borrowed: bool = False) -> Launch:
    try:
        # A load done for borrowed work is not the node's own work (it does not reset idle).
        return await runtime.acquire(job.cfg, reason="borrowed" if borrowed else "own")
    except BackendError as exc:
        raise RouterError(502, str(exc), type="backend_error", code="backend_unavailable") from exc


def _backend_headers(job: Job) -> dict[str, str]:
    headers = {"Content-Type": job.content_type.decode("latin-1"), **auth_headers(job.cfg)}
    if job.model_header is not None:
        headers["X-Tensors-Model"] = job.model_header
    if job.stream:
        # llama-server closes the connection after every stream while its answer promises
        # keep-alive; pooled, that connection would take the next request and drop it (a
        # 502 "Server disconnected"). A stream gets its own connection: one loopback
        # handshake, nothing next to a generation.
        headers["Connection"] = "close"
    return headers


def _outcome(ctx: Ctx, failure: RouterError | None) -> int:
    """The status the request ended with, as analytics records it.

    A failure before any answer is the error the client gets (502 for a backend that cannot
    load or answer); one after a 2xx head (a stream cut by a dead backend) is that error too,
    although the client saw 200 and then an error event.
    """
    if ctx.disconnected:
        return CLIENT_CLOSED
    if failure is not None and ctx.status < 300:
        return failure.status
    return ctx.status


def handed_back(ctx: Ctx, failure: RouterError | None) -> bool:
    """A borrowed request its owner gets back: an answer head of 409 or 5xx (see
    lending.flow.relay), or cut off before any answer (the owner's cutoff, or its client gone).
    The owner records it, so this attempt is not a request of its own: usage and the per-key
    metrics would count it twice."""
    if not ctx.borrowed:
        return False
    if ctx.started:
        return ctx.status == 409 or ctx.status >= 500
    if ctx.disconnected:
        return True
    return failure is not None and (failure.status == 409 or failure.status >= 500)


def _record(ctx: Ctx, node: Node, job: Job, failure: RouterError | None = None) -> None:
    if job.lent or job.not_sent or handed_back(ctx, failure):
        return
    usage = job.usage or {}
    prompt_tokens = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    output_tokens = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    details = usage.get("prompt_tokens_details")
    cached_tokens = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    image = job.image
    status = _outcome(ctx, failure)
    metrics.tokens_counted(job.public_id, prompt_tokens, output_tokens)
    key_name = ctx.key_name
    metrics.key_usage_counted(key_name, 200 <= status < 300, prompt_tokens, output_tokens)
    # Toward the key's `tpm` on every node (access/limits.py): the node that ran it counts it.
    charge_usage(key_name, _charged_tokens(job, prompt_tokens, output_tokens))
    node.recorder.add_request(
        RequestSample(
            node_id=node.node_id,
            model_id=job.model_id,
            config_filename=job.cfg.filename,
            lane=job.lane,
            path=ctx.path,
            status=status,
            success=200 <= status < 300,
            stream=job.stream,
            prompt_bytes=job.prompt_bytes,
            prompt_tokens=prompt_tokens,
            cached_tokens=min(cached_tokens, prompt_tokens),
            output_tokens=output_tokens,
            image_width=image.width if image else 0,
            image_height=image.height if image else 0,
            image_steps=image.steps if image else 0,
            image_count=image.n if image else 0,
            duration_ms=(
                job.service_ms
                if job.service_ms is not None
                else (time.monotonic() - ctx.t0) * 1000.0
            ),
            started_at=ctx.wall0,
            finished_at=time.time(),
            borrowed=ctx.borrowed,
            request_id=ctx.request_id or None,
            key_name=key_name,
        )
    )


def _charged_tokens(job: Job, prompt_tokens: int, output_tokens: int) -> int:
    # What the backend reported; a text request it reported nothing for (a stream cut short)
    # counts what the edge estimated for it, so it is not free against `tpm`. An upload (audio,
    # an image edit) is no prompt: its bytes are not tokens.
    if prompt_tokens or output_tokens:
        return prompt_tokens + output_tokens
    if not job.content_type.startswith(JSON):
        return 0
    return work.prompt_tokens_for_bytes(job.prompt_bytes) + (
        job.max_tokens or work.DEFAULT_MAX_TOKENS
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


async def forward(ctx: Ctx, node: Node, job: Job, shape: Shaper) -> None:
    """Acquire the runtime, send the request, stream the answer back through `shape`.

    Lending is asked first, once (`node.lending_gate`): a model enrolled in lending waits for
    admission by its lane's router queue and may be answered by a helper meanwhile, a borrowed
    request may go back to its owner, and an unlinked model skips the queue (one set lookup).
    """
    # A portable config runs only once its weights are verified local files: the request
    # waits here for that (a peer transfer included), before it takes any backend slot.
    job.cfg = await node.assets.ready(job.cfg)
    busy_key = (node.node_id, job.cfg.local_id, job.lane)
    node.busy[busy_key] += 1
    gate = node.lending_gate
    runtime = node.runtimes.runtime_for(job.cfg, job.lane)
    turn: Turn[Launch] | None = None
    ctx.served_node = node.node_id
    waited = time.monotonic()
    failure: RouterError | None = None
    try:
        turn = await gate.ask(
            ctx, job, runtime, partial(_acquire, runtime, job, borrowed=ctx.borrowed), shape
        )
        launch = turn.launch
        if launch is None:
            _lent(ctx, job, turn)
            return
        ctx.backend = f"{job.lane}/{launch.family}"
        # A server the router did not start (or started under a served name) may answer
        # under any name; a backend it started answers under the ID it was given.
        job.foreign_name = (
            launch.argv is None or launch.family == "kobold" or job.cfg.upstream_model is not None
        )
        await _send(ctx, node, job, runtime, launch, shape)
    except RouterError as exc:
        failure = exc
        raise
    except Exception:
        # The client gets a 500 from the front (or, when the backend refused an image, that
        # refusal, which is already the recorded status).
        failure = RouterError(500, "internal router error", type="server_error")
        raise
    finally:
        ctx.upstream_secs += time.monotonic() - waited
        if turn is not None:
            gate.done(turn)
        node.busy[busy_key] -= 1
        _record(ctx, node, job, failure)


def _lent(ctx: Ctx, job: Job, turn: Turn[Launch]) -> None:
    """A helper answered the client: say which on the access line."""
    helper = turn.entry.helper if turn.entry is not None else None
    ctx.lent_to = helper[0] if helper is not None else "helper"
    ctx.backend = f"{job.lane}/lent"


async def _send(
    ctx: Ctx, node: Node, job: Job, runtime: Runtime, launch: Launch, shape: Shaper
) -> None:
    """Send the job to the backend `launch` and stream its answer through `shape`, then free
    the runtime slot `_acquire` took."""
    try:
        url = launch.base_url + launch.backend_path(job.backend_path)
        if job.query:
            url += "?" + job.query
        session = get_session()
        body = SentBody(_backend_body(job, launch))
        sent = time.monotonic()
        # `backend.request_timeout` bounds the whole exchange, the answer's last byte included
        # (proxy/forwarding/deadlines.py: one timer for every request held, not one each).
        deadline = node.deadlines.hold(node.config.backend.request_timeout)
        try:
            async with session.request(
                job.method, url, data=body, headers=_backend_headers(job), ssl=launch.tls
            ) as resp:
                if job.guardian_fallback and resp.status in REFUSAL_STATUSES:
                    await _check_refusal(ctx, resp)
                await shape(ctx, job, resp)
        except asyncio.CancelledError:
            if not deadline.expired_now():
                raise
            raise deadline.error() from None
        finally:
            node.deadlines.release(deadline)
        job.service_ms = _service_ms(runtime, launch, sent)
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        raise await _send_failure(ctx, job, runtime, launch, exc, body) from exc
    finally:
        runtime.release()


async def _send_failure(
    ctx: Ctx, job: Job, runtime: Runtime, launch: Launch, exc: BaseException, body: SentBody
) -> RouterError:
    """The error a failed send raises: NotSent when the request cannot have run (it runs once
    more), else a plain 502."""
    message = f"backend for model {job.public_id!r} failed: {type(exc).__name__}: {exc}"
    if not ctx.started:
        died = cut_off(exc) and await runtime.died(launch)
        if never_sent(exc, body) or died:
            # Never reached, or reached a backend process that is dead now: nothing of
            # it can answer, so it runs once more.
            if backend_gone(exc, died=died):
                # The next acquire starts the backend again rather than hand out the
                # dead one.
                runtime.backend_lost(launch, f"{type(exc).__name__}: {exc}")
            job.not_sent = True
            return NotSent(502, message, type="backend_error", code="backend_failed")
    return RouterError(502, message, type="backend_error", code="backend_failed")


def _backend_body(job: Job, launch: Launch) -> bytes:
    """The body for the backend: under the model name it serves, with the form fields its
    endpoint needs, and a text stream always asks for its usage (streamusage.py)."""
    body = job.body
    served = job.cfg.upstream_model
    if served is not None and job.lane != "image" and served != job.model_id:
        # Set here, at the last step, so that everything before (pricing, lending, a body
        # lent to a helper) sees the router's own model IDs.
        body = _served_body(job, served)
    fields = launch.form_fields.get(job.backend_path)
    if fields:
        body = work.with_multipart_fields(body, job.content_type.decode("latin-1"), fields) or body
    if not (
        job.stream and job.backend_path in TEXT_STREAM_PATHS and job.content_type.startswith(JSON)
    ):
        return body
    asked = ask_for_usage(body)
    if asked is None:
        return body
    job.hide_usage = True
    return asked


def _served_body(job: Job, served: str) -> bytes:
    if job.content_type.startswith(JSON):
        try:
            return set_body_model(job.body, served)
        except InvalidRequestJSON:
            return job.body
    if job.content_type.startswith(b"multipart/"):
        return work.replace_multipart_model(job.body, job.model_id, served)
    return job.body


async def _check_refusal(ctx: Ctx, resp: aiohttp.ClientResponse) -> None:
    """Raise ImageRefused when the backend's error says it cannot read the image.

    Error bodies are small and read once; aiohttp keeps the bytes, so the shaper still passes
    any other error through unchanged.
    """
    data = await resp.read()
    if is_image_refusal(resp.status, data):
        ctx.status = resp.status  # the refused attempt's analytics row shows the refusal
        raise ImageRefused(resp.status, data, content_type_of(resp))


def _service_ms(runtime: Any, launch: Launch, sent: float) -> float:
    """How long the backend worked on this request: what the cost fits must learn from.

    Not the client's latency: time held in the router queue, waiting for a model load, or
    waiting inside a one-slot backend behind the job before it (depth 2 keeps one there) is
    not this job's cost. A one-at-a-time backend starts a job when it sent it or when the
    previous job finished, whichever is later; a server that runs requests concurrently (an
    upstream) starts it when it is sent.
    """
    done = time.monotonic()
    start = sent if launch.family == "upstream" else max(sent, runtime.last_done)
    runtime.last_done = done
    return (done - start) * 1000.0


Shaper = Callable[[Ctx, Job, aiohttp.ClientResponse], Awaitable[None]]


def content_type_of(resp: aiohttp.ClientResponse) -> bytes:
    return resp.headers.get("Content-Type", "application/octet-stream").encode("latin-1")


async def shape_openai(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
    """Pass an OpenAI answer through, rewriting the model to the public ID when they differ."""
    ctype = content_type_of(resp)
    rewrite = (job.public_id != job.model_id or job.foreign_name) and job.lane != "whisper"
    if ctype.startswith(SSE):
        await ctx.start(
            resp.status,
            [
                (b"content-type", ctype),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
            ],
        )
        rewriter = SSERewriter(job.public_id) if rewrite else None
        stripper = UsageStripper() if job.hide_usage else None
        tracker = UsageTracker()
        async for data in resp.content.iter_any():
            tracker.feed(data)
            if stripper is not None:
                data = stripper.feed(data)
            await ctx.chunk(rewriter.feed(data) if rewriter else data)
        tail = stripper.close() if stripper is not None else b""
        await ctx.end(rewriter.feed(tail) + rewriter.close() if rewriter else tail)
        job.usage = tracker.usage()
        return
    data = await resp.read()
    if ctype.startswith(JSON):
        if rewrite:
            try:
                data = rewrite_json_model(data, job.public_id)
            except InvalidBackendJSON as exc:
                raise RouterError(
                    502, "backend returned invalid json", type="backend_error"
                ) from exc
        if resp.status < 300:
            job.usage = usage_from_json(data)
    await ctx.respond(resp.status, data, ctype)
