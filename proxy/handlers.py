"""Client API handlers: OpenAI, Ollama and Kobold paths, and the route table.

Each handler parses what it needs, picks the replica (registry/routing.py), and either forwards to
a local runtime (`forward`) or to the node that holds the model (`forward_remote`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from django.conf import settings

from guardians import routing as guardians
from guardians.detect import body_has_image
from guardians.routing import ImageRefused
from proxy import observe, stt, translate, work
from proxy.forwarding import (
    Ctx,
    Job,
    NotSent,
    Shaper,
    _ollama_embed_shaper,
    _ollama_shaper,
    forward,
    forward_remote,
    parse_json_body,
    require_model,
    shape_kobold,
    shape_openai,
)
from proxy.node import Node
from registry import affinity
from registry import services as registry_services
from registry.bodies import set_body_model, set_image_body_model
from registry.cluster import Replica
from registry.routing import Kind, candidates, choose, lane_of, not_found, require_view, resolve
from routerproject.errors import RouterError, echo, is_ollama_path

Handler = Callable[[Ctx, Node], Awaitable[None]]
# (methods, handler, whether an inference key is required)
Route = tuple[frozenset[str], Handler, bool]
logger = logging.getLogger(__name__)


RunOn = Callable[[Replica, bool], Awaitable[None]]
Serve = Callable[[Replica], Awaitable[None]]

MODEL_HEADER = b"x-tensors-model"


def _dispatch(
    ctx: Ctx, node: Node, public_id: str, replica: Replica, has_image: bool, run: RunOn
) -> Awaitable[None]:
    """What serves a text request: its guardian check when it carries an image, else `run`."""

    def attempt(target: Replica, restore: bool) -> Awaitable[None]:
        return _failover(ctx, node, public_id, "llm", target, lambda t: run(t, restore))

    if has_image and not ctx.borrowed:
        return _guarded(ctx, node, public_id, replica, attempt)
    # A plain function, not a coroutine: the common case costs no extra frame, and memory per
    # held request counts.
    return attempt(replica, ctx.guardian_restore)


async def _failover(
    ctx: Ctx, node: Node, public_id: str, kind: Kind, first: Replica, serve: Serve
) -> None:
    """Serve on `first`; if the request never reached it, once more on another replica.

    Only a request whose connection was refused, or reset before it was fully sent, comes
    back here (NotSent): it cannot have run, so running it elsewhere answers it exactly once.
    A remote node that refused is suspect at once (skipped until a poll of it succeeds); a
    local backend that refused is reloaded, and the retry may land on it again.
    """
    try:
        await serve(first)
        return
    except NotSent as exc:
        failed = exc
    if not first.is_local:
        node.cluster.mark_suspect(first.node_url, f"connection failed: {failed.message}")
    second = _second_replica(ctx, node, public_id, kind, first)
    if second is None:
        raise failed
    logger.info(
        "%s: %s on %s was not reached (%s); retrying once on %s",
        ctx.path,
        public_id,
        first.node_id,
        failed.message,
        second.node_id,
    )
    try:
        await serve(second)
    except NotSent as exc:
        if not second.is_local:
            node.cluster.mark_suspect(second.node_url, f"connection failed: {exc.message}")
        raise


def _second_replica(
    ctx: Ctx, node: Node, public_id: str, kind: Kind, first: Replica
) -> Replica | None:
    found = candidates(node, public_id, kind)
    if not any(r.node_id == first.node_id and r.local_id == first.local_id for r in found):
        return None  # a guardian's or a recipe's replica: no other replica stands in for it
    if ctx.borrowed:
        found = [r for r in found if r.is_local]
    others = [r for r in found if r.is_local or r.node_id != first.node_id]
    if not others:
        return None
    try:
        return choose(node, public_id, kind, others)
    except RouterError:
        return None


async def _guarded(ctx: Ctx, node: Node, public_id: str, replica: Replica, run: RunOn) -> None:
    """Run an image request on `replica`, or on the model's guardian when it cannot read images.

    `run(target, restore)` serves the request on `target`; `restore` asks the target's node to
    load its text-only model back afterwards. Lent work never comes here: its owner already
    sent it only to a helper with vision.
    """
    route = guardians.before_dispatch(node, public_id, replica, True)
    try:
        if route is None:
            try:
                await run(replica, ctx.guardian_restore)
                return
            except ImageRefused as refusal:
                # Raised only while a guardian is set, and before any byte reached the client.
                route = guardians.guardian_route(node, public_id, replica)
                if route is None:  # the guardian was cleared meanwhile: the refusal answers
                    raise
                logger.info(
                    "%s refused an image (HTTP %d); its guardian %s on %s answers instead",
                    public_id,
                    refusal.status,
                    route.guardian_id,
                    route.replica.node_id,
                )
        else:
            logger.info(
                "image request for %s (no vision) goes to its guardian %s on %s",
                public_id,
                route.guardian_id,
                route.replica.node_id,
            )
        await run(route.replica, route.restore)
    except ImageRefused as refusal:
        # The guardian itself refused, or the refusal stands: it is the answer, in the shape
        # of the path the client used.
        body = refusal.body
        ctype = refusal.content_type
        if is_ollama_path(ctx.path):
            body, ctype = translate.openai_error_to_ollama(body), b"application/json"
        await ctx.respond(refusal.status, body, ctype)


def _with_model(body: bytes, public_id: str, served_id: str) -> bytes:
    return body if public_id == served_id else set_body_model(body, served_id)


async def _serve(
    ctx: Ctx,
    node: Node,
    replica: Replica,
    *,
    kind: Kind,
    public_id: str,
    path: str,
    body: bytes,
    shape: Shaper,
    stream: bool = False,
    content_type: bytes = b"application/json",
    image: work.ImageWork | None = None,
    max_tokens: int | None = None,
    has_image: bool = False,
    guardian_restore: bool = False,
    query: str = "",
    lendable: bool = True,
) -> None:
    """Run the request where `replica` lives: this node's runtime, or its own node.

    The client's method goes along (an image job's status poll is a GET), and `query` to a
    local backend; a request sent to another node always carries the client's own query.
    """
    lane = lane_of(kind)
    ctx.model = public_id
    served_id = replica.local_id
    if kind == "image":
        served_id = str(replica.record.get("image_id") or replica.local_id)
    model_header: str | None = None
    if kind == "image":
        header = ctx.header(MODEL_HEADER)
        if header is not None:
            given = header.decode("latin-1")
            model_header = served_id if given.strip() == public_id else given
        if content_type.startswith(b"application/json"):
            body = set_image_body_model(body, public_id, served_id)
    elif content_type.startswith(b"application/json"):
        body = _with_model(body, public_id, served_id)
    # Only a request that could still go elsewhere watches for the backend refusing its image:
    # a guardian must be set, and this must not already be that guardian.
    fallback = (
        has_image
        and not ctx.borrowed
        and replica.public_id == public_id  # not already running as some model's guardian
        and node.guardians.for_model(public_id, replica.node_id) is not None
    )
    if replica.cfg is None:
        # Another node serves it; it translates Ollama/Kobold itself, so the client's own path
        # and shape go over the wire unchanged apart from the model ID.
        await forward_remote(
            ctx,
            node,
            replica,
            lane=lane,
            path=ctx.path,
            body=body,
            public_id=public_id,
            served_id=served_id,
            content_type=content_type,
            guardian_fallback=fallback,
            guardian_restore=guardian_restore,
            model_header=model_header,
        )
        return
    job = Job(
        cfg=replica.cfg,
        lane=lane,
        model_id=served_id,
        public_id=public_id,
        backend_path=path,
        body=body,
        content_type=content_type,
        stream=stream,
        prompt_bytes=len(body),
        image=image,
        max_tokens=max_tokens,
        has_image=has_image,
        guardian_fallback=fallback,
        guardian_restore=guardian_restore,
        model_header=model_header,
        method=ctx.method,
        query=query,
        lendable=lendable,
        cached_prompt_bytes=(
            ctx.prefix_match.bytes_on(replica.node_id, replica.local_id)
            if ctx.prefix_match is not None
            else 0
        ),
    )
    await forward(ctx, node, job, shape)


async def serve_named(
    ctx: Ctx,
    node: Node,
    model: str,
    *,
    kind: Kind,
    body: bytes,
    shape: Shaper,
    lendable: bool = True,
) -> None:
    """Serve a request that names `model` on the client's path: the usual replica choice,
    and once more on another replica when it never reached the first."""
    replica = resolve(node, model, kind, borrowed=ctx.borrowed)

    def serve(target: Replica) -> Awaitable[None]:
        return _serve(
            ctx,
            node,
            target,
            kind=kind,
            public_id=model,
            path=ctx.path,
            body=body,
            shape=shape,
            lendable=lendable,
        )

    await _failover(ctx, node, model, kind, replica, serve)


def _prefix_of(
    node: Node, doc: dict[str, Any]
) -> tuple[list[affinity.Fingerprint], affinity.PrefixMatch | None]:
    """A text body's prefix fingerprints, and the match the replica choice fills; neither is
    made with cache affinity off, so the hot path pays nothing for it."""
    if not node.cache_affinity:
        return [], None
    return affinity.fingerprints(doc), affinity.PrefixMatch()


async def handle_ping(ctx: Ctx, node: Node) -> None:
    await ctx.json(200, {"status": "healthy"})


async def handle_openai_text(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = ctx.model = require_model(doc)
    prefix, ctx.prefix_match = _prefix_of(node, doc)
    replica = resolve(
        node, model, "llm", borrowed=ctx.borrowed, prefix=prefix, match=ctx.prefix_match
    )
    has_image = body_has_image(doc)

    def run(target: Replica, restore: bool) -> Awaitable[None]:
        return _serve(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            path=ctx.path,
            body=ctx.body,
            shape=shape_openai,
            stream=doc.get("stream") is True,
            max_tokens=work.requested_output_tokens(doc),
            has_image=has_image,
            guardian_restore=restore,
        )

    await _dispatch(ctx, node, model, replica, has_image, run)


async def handle_embeddings(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    body = ctx.body
    if doc.get("model") in (None, ""):
        model = _default_embeddings(node)
        doc["model"] = model
        body = orjson.dumps(doc)
    else:
        model = ctx.model = require_model(doc)
    await serve_named(ctx, node, model, kind="embeddings", body=body, shape=shape_openai)


def _default_embeddings(node: Node) -> str:
    # Selector-less embeddings rotate over models whose embeddings are loaded, so the request
    # never triggers a switch the client did not ask for; with one candidate, that one.
    loaded: list[str] = []
    every: list[str] = []
    for public_id, replicas in sorted(node.cluster.by_public_id.items()):
        usable = [
            r
            for r in replicas
            if r.record.get("has_embeddings") and r.available and not r.record.get("disabled")
        ]
        if not usable:
            continue
        every.append(public_id)
        if any(
            (r.cfg is not None and node.runtimes.is_loaded(r.cfg))
            or (r.cfg is None and (r.record.get("embeddings_loaded") or r.record.get("loaded")))
            for r in usable
        ):
            loaded.append(public_id)
    pool = loaded or (every if len(every) == 1 else [])
    if not pool:
        raise RouterError(400, "model is required", param="model")
    return pool[node.cluster.next_rr("embeddings:") % len(pool)]


async def handle_images(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = doc.get("model")
    if model in (None, "") and ctx.header(MODEL_HEADER):
        # The reference's last selector: sd-server clients may name the model in a header.
        model = (ctx.header(MODEL_HEADER) or b"").decode("latin-1").strip()
    if model in (None, "") and ctx.path.startswith("/sdapi/"):
        override = doc.get("override_settings")
        if isinstance(override, dict):
            model = override.get("sd_model_checkpoint")
        model = model or doc.get("sd_model_checkpoint")
        if not model:
            images = _enabled_image_ids(node)
            if len(images) == 1:
                model = images[0]
    if not isinstance(model, str) or not model:
        raise RouterError(400, "model is required", param="model")
    try:
        image = work.image_work(doc)
    except ValueError as exc:
        raise RouterError(400, str(exc), param=getattr(exc, "param", None)) from exc
    replica = resolve(node, model, "image", borrowed=ctx.borrowed)

    def serve(target: Replica) -> Awaitable[None]:
        return _serve(
            ctx,
            node,
            target,
            kind="image",
            public_id=model,
            path=ctx.path,
            body=ctx.body,
            shape=shape_openai,
            image=image,
        )

    await _failover(ctx, node, model, "image", replica, serve)


async def handle_transcriptions(ctx: Ctx, node: Node) -> None:
    ctype = ctx.header(b"content-type") or b"application/octet-stream"
    if not ctx.body:
        raise RouterError(400, "an audio file is required", param="file")
    audio = work.multipart_field(ctx.body, ctype.decode("latin-1"), "file")
    if not audio:
        raise RouterError(400, "an audio file is required", param="file")
    try:
        # Speech-to-text takes WAV only: refuse anything else here rather than load a
        # whisper model for a request it must refuse anyway.
        work.wav_duration_seconds(audio)
    except ValueError as exc:
        raise RouterError(400, "file must be a WAV (RIFF/WAVE) audio file", param="file") from exc
    model_field = work.multipart_field(ctx.body, ctype.decode("latin-1"), "model")
    model = model_field.decode("utf-8", "replace").strip() if model_field else ""
    if model:
        replica = resolve(node, model, "voice", borrowed=ctx.borrowed)

        def serve(target: Replica) -> Awaitable[None]:
            body = ctx.body
            if target.local_id != model:
                body = stt.replace_multipart_model(ctx.body, model, target.local_id)
            return _serve(
                ctx,
                node,
                target,
                kind="voice",
                public_id=model,
                path=ctx.path,
                body=body,
                shape=shape_openai,
                content_type=ctype,
            )

        await _failover(ctx, node, model, "voice", replica, serve)
        return
    async with stt.reserve(node) as replica:
        await _serve(
            ctx,
            node,
            replica,
            kind="voice",
            public_id=replica.public_id,
            path=ctx.path,
            body=ctx.body,
            shape=shape_openai,
            content_type=ctype,
        )


async def handle_ollama(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = ctx.model = require_model(doc)
    # Ollama's messages and prompt have OpenAI's shape: the same fingerprints apply.
    prefix, ctx.prefix_match = _prefix_of(node, doc)
    replica = resolve(
        node, model, "llm", borrowed=ctx.borrowed, prefix=prefix, match=ctx.prefix_match
    )
    kind = "chat" if ctx.path == "/api/chat" else "generate"
    try:
        if kind == "chat":
            path, body_doc, stream = translate.ollama_chat_request(doc)
        else:
            path, body_doc, stream = translate.ollama_generate_request(doc)
        keep_alive = translate.keep_alive_seconds(doc)
    except translate.TranslationError as exc:
        raise RouterError(400, str(exc), param=exc.param) from exc
    has_image = body_has_image(body_doc)
    if translate.is_load_request(kind, doc) and replica.cfg is not None:
        await _ollama_load(ctx, node, replica, kind, unload=keep_alive == 0)
        return

    def run(target: Replica, restore: bool) -> Awaitable[None]:
        if target.cfg is None:
            # The holder translates Ollama itself: the client's body goes as it came.
            return _serve(
                ctx,
                node,
                target,
                kind="llm",
                public_id=model,
                path=ctx.path,
                body=ctx.body,
                shape=shape_openai,
                has_image=has_image,
                guardian_restore=restore,
            )
        return _serve(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            path=path,
            body=orjson.dumps({**body_doc, "model": target.local_id}),
            shape=_ollama_shaper(kind),
            stream=stream,
            max_tokens=work.requested_output_tokens(body_doc),
            has_image=has_image,
            guardian_restore=restore,
        )

    try:
        await _dispatch(ctx, node, model, replica, has_image, run)
    finally:
        if keep_alive == 0 and replica.cfg is not None:
            # As Ollama: `keep_alive: 0` unloads the model once the answer is out. The unload
            # waits for requests still running on it, so it runs apart from this request.
            _unload_later(node, replica.local_id)


_background: set[asyncio.Task[Any]] = set()
"""Unloads asked by `keep_alive: 0`, kept referenced until they finish."""


def _unload_later(node: Node, local_id: str) -> None:
    task = asyncio.ensure_future(_unload(node, local_id))
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _unload(node: Node, local_id: str) -> None:
    try:
        await registry_services.model_unload_local(node=node, model_id=local_id, target=None)
    except Exception:
        logger.exception("unloading %s after keep_alive 0 failed", local_id)


async def _ollama_load(ctx: Ctx, node: Node, replica: Replica, kind: str, *, unload: bool) -> None:
    """Ollama's load request (no messages, no prompt): load the model, or unload it with
    `keep_alive: 0`, and answer with an empty `done` record saying which."""
    if unload:
        await registry_services.model_unload_local(
            node=node, model_id=replica.local_id, target=None
        )
    else:
        await registry_services.model_load_local(node=node, model_id=replica.local_id)
    now_ns = time.time_ns()
    record: dict[str, Any] = {"model": ctx.model, "created_at": translate.rfc3339_utc(now_ns)}
    if kind == "chat":
        record["message"] = {"role": "assistant", "content": ""}
    else:
        record["response"] = ""
    record["done"] = True
    record["done_reason"] = "unload" if unload else "load"
    await ctx.json(200, record)


async def handle_ollama_embed(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = ctx.model = require_model(doc)
    legacy = ctx.path == "/api/embeddings"
    try:
        body_doc = translate.ollama_embed_request(doc, legacy=legacy)
    except translate.TranslationError as exc:
        raise RouterError(400, str(exc), param=exc.param) from exc
    replica = resolve(node, model, "embeddings", borrowed=ctx.borrowed)

    def serve(target: Replica) -> Awaitable[None]:
        if target.cfg is None:
            # The holder translates Ollama itself: the client's body goes as it came.
            return _serve(
                ctx,
                node,
                target,
                kind="embeddings",
                public_id=model,
                path=ctx.path,
                body=ctx.body,
                shape=shape_openai,
            )
        return _serve(
            ctx,
            node,
            target,
            kind="embeddings",
            public_id=model,
            path="/v1/embeddings",
            body=orjson.dumps({**body_doc, "model": target.local_id}),
            shape=_ollama_embed_shaper(legacy),
        )

    await _failover(ctx, node, model, "embeddings", replica, serve)


async def handle_ollama_show(ctx: Ctx, node: Node) -> None:
    """Answered from the cluster's records: clients read the context size and capabilities."""
    doc = parse_json_body(ctx)
    model = doc.get("model") or doc.get("name")
    if not isinstance(model, str) or not model:
        raise RouterError(400, "model is required", param="model")
    replicas = [
        r
        for r in node.cluster.by_public_id.get(model, [])
        if (r.record.get("has_llm") or r.record.get("has_embeddings"))
        and not r.record.get("disabled")
    ]
    if not replicas:
        require_view(node)
        raise RouterError(404, f"model '{echo(model)}' not found", code="model_not_found")
    rec = dict(replicas[0].record)
    family = str(rec.get("backend_mode") or "llama")
    capabilities = []
    if rec.get("has_llm"):
        # Tool calls go through the chat template of any OpenAI-compatible backend.
        capabilities += ["completion", "tools"]
    if rec.get("has_multimodal"):
        capabilities.append("vision")
    if rec.get("has_embeddings"):
        capabilities.append("embedding")
    model_info: dict[str, Any] = {"general.architecture": family}
    context = rec.get("context_size")
    if isinstance(context, int) and context > 0:
        model_info[f"{family}.context_length"] = context
    entry = _ollama_entry(model, rec)
    await ctx.json(
        200,
        {
            "modelfile": f"FROM {model}\n",
            "parameters": "",
            "template": "",
            "details": {
                **entry["details"],
                "parent_model": "",
                "families": [family],
                "parameter_size": "",
                "quantization_level": "",
            },
            "model_info": model_info,
            "capabilities": capabilities,
            "modified_at": entry["modified_at"],
        },
    )


async def handle_kobold(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = doc.get("model")
    if model in (None, ""):
        model = _loaded_text_model(node)
    if not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    prefix, ctx.prefix_match = _prefix_of(node, doc)
    replica = resolve(
        node, model, "llm", borrowed=ctx.borrowed, prefix=prefix, match=ctx.prefix_match
    )
    if replica.cfg is not None:
        _kobold_translated(doc)  # a request it cannot translate is refused before anything runs

    def serve(target: Replica) -> Awaitable[None]:
        if target.cfg is None:
            return _serve(
                ctx,
                node,
                target,
                kind="llm",
                public_id=model,
                path=ctx.path,
                body=orjson.dumps({**doc, "model": model}),
                shape=shape_openai,
            )
        path, body_doc = _kobold_translated(doc)
        body_doc["model"] = target.local_id
        return _serve(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            path=path,
            body=orjson.dumps(body_doc),
            shape=shape_kobold,
        )

    await _failover(ctx, node, model, "llm", replica, serve)


# KoboldCpp's own default generation length, for clients that send no max_length.
KOBOLD_DEFAULT_MAX_LENGTH = 100


def _kobold_translated(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    try:
        path, body_doc, _ = translate.kobold_generate_request(doc)
    except translate.TranslationError as exc:
        raise RouterError(400, str(exc), param=exc.param) from exc
    body_doc.setdefault("max_tokens", KOBOLD_DEFAULT_MAX_LENGTH)
    return path, body_doc


def _enabled_image_ids(node: Node) -> list[str]:
    return sorted(
        pid
        for pid, replicas in node.cluster.by_public_image_id.items()
        if any(not r.record.get("disabled") for r in replicas)
    )


def _loaded_text_model(node: Node) -> str:
    # Kobold clients rarely name a model: KoboldCpp serves whatever it has loaded.
    text = node.runtimes.runtimes["text"].current
    if text is not None and text.has_llm and text.local_id not in node.disabled:
        return text.local_id
    llms = [
        pid
        for pid, reps in node.cluster.by_public_id.items()
        if any(r.record.get("has_llm") and not r.record.get("disabled") for r in reps)
    ]
    if len(llms) == 1:
        return llms[0]
    raise RouterError(400, "model is required", param="model")


def _listed(node: Node) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for public_id, replicas in sorted(node.cluster.by_public_id.items()):
        rec = replicas[0].record
        if (rec.get("has_llm") or rec.get("has_embeddings")) and not rec.get("disabled"):
            out.append((public_id, dict(rec)))
    return out


def _openai_model(public_id: str, rec: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": public_id,
        "object": "model",
        "created": rec.get("created", 0),
        "owned_by": "router",
    }


async def handle_models(ctx: Ctx, node: Node) -> None:
    require_view(node)
    data = [_openai_model(pid, rec) for pid, rec in _listed(node)]
    await ctx.json(200, {"object": "list", "data": data})


MODEL_PATH_PREFIX = "/v1/models/"


async def handle_model(ctx: Ctx, node: Node) -> None:
    """`GET /v1/models/{id}` (the OpenAI SDK's `models.retrieve`): one entry of the list."""
    wanted = ctx.path[len(MODEL_PATH_PREFIX) :]
    for public_id, rec in _listed(node):
        if public_id == wanted:
            await ctx.json(200, _openai_model(public_id, rec))
            return
    raise not_found(wanted)


# What KoboldCpp says of itself; clients (KoboldAI Lite, SillyTavern) read the name and the
# version to tell KoboldCpp from other servers and to know which of its APIs exist.
KOBOLD_NAME = "KoboldCpp"
KOBOLD_API_VERSION = "1.98"


async def handle_kobold_model(ctx: Ctx, node: Node) -> None:
    """`GET /api/v1/model`: the model a Kobold client's generate would run."""
    try:
        model = _loaded_text_model(node)
    except RouterError:
        # No single text model to name: KoboldCpp says so with its read-only marker, and the
        # client then names a model itself (or asks the user to).
        await ctx.json(200, {"result": "ReadOnly"})
        return
    await ctx.json(200, {"result": f"koboldcpp/{model}"})


async def handle_kobold_version(ctx: Ctx, node: Node) -> None:
    """`GET /api/extra/version`: the name, version and features a Kobold client checks."""
    records = [
        r.record
        for replicas in node.cluster.by_public_id.values()
        for r in replicas
        if not r.record.get("disabled")
    ]

    def any_has(key: str) -> bool:
        return any(bool(rec.get(key)) for rec in records)

    await ctx.json(
        200,
        {
            "result": KOBOLD_NAME,
            "version": KOBOLD_API_VERSION,
            "protected": bool(node.config.auth.inference_keys),
            "txt2img": bool(_enabled_image_ids(node)),
            "vision": any_has("has_multimodal"),
            "transcribe": any_has("has_voice"),
            "embeddings": any_has("has_embeddings"),
            "multiplayer": False,
            "websearch": False,
            "tts": any_has("has_tts"),
        },
    )


async def handle_unknown_ollama(ctx: Ctx, node: Node) -> None:
    # Ollama clients read `{"error": …}`; the OpenAI envelope would reach them as gibberish.
    raise RouterError(404, f"endpoint not found: {ctx.method} {ctx.path}", type="not_found")


def _ollama_entry(public_id: str, rec: dict[str, Any]) -> dict[str, Any]:
    model_hash = str(rec.get("model_hash", ""))
    if len(model_hash) == 64:
        digest = f"sha256:{model_hash}"
    else:
        digest = hashlib.sha256(f"{public_id}:{model_hash}".encode()).hexdigest()
    modified = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(rec.get("created", 0))))
    return {
        "name": public_id,
        "model": public_id,
        "modified_at": modified,
        "size": rec.get("size", 0),
        "digest": digest,
        "details": {"format": "gguf", "family": rec.get("backend_mode", "")},
    }


async def handle_tags(ctx: Ctx, node: Node) -> None:
    require_view(node)
    await ctx.json(200, {"models": [_ollama_entry(pid, rec) for pid, rec in _listed(node)]})


async def handle_ps(ctx: Ctx, node: Node) -> None:
    require_view(node)
    models = []
    for pid, replicas in sorted(node.cluster.by_public_id.items()):
        for r in replicas:
            loaded = (
                node.runtimes.is_loaded(r.cfg)
                if r.cfg is not None
                else bool(r.record.get("loaded"))
            )
            if (
                loaded
                and r.available
                and not r.record.get("disabled")
                and (r.record.get("has_llm") or r.record.get("has_embeddings"))
            ):
                entry = _ollama_entry(pid, dict(r.record))
                entry["expires_at"] = "0001-01-01T00:00:00Z"
                entry["size_vram"] = 0
                models.append(entry)
                break
    await ctx.json(200, {"models": models})


async def handle_ollama_version(ctx: Ctx, node: Node) -> None:
    await ctx.json(200, {"version": settings.ROUTER_VERSION})


async def handle_sd_models(ctx: Ctx, node: Node) -> None:
    require_view(node)
    entries = [
        {
            "title": pid,
            "model_name": pid,
            "filename": str(
                replicas[0].record.get("capabilities", {}).get("image", {}).get("model", "")
            ),
            "config": replicas[0].record.get("filename", ""),
            "hash": "",
            "sha256": "",
        }
        for pid, replicas in sorted(node.cluster.by_public_image_id.items())
        if any(not r.record.get("disabled") for r in replicas)
    ]
    await ctx.json(200, entries)


POST = frozenset({"POST"})
GET = frozenset({"GET", "HEAD"})

ROUTES: dict[str, Route] = {
    # The core paths; `proxy.routes` joins them with the other families' tables.
    "/ping": (GET, handle_ping, False),
    "/v1/models": (GET, handle_models, True),
    "/v1/models/{model}": (GET, handle_model, True),
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
    "/api/embed": (POST, handle_ollama_embed, True),
    "/api/embeddings": (POST, handle_ollama_embed, True),
    "/api/show": (POST, handle_ollama_show, True),
    "/api/v1/generate": (POST, handle_kobold, True),
    "/api/v1/model": (GET, handle_kobold_model, True),
    "/api/extra/version": (GET, handle_kobold_version, True),
    # Operations: orchestrators' probes need no key; /metrics checks the admin key itself.
    "/healthz": (GET, observe.handle_healthz, False),
    "/readyz": (GET, observe.handle_readyz, False),
    "/metrics": (GET, observe.handle_metrics, False),
}


ALL_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Kobold's own paths share Ollama's `/api/` prefix; an unknown one is not Ollama's.
KOBOLD_PREFIXES = ("/api/v1/", "/api/extra/")
UNKNOWN_OLLAMA: Route = (ALL_METHODS, handle_unknown_ollama, False)
