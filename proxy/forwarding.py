"""Forwarding a request to a backend (local runtime) or to the node that holds the model.

The hot path does no database work and no JSON work beyond what the answer needs: the model ID
rewritten when the public ID differs from the serving node's local ID, and `usage` read for
analytics. Analytics rows go to an in-memory buffer (analytics/recorder.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import aiohttp
import orjson

from guardians.routing import REFUSAL_STATUSES, ImageRefused, is_image_refusal
from lending.flow import Turn
from proxy import metrics, stt, translate, work
from proxy.backends import Launch, auth_headers
from proxy.inflight import Forward
from proxy.node import Node
from proxy.rewrite import (
    InvalidBackendJSON,
    NDJSONRewriter,
    SSERewriter,
    UsageTracker,
    rewrite_json_model,
    usage_from_json,
)
from proxy.runtimes import Runtime
from proxy.streamusage import TEXT_STREAM_PATHS, UsageStripper, ask_for_usage
from registry.affinity import PrefixMatch
from registry.bodies import InvalidRequestJSON, set_body_model
from registry.cluster import Replica
from registry.httpclient import get_session
from registry.kcpps import Lane, ModelConfig
from registry.nodeclient import NodeCallError
from routerproject import request_ids
from routerproject.errors import BackendError, RouterError, error_body

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON = b"application/json"
NDJSON = b"application/x-ndjson"
SSE = b"text/event-stream"
CLIENT_CLOSED = 499


@dataclass
class Ctx:
    """One client request in flight."""

    scope: Scope
    receive: Receive
    send: Send
    path: str
    method: str
    body: bytes = b""
    started: bool = False
    finished: bool = False
    disconnected: bool = False
    status: int = 0
    borrowed: bool = False
    """A lent request from another node (set by the node protocol, never by a client header)."""
    offload_load: bool = False
    offload_restore: bool = False
    guardian_restore: bool = False
    """Answering for a text-only model of this node as its guardian: load that model back after."""
    request_id: str = ""
    """The ID every answer, analytics row, decision row and log line of this request carries."""
    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)
    # What the access line and the metrics say about the request (proxy/observe.py).
    model: str = ""
    """The model the client asked for."""
    served_node: str = ""
    backend: str = ""
    """What served it here: `<lane>/<backend family>`, or `node` when another node did."""
    lent_to: str = ""
    """The helper node that answered it, when it was lent."""
    first_byte: float = 0.0
    sent_bytes: int = 0
    upstream_secs: float = 0.0
    """Time waiting on the model: queue, load, backend or the next node (not router work)."""
    prefix_match: PrefixMatch | None = None
    """The replica the routing choice picked for the prompt prefix it holds in cache."""

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.scope["headers"]:
            if key == name:
                return bytes(value)
        return None

    async def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        self.first_byte = time.monotonic()
        out = list(headers)
        if self.request_id:
            out.append((request_ids.HEADER, self.request_id.encode("ascii")))
        await self.send({"type": "http.response.start", "status": status, "headers": out})

    async def chunk(self, data: bytes) -> None:
        if data:
            self.sent_bytes += len(data)
            await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        self.finished = True
        self.sent_bytes += len(data)
        await self.send({"type": "http.response.body", "body": data, "more_body": False})

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON,
        extra: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        # A length lets the client (or a master relaying this answer) skip chunked decoding.
        length = str(len(body)).encode()
        headers = [(b"content-type", content_type), (b"content-length", length), *extra]
        await self.start(status, headers)
        await self.end(body)

    async def json(self, status: int, doc: Any) -> None:
        await self.respond(status, orjson.dumps(doc))

    async def error(self, err: RouterError) -> None:
        extra = []
        if err.retry_after is not None:
            extra.append((b"retry-after", str(err.retry_after).encode()))
        await self.respond(err.status, error_body(self.path, err), extra=extra)


Handler = Callable[[Ctx, Node], Awaitable[None]]


# -- request parsing ------------------------------------------------------------------------


def parse_json_body(ctx: Ctx) -> dict[str, Any]:
    if not ctx.body.strip():
        raise RouterError(400, "request body is empty; a JSON object is required")
    try:
        doc = orjson.loads(ctx.body)
    except orjson.JSONDecodeError as exc:
        raise RouterError(400, f"invalid JSON body: {exc}") from exc
    if not isinstance(doc, dict):
        raise RouterError(400, "request body must be a JSON object")
    return doc


def require_model(doc: dict[str, Any]) -> str:
    model = doc.get("model")
    if model is None or model == "":
        raise RouterError(400, "model is required", param="model")
    if not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    return model


# -- forwarding -----------------------------------------------------------------------------


class NotSent(RouterError):
    """The request never reached its target: the connection was refused, or reset while the
    request was still being written. It cannot have run there, so it may go to another
    replica (or the restarted backend) once; every other failure is answered as it is."""


class SentBody(aiohttp.BytesPayload):
    """A request body that notes when it has been handed over whole.

    An inference server runs nothing before it has the whole body, so a connection that
    failed while the body was still being written cannot have run the request anywhere.
    """

    written = False

    async def write_with_length(
        self, writer: aiohttp.abc.AbstractStreamWriter, content_length: int | None
    ) -> None:
        await super().write_with_length(writer, content_length)
        self.written = True


def never_sent(exc: BaseException, body: SentBody | None = None) -> bool:
    """Whether an aiohttp failure happened before the whole request was handed over."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return True  # no connection: refused, unreachable, reset during the handshake
    # Reset or closed while the body was still being written (a read of the answer can
    # notice the reset first, so the body's own record decides, not the exception's wording).
    return (
        body is not None
        and not body.written
        and isinstance(exc, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))
    )


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
    """Answered by a helper: the helper records it; the owner's own fits must not see it."""
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


def _record(ctx: Ctx, node: Node, job: Job, failure: RouterError | None = None) -> None:
    from analytics.recorder import RequestSample

    if job.lent or job.not_sent:
        return
    usage = job.usage or {}
    prompt_tokens = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    output_tokens = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    details = usage.get("prompt_tokens_details")
    cached_tokens = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    image = job.image
    status = _outcome(ctx, failure)
    metrics.tokens_counted(job.public_id, prompt_tokens, output_tokens)
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
        )
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
            # A helper answered the client.
            helper = turn.entry.helper if turn.entry is not None else None
            ctx.lent_to = helper[0] if helper is not None else "helper"
            ctx.backend = f"{job.lane}/lent"
            return
        ctx.backend = f"{job.lane}/{launch.family}"
        # A server the router did not start (or started under a served name) may answer
        # under any name; a backend it started answers under the ID it was given.
        job.foreign_name = (
            launch.argv is None or launch.family == "kobold" or job.cfg.upstream_model is not None
        )
        try:
            url = launch.base_url + launch.backend_path(job.backend_path)
            if job.query:
                url += "?" + job.query
            session = get_session()
            body = SentBody(_backend_body(job, launch))
            sent = time.monotonic()
            async with session.request(
                job.method,
                url,
                data=body,
                headers=_backend_headers(job),
                timeout=node.request_timeout,
            ) as resp:
                if job.guardian_fallback and resp.status in REFUSAL_STATUSES:
                    await _check_refusal(ctx, resp)
                await shape(ctx, job, resp)
            job.service_ms = _service_ms(runtime, launch, sent)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            message = f"backend for model {job.public_id!r} failed: {type(exc).__name__}: {exc}"
            if not ctx.started:
                died = _cut_off(exc) and await runtime.died(launch)
                if never_sent(exc, body) or died:
                    # Never reached, or reached a backend process that is dead now: nothing of
                    # it can answer, so it runs once more.
                    if backend_gone(exc, died=died):
                        # The next acquire starts the backend again rather than hand out the
                        # dead one.
                        runtime.backend_lost(launch, f"{type(exc).__name__}: {exc}")
                    job.not_sent = True
                    raise NotSent(
                        502, message, type="backend_error", code="backend_failed"
                    ) from exc
            raise RouterError(502, message, type="backend_error", code="backend_failed") from exc
        finally:
            runtime.release()
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
        return stt.replace_multipart_model(job.body, job.model_id, served)
    return job.body


async def _check_refusal(ctx: Ctx, resp: aiohttp.ClientResponse) -> None:
    """Raise ImageRefused when the backend's error says it cannot read the image.

    Error bodies are small and read once; aiohttp keeps the bytes, so the shaper still passes
    any other error through unchanged.
    """
    data = await resp.read()
    if is_image_refusal(resp.status, data):
        ctx.status = resp.status  # the refused attempt's analytics row shows the refusal
        raise ImageRefused(resp.status, data, _content_type(resp))


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


def _content_type(resp: aiohttp.ClientResponse) -> bytes:
    return resp.headers.get("Content-Type", "application/octet-stream").encode("latin-1")


async def shape_openai(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
    """Pass an OpenAI answer through, rewriting the model to the public ID when they differ."""
    ctype = _content_type(resp)
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


def _ollama_shaper(kind: str) -> Shaper:
    async def shape(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
        ctype = _content_type(resp)
        if resp.status >= 300:
            data = await resp.read()
            await ctx.respond(resp.status, translate.openai_error_to_ollama(data))
            return
        if ctype.startswith(SSE):
            streamer = translate.OllamaStreamTranslator(
                kind=kind,  # type: ignore[arg-type]
                model=job.public_id,
                started_ns=int(ctx.wall0 * 1e9),
            )
            tracker = UsageTracker()
            await ctx.start(200, [(b"content-type", NDJSON)])
            async for data in resp.content.iter_any():
                tracker.feed(data)
                await ctx.chunk(streamer.feed(data, time.time_ns()))
            await ctx.end(streamer.finish(time.time_ns()))
            job.usage = tracker.usage()
            return
        data = await resp.read()
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise RouterError(502, "backend returned invalid json", type="backend_error") from exc
        job.usage = doc.get("usage") if isinstance(doc, dict) else None
        convert = (
            translate.openai_to_ollama_chat
            if kind == "chat"
            else translate.openai_to_ollama_generate
        )
        out = convert(
            doc, model=job.public_id, started_ns=int(ctx.wall0 * 1e9), now_ns=time.time_ns()
        )
        await ctx.json(200, out)

    return shape


def _ollama_embed_shaper(legacy: bool) -> Shaper:
    async def shape(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
        data = await resp.read()
        if resp.status >= 300:
            await ctx.respond(resp.status, translate.openai_error_to_ollama(data))
            return
        try:
            doc = orjson.loads(data)
            out = translate.openai_to_ollama_embed(
                doc,
                model=job.public_id,
                legacy=legacy,
                started_ns=int(ctx.wall0 * 1e9),
                now_ns=time.time_ns(),
            )
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise RouterError(
                502, f"backend returned invalid embeddings: {exc}", type="backend_error"
            ) from exc
        job.usage = doc.get("usage") if isinstance(doc, dict) else None
        await ctx.json(200, out)

    return shape


async def shape_kobold(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
    data = await resp.read()
    if resp.status >= 300:
        await ctx.respond(resp.status, data, _content_type(resp))
        return
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RouterError(502, "backend returned invalid json", type="backend_error") from exc
    job.usage = doc.get("usage") if isinstance(doc, dict) else None
    await ctx.json(200, translate.openai_to_kobold(doc))


def backend_gone(exc: BaseException, *, died: bool) -> bool:
    """Whether a request that never reached its backend shows the backend itself is gone.

    A refused connection or an exited process is; a pooled connection the backend had closed
    (reset while the request was being written, the process still running) is not: that
    backend is fine, and reloading it would cost a whole model load for nothing.
    """
    return died or isinstance(exc, aiohttp.ClientConnectorError)


def _cut_off(exc: BaseException) -> bool:
    """The connection closed or was reset before any answer (a crashed backend does that)."""
    return isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))


# -- forwarding to another node -------------------------------------------------------------

NODE_INFERENCE_PREFIX = "/router/v1/node/inference"


_STREAM_HEADERS = ((b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"))


class Relay(Protocol):
    """A filter over a relayed answer's bytes (a family's own rewriting of its answers)."""

    def feed(self, chunk: bytes) -> bytes: ...

    def close(self) -> bytes: ...


RelayFactory = Callable[[int, bytes], Relay]
"""Makes the `Relay` for an answer, given its status and content type."""


async def _relay_whole(
    ctx: Ctx,
    resp: aiohttp.ClientResponse,
    ctype: bytes,
    public_id: str | None,
    guardian_fallback: bool,
    fwd: Forward,
    relay: Relay | None = None,
) -> None:
    """A buffered answer from another node, its model ID rewritten when ``public_id`` is set."""
    data = await resp.read()
    fwd.heard()
    if guardian_fallback and is_image_refusal(resp.status, data):
        ctx.status = resp.status
        raise ImageRefused(resp.status, data, ctype)
    if relay is not None:
        data = relay.feed(data) + relay.close()
    elif public_id is not None and ctype.startswith(JSON):
        try:
            data = rewrite_json_model(data, public_id)
        except InvalidBackendJSON as exc:
            raise RouterError(502, "backend returned invalid json", type="backend_error") from exc
    await ctx.respond(resp.status, data, ctype)


async def _relay_stream(
    ctx: Ctx,
    resp: aiohttp.ClientResponse,
    ctype: bytes,
    public_id: str | None,
    fwd: Forward,
    relay: Relay | None = None,
) -> None:
    """An SSE or NDJSON answer from another node, passed on chunk by chunk."""
    rewriter: Relay | None = relay
    if rewriter is None and public_id is not None:
        rewriter = SSERewriter(public_id) if ctype.startswith(SSE) else NDJSONRewriter(public_id)
    await ctx.start(resp.status, [(b"content-type", ctype), *_STREAM_HEADERS])
    async for chunk in resp.content.iter_any():
        fwd.heard()
        await ctx.chunk(rewriter.feed(chunk) if rewriter else chunk)
    await ctx.end(rewriter.close() if rewriter else b"")


async def forward_remote(
    ctx: Ctx,
    node: Node,
    replica: Replica,
    *,
    lane: str,
    path: str,
    body: bytes,
    public_id: str,
    served_id: str,
    content_type: bytes = JSON,
    guardian_fallback: bool = False,
    guardian_restore: bool = False,
    model_header: str | None = None,
    relay: RelayFactory | None = None,
) -> None:
    """Send the request to the node holding `replica` and stream its answer back.

    The request runs through that node's own pipeline (`/router/v1/node/inference<path>`), so
    its runtimes, queue and analytics apply there; here only the IDs are rewritten back to the
    public one, in JSON, SSE and NDJSON answers alike, or by `relay` when the family gives one
    (it rewrites, and reads what it must remember, such as a created response's ID).
    """
    client = node.client
    if client is None:
        raise RouterError(502, "this node has no cluster client", type="backend_error")
    busy_key = (replica.node_id, replica.local_id, lane)
    node.busy[busy_key] += 1
    rewrite_to = public_id if public_id != served_id and lane != "whisper" else None
    query = ctx.scope.get("query_string", b"").decode("latin-1")
    url_path = NODE_INFERENCE_PREFIX + path + (f"?{query}" if query else "")
    headers = {
        "Content-Type": content_type.decode("latin-1"),
        "Authorization": client.authorization,
        # The serving node records the request under the ID this node answers with.
        "X-Request-Id": ctx.request_id,
    }
    if guardian_restore:
        headers["X-Tensors-Guardian-Restore"] = "1"
    if model_header is not None:
        headers["X-Tensors-Model"] = model_header
    ctx.served_node = replica.node_id
    ctx.backend = "node"
    waited = time.monotonic()
    fwd = node.forwards.begin(replica.node_id)
    sent = SentBody(body)
    try:
        # The hot path uses the process's aiohttp session (measured ~2 ms faster per hop than
        # httpx over its aiohttp transport); the node client's allow-list still decides where
        # the cluster token may go, and redirects are never followed.
        url = client.checked_url(replica.node_url, url_path)
        # The client's method: the node routes the inner path by it, as a client's own request.
        async with get_session().request(
            ctx.method,
            url,
            data=sent,
            headers=headers,
            allow_redirects=False,
            timeout=node.request_timeout,
        ) as resp:
            fwd.heard()
            ctype = _content_type(resp)
            own = relay(resp.status, ctype) if relay is not None else None
            if ctype.startswith((SSE, NDJSON)):
                await _relay_stream(ctx, resp, ctype, rewrite_to, fwd, own)
            else:
                await _relay_whole(ctx, resp, ctype, rewrite_to, guardian_fallback, fwd, own)
    except asyncio.CancelledError:
        if not fwd.cut or ctx.disconnected:
            raise
        # Cut off because the node stopped answering (see proxy/inflight.py): the client gets
        # an error now instead of waiting out the request timeout.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        raise RouterError(
            502,
            f"node {replica.node_id!r} stopped answering while serving {public_id!r}: {fwd.cut}",
            type="backend_error",
            code="node_failed",
        ) from None
    except NodeCallError as exc:
        raise RouterError(
            502,
            f"node {replica.node_id!r} failed to serve {public_id!r}: {exc}",
            type="backend_error",
            code="node_failed",
        ) from exc
    except (TimeoutError, aiohttp.ClientError, OSError, InvalidBackendJSON) as exc:
        error = RouterError if ctx.started or not never_sent(exc, sent) else NotSent
        raise error(
            502,
            f"node {replica.node_id!r} failed while serving {public_id!r}: "
            f"{type(exc).__name__}: {exc}",
            type="backend_error",
            code="node_failed",
        ) from exc
    finally:
        ctx.upstream_secs += time.monotonic() - waited
        node.forwards.end(fwd)
        node.busy[busy_key] -= 1
