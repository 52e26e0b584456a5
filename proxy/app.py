"""The inference proxy: an ASGI application for every client-facing model path.

It sits in front of Django's ASGI handler (see routerproject/asgi.py) and claims only the paths
in `ROUTES`; everything else (management API, admin, WebUI) falls through to Django. The hot
path does no database work and no JSON work beyond reading the request's `model` and, for a
non-streamed answer, its `usage`: analytics rows go to an in-memory buffer.

Each request runs four linear phases: read and validate, acquire the runtime (which may load
the model), forward and stream back, release. A task watches for `http.disconnect` while the
request is in flight and cancels it, so a client that goes away frees its backend slot at once
instead of after Daphne's application-close timeout.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from guardians.detect import body_has_image
from proxy import translate, work
from proxy.backends import Lane, Launch
from proxy.httpclient import get_session
from proxy.node import Node, get_node
from proxy.rewrite import (
    InvalidBackendJSON,
    SSERewriter,
    UsageTracker,
    rewrite_json_model,
    usage_from_json,
)
from proxy.runtimes import BackendError
from registry.kcpps import ModelConfig
from routerproject.errors import RouterError, error_body, is_ollama_path

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
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


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
    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.scope["headers"]:
            if key == name:
                return bytes(value)
        return None

    async def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": list(headers)})

    async def chunk(self, data: bytes) -> None:
        if data:
            await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        self.finished = True
        await self.send({"type": "http.response.body", "body": data, "more_body": False})

    async def respond(self, status: int, body: bytes, content_type: bytes = JSON) -> None:
        await self.start(status, [(b"content-type", content_type)])
        await self.end(body)

    async def json(self, status: int, doc: Any) -> None:
        await self.respond(status, orjson.dumps(doc))

    async def error(self, err: RouterError) -> None:
        await self.respond(err.status, error_body(self.path, err))


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


def not_found(model: str) -> RouterError:
    return RouterError(404, f'model "{model}" was not found', code="model_not_found", param="model")


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
    usage: dict[str, Any] | None = None


async def _acquire(node: Node, job: Job) -> tuple[Launch, Callable[[], None]]:
    runtime = node.runtimes.runtime_for(job.cfg, job.lane)
    try:
        launch = await runtime.acquire(job.cfg)
    except BackendError as exc:
        raise RouterError(502, str(exc), type="backend_error", code="backend_unavailable") from exc
    return launch, runtime.release


def _backend_headers(job: Job) -> dict[str, str]:
    return {"Content-Type": job.content_type.decode("latin-1")}


def _record(ctx: Ctx, node: Node, job: Job) -> None:
    from analytics.recorder import RequestSample

    usage = job.usage or {}
    prompt_tokens = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    output_tokens = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    image = job.image
    status = CLIENT_CLOSED if ctx.disconnected else ctx.status
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
            output_tokens=output_tokens,
            image_width=image.width if image else 0,
            image_height=image.height if image else 0,
            image_steps=image.steps if image else 0,
            image_count=image.n if image else 0,
            duration_ms=(time.monotonic() - ctx.t0) * 1000.0,
            started_at=ctx.wall0,
            finished_at=time.time(),
        )
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


async def forward(ctx: Ctx, node: Node, job: Job, shape: Shaper) -> None:
    """Acquire the runtime, send the request, stream the answer back through `shape`."""
    try:
        launch, release = await _acquire(node, job)
        try:
            url = launch.base_url + launch.backend_path(job.backend_path)
            session = get_session()
            async with session.post(url, data=job.body, headers=_backend_headers(job)) as resp:
                await shape(ctx, job, resp)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            raise RouterError(
                502,
                f"backend for model {job.public_id!r} failed: {type(exc).__name__}: {exc}",
                type="backend_error",
                code="backend_failed",
            ) from exc
        finally:
            release()
    finally:
        _record(ctx, node, job)


Shaper = Callable[[Ctx, Job, aiohttp.ClientResponse], Awaitable[None]]


def _content_type(resp: aiohttp.ClientResponse) -> bytes:
    return resp.headers.get("Content-Type", "application/octet-stream").encode("latin-1")


async def shape_openai(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
    """Pass an OpenAI answer through, rewriting the model to the public ID when they differ."""
    ctype = _content_type(resp)
    rewrite = job.public_id != job.model_id and job.lane != "whisper"
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
        tracker = UsageTracker()
        async for data in resp.content.iter_any():
            tracker.feed(data)
            await ctx.chunk(rewriter.feed(data) if rewriter else data)
        await ctx.end(rewriter.close() if rewriter else b"")
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


# -- handlers -------------------------------------------------------------------------------


async def handle_ping(ctx: Ctx, node: Node) -> None:
    await ctx.json(200, {"status": "healthy"})


def _text_target(node: Node, model: str, *, embeddings: bool = False) -> ModelConfig:
    cfg = node.catalog.text_model(model)
    if (
        cfg is None
        or (embeddings and not cfg.has_embeddings)
        or (not embeddings and not cfg.has_llm)
    ):
        raise not_found(model)
    return cfg


def _check_image_input(cfg: ModelConfig, doc: dict[str, Any]) -> None:
    # A text-only model cannot read images; answering with a clear 400 here beats a backend
    # error deep in generation. (Guardian models, which answer such requests instead, hook in
    # here.)
    if not cfg.has_multimodal and cfg.backend_mode != "upstream" and body_has_image(doc):
        raise RouterError(
            400,
            f'model "{cfg.local_id}" does not accept image input (image input is not supported)',
            param="messages",
        )


async def handle_openai_text(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = require_model(doc)
    cfg = _text_target(node, model)
    _check_image_input(cfg, doc)
    job = Job(
        cfg=cfg,
        lane="text",
        model_id=cfg.local_id,
        public_id=model,
        backend_path=ctx.path,
        body=ctx.body,
        stream=doc.get("stream") is True,
        prompt_bytes=len(ctx.body),
    )
    await forward(ctx, node, job, shape_openai)


async def handle_embeddings(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = doc.get("model")
    if model in (None, ""):
        cfg = _default_embeddings(node)
        model = cfg.local_id
        doc["model"] = model
        body = orjson.dumps(doc)
    else:
        model = require_model(doc)
        cfg = _text_target(node, model, embeddings=True)
        body = ctx.body
    job = Job(
        cfg=cfg,
        lane="text",
        model_id=cfg.local_id,
        public_id=model,
        backend_path=ctx.path,
        body=body,
        prompt_bytes=len(body),
    )
    await forward(ctx, node, job, shape_openai)


def _default_embeddings(node: Node) -> ModelConfig:
    # Selector-less embeddings go to a model that is already loaded when there is one, so the
    # request never triggers a switch the client did not ask for.
    candidates = node.catalog.embedding_models()
    for cfg in candidates:
        if node.runtimes.is_loaded(cfg):
            return cfg
    if len(candidates) == 1:
        return candidates[0]
    raise RouterError(400, "model is required", param="model")


async def handle_images(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = doc.get("model")
    if model in (None, "") and ctx.path.startswith("/sdapi/"):
        override = doc.get("override_settings")
        if isinstance(override, dict):
            model = override.get("sd_model_checkpoint")
        model = model or doc.get("sd_model_checkpoint")
        if not model:
            images = node.catalog.image_models()
            if len(images) == 1:
                model = images[0].image_id
    if not isinstance(model, str) or not model:
        raise RouterError(400, "model is required", param="model")
    cfg = node.catalog.image_model(model)
    if cfg is None:
        raise not_found(model)
    try:
        image = work.image_work(doc)
    except ValueError as exc:
        raise RouterError(400, str(exc)) from exc
    job = Job(
        cfg=cfg,
        lane="image",
        model_id=cfg.image_id or cfg.local_id,
        public_id=model,
        backend_path=ctx.path,
        body=ctx.body,
        prompt_bytes=len(ctx.body),
        image=image,
    )
    await forward(ctx, node, job, shape_openai)


async def handle_transcriptions(ctx: Ctx, node: Node) -> None:
    ctype = ctx.header(b"content-type") or b""
    if not ctx.body:
        raise RouterError(400, "an audio file is required", param="file")
    model_field = work.multipart_field(ctx.body, ctype.decode("latin-1"), "model")
    model = model_field.decode("utf-8", "replace").strip() if model_field else ""
    if model:
        cfg = node.catalog.voice_model(model)
        if cfg is None:
            raise not_found(model)
    else:
        cfg = _pick_stt(node)
    job = Job(
        cfg=cfg,
        lane="whisper",
        model_id=cfg.local_id,
        public_id=model or cfg.local_id,
        backend_path=ctx.path,
        body=ctx.body,
        content_type=ctype or b"application/octet-stream",
        prompt_bytes=len(ctx.body),
    )
    await forward(ctx, node, job, shape_openai)


def _pick_stt(node: Node) -> ModelConfig:
    # A loaded transcription config wins: it answers without a model switch.
    candidates = node.catalog.voice_models()
    if not candidates:
        raise RouterError(
            503,
            "no compatible transcription configuration is available",
            type="backend_error",
        )
    for cfg in candidates:
        if node.runtimes.is_loaded(cfg):
            return cfg
    return candidates[0]


async def handle_ollama(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = require_model(doc)
    cfg = _text_target(node, model)
    kind = "chat" if ctx.path == "/api/chat" else "generate"
    try:
        if kind == "chat":
            path, body_doc, stream = translate.ollama_chat_request(doc)
        else:
            path, body_doc, stream = translate.ollama_generate_request(doc)
    except translate.TranslationError as exc:
        raise RouterError(400, str(exc), param=exc.param) from exc
    body_doc["model"] = cfg.local_id
    _check_image_input(cfg, body_doc)
    body = orjson.dumps(body_doc)
    job = Job(
        cfg=cfg,
        lane="text",
        model_id=cfg.local_id,
        public_id=model,
        backend_path=path,
        body=body,
        stream=stream,
        prompt_bytes=len(body),
    )
    await forward(ctx, node, job, _ollama_shaper(kind))


async def handle_kobold(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = doc.get("model")
    if model in (None, ""):
        model = _loaded_text_model(node)
    if not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    cfg = _text_target(node, model)
    try:
        path, body_doc, _ = translate.kobold_generate_request(doc)
    except translate.TranslationError as exc:
        raise RouterError(400, str(exc), param=exc.param) from exc
    body_doc["model"] = cfg.local_id
    body = orjson.dumps(body_doc)
    job = Job(
        cfg=cfg,
        lane="text",
        model_id=cfg.local_id,
        public_id=model,
        backend_path=path,
        body=body,
        prompt_bytes=len(body),
    )
    await forward(ctx, node, job, shape_kobold)


def _loaded_text_model(node: Node) -> str:
    # Kobold clients rarely name a model: KoboldCpp serves whatever it has loaded.
    text = node.runtimes.runtimes["text"].current
    if text is not None and text.has_llm:
        return text.local_id
    llms = [c for c in node.catalog.configs.values() if c.has_llm]
    if len(llms) == 1:
        return llms[0].local_id
    raise RouterError(400, "model is required", param="model")


async def handle_models(ctx: Ctx, node: Node) -> None:
    data = [
        {"id": cfg.local_id, "object": "model", "created": cfg.created, "owned_by": "router"}
        for cfg in sorted(node.catalog.configs.values(), key=lambda c: c.local_id)
        if cfg.has_llm or cfg.has_embeddings
    ]
    await ctx.json(200, {"object": "list", "data": data})


def _ollama_entry(cfg: ModelConfig) -> dict[str, Any]:
    digest = cfg.model_hash if len(cfg.model_hash) == 64 else ""
    if not digest:
        import hashlib

        digest = hashlib.sha256(f"{cfg.local_id}:{cfg.model_hash}".encode()).hexdigest()
    modified = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cfg.created))
    return {
        "name": cfg.local_id,
        "model": cfg.local_id,
        "modified_at": modified,
        "size": cfg.size,
        "digest": f"sha256:{digest}" if len(cfg.model_hash) == 64 else digest,
        "details": {
            "format": "gguf",
            "family": cfg.backend_mode,
            "parameter_size": "",
            "quantization_level": "",
        },
    }


async def handle_tags(ctx: Ctx, node: Node) -> None:
    models = [
        _ollama_entry(cfg)
        for cfg in sorted(node.catalog.configs.values(), key=lambda c: c.local_id)
        if cfg.has_llm or cfg.has_embeddings
    ]
    await ctx.json(200, {"models": models})


async def handle_ps(ctx: Ctx, node: Node) -> None:
    models = []
    for _runtime, cfg in node.runtimes.loaded():
        if cfg.has_llm or cfg.has_embeddings:
            entry = _ollama_entry(cfg)
            entry["expires_at"] = "0001-01-01T00:00:00Z"
            entry["size_vram"] = 0
            models.append(entry)
    await ctx.json(200, {"models": models})


async def handle_ollama_version(ctx: Ctx, node: Node) -> None:
    from django.conf import settings

    await ctx.json(200, {"version": settings.ROUTER_VERSION})


async def handle_sd_models(ctx: Ctx, node: Node) -> None:
    entries = [
        {
            "title": cfg.image_id,
            "model_name": cfg.image_id,
            "filename": cfg.image_model.name if cfg.image_model else "",
            "config": cfg.filename,
            "hash": "",
            "sha256": "",
        }
        for cfg in node.catalog.image_models()
    ]
    await ctx.json(200, entries)


POST = frozenset({"POST"})
GET = frozenset({"GET", "HEAD"})

ROUTES: dict[str, tuple[frozenset[str], Handler, bool]] = {
    # path: (methods, handler, whether an inference key is required)
    "/ping": (GET, handle_ping, False),
    "/v1/models": (GET, handle_models, True),
    "/v1/chat/completions": (POST, handle_openai_text, True),
    "/v1/completions": (POST, handle_openai_text, True),
    "/v1/embeddings": (POST, handle_embeddings, True),
    "/v1/images/generations": (POST, handle_images, True),
    "/sdapi/v1/txt2img": (POST, handle_images, True),
    "/sdapi/v1/sd-models": (GET, handle_sd_models, True),
    "/v1/audio/transcriptions": (POST, handle_transcriptions, True),
    "/api/chat": (POST, handle_ollama, True),
    "/api/generate": (POST, handle_ollama, True),
    "/api/tags": (GET, handle_tags, True),
    "/api/ps": (GET, handle_ps, True),
    "/api/version": (GET, handle_ollama_version, True),
    "/api/v1/generate": (POST, handle_kobold, True),
}


# -- the ASGI application -------------------------------------------------------------------


class ProxyApp:
    """Claims the inference paths; hands every other request to `fallback` (Django)."""

    def __init__(self, fallback: Any, *, node_getter: Callable[[], Node] = get_node) -> None:
        self.fallback: ASGIApp = fallback
        self.node_getter = node_getter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        route = ROUTES.get(scope["path"])
        if route is None:
            await self.fallback(scope, receive, send)
            return
        methods, handler, needs_key = route
        ctx = Ctx(scope, receive, send, scope["path"], scope["method"])
        node = self.node_getter()
        try:
            if ctx.method not in methods:
                await self._method_not_allowed(ctx, methods)
                return
            if needs_key:
                self._authorize(ctx, node)
            if ctx.method == "POST":
                await self._read_body(ctx, node.config.server.max_body_bytes)
            await self._run(ctx, node, handler)
        except RouterError as err:
            if not ctx.started:
                await ctx.error(err)
            else:
                await self._abort_stream(ctx, err)
        except asyncio.CancelledError:
            if not ctx.disconnected:
                raise
        except Exception:
            logger.exception("unhandled error on %s", ctx.path)
            internal = RouterError(500, "internal router error", type="server_error")
            if not ctx.started:
                await ctx.error(internal)
            else:
                await self._abort_stream(ctx, internal)

    async def _run(self, ctx: Ctx, node: Node, handler: Handler) -> None:
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(self._watch_disconnect(ctx, task))
        try:
            await handler(ctx, node)
        finally:
            watcher.cancel()

    @staticmethod
    async def _watch_disconnect(ctx: Ctx, task: asyncio.Task[Any]) -> None:
        while True:
            message = await ctx.receive()
            if message["type"] == "http.disconnect":
                if not ctx.finished:
                    ctx.disconnected = True
                    task.cancel()
                return

    @staticmethod
    async def _abort_stream(ctx: Ctx, err: RouterError) -> None:
        # Headers are out, so the status cannot change: say what went wrong in the stream's own
        # format and close it, so the client sees an error rather than a silent truncation.
        if ctx.finished:
            return
        if is_ollama_path(ctx.path):
            await ctx.end(orjson.dumps({"error": err.message}) + b"\n")
        else:
            await ctx.end(b"data: " + orjson.dumps(err.envelope()) + b"\n\n")

    @staticmethod
    async def _method_not_allowed(ctx: Ctx, methods: frozenset[str]) -> None:
        allow = ", ".join(sorted(methods)).encode()
        err = RouterError(405, f"method {ctx.method} is not allowed on {ctx.path}")
        await ctx.start(405, [(b"content-type", JSON), (b"allow", allow)])
        await ctx.end(error_body(ctx.path, err))

    @staticmethod
    def _authorize(ctx: Ctx, node: Node) -> None:
        keys = node.config.auth.inference_keys
        if not keys:
            return
        header = ctx.header(b"authorization") or b""
        token = header[7:].strip() if header.startswith(b"Bearer ") else b""
        # Every key is compared, match or not, so timing says nothing about which one is close.
        ok = False
        for key in keys:
            ok |= hmac.compare_digest(token, key.encode())
        if not ok:
            raise RouterError(401, "a valid inference key is required", type="unauthorized")

    @staticmethod
    async def _read_body(ctx: Ctx, limit: int) -> None:
        length = ctx.header(b"content-length")
        too_big = RouterError(
            413, f"request body is larger than the limit of {limit} bytes", code="body_too_large"
        )
        if length is not None and length.isdigit() and int(length) > limit:
            raise too_big
        parts: list[bytes] = []
        size = 0
        while True:
            message = await ctx.receive()
            if message["type"] == "http.disconnect":
                ctx.disconnected = True
                raise asyncio.CancelledError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_big
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        ctx.body = parts[0] if len(parts) == 1 else b"".join(parts)
