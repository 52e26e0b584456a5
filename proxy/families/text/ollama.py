"""The Ollama paths: chat and generate translated to OpenAI and back, embeddings, the model
list, `show`, `ps` and the version, and Ollama's own answer to an unknown `/api/` path."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable
from typing import Any

import aiohttp
import orjson
from django.conf import settings

from guardians.detect import body_has_image
from proxy import work
from proxy.families.text import replies, translate
from proxy.families.text.dispatch import dispatch, prefix_of
from proxy.families.text.openai import _listed
from proxy.forwarding.local import Job, Shaper, content_type_of, shape_openai
from proxy.forwarding.rewrite import UsageTracker
from proxy.node import Node
from proxy.request import NDJSON, SSE, Ctx, parse_json_body, require_model
from proxy.serving.core import failover, serve_on
from registry import services as registry_services
from registry.cluster import Replica
from registry.routing import require_view, resolve
from routerproject.errors import RouterError, echo

logger = logging.getLogger(__name__)


async def handle_ollama(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = ctx.model = require_model(doc)
    # Ollama's messages and prompt have OpenAI's shape: the same fingerprints apply.
    prefix, ctx.prefix_match = prefix_of(node, doc)
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
            return serve_on(
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
        return serve_on(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            path=path,
            body=orjson.dumps({**body_doc, "model": target.local_id}),
            shape=ollama_shaper(kind),
            stream=stream,
            max_tokens=work.requested_output_tokens(body_doc),
            has_image=has_image,
            guardian_restore=restore,
        )

    try:
        await dispatch(ctx, node, model, replica, has_image, run)
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
    record: dict[str, Any] = {"model": ctx.model, "created_at": replies.rfc3339_utc(now_ns)}
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
            return serve_on(
                ctx,
                node,
                target,
                kind="embeddings",
                public_id=model,
                path=ctx.path,
                body=ctx.body,
                shape=shape_openai,
            )
        return serve_on(
            ctx,
            node,
            target,
            kind="embeddings",
            public_id=model,
            path="/v1/embeddings",
            body=orjson.dumps({**body_doc, "model": target.local_id}),
            shape=ollama_embed_shaper(legacy),
        )

    await failover(ctx, node, model, "embeddings", replica, serve)


async def handle_ollama_show(ctx: Ctx, node: Node) -> None:
    """Answered from the cluster's records: clients read the context size and capabilities."""
    doc = parse_json_body(ctx)
    model = doc.get("model") or doc.get("name")
    if not isinstance(model, str) or not model:
        raise RouterError(400, "model is required", param="model")
    ctx.model = model
    replicas = [
        r
        for r in node.cluster.by_public_id.get(model, [])
        if (r.record.get("has_llm") or r.record.get("has_embeddings"))
        and not r.record.get("disabled")
    ]
    if not replicas:
        require_view(node)
        missing = RouterError(404, f"model '{echo(model)}' not found", code="model_not_found")
        missing.models = tuple(pid for pid, _ in _listed(node, ctx))
        raise missing
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
    await ctx.json(200, {"models": [_ollama_entry(pid, rec) for pid, rec in _listed(node, ctx)]})


async def handle_ps(ctx: Ctx, node: Node) -> None:
    require_view(node)
    models = []
    for pid, replicas in sorted(node.cluster.by_public_id.items()):
        if not ctx.may_use(pid):
            continue
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


def ollama_shaper(kind: str) -> Shaper:
    async def shape(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
        ctype = content_type_of(resp)
        if resp.status >= 300:
            data = await resp.read()
            await ctx.respond(resp.status, replies.openai_error_to_ollama(data))
            return
        if ctype.startswith(SSE):
            streamer = replies.OllamaStreamTranslator(
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
            replies.openai_to_ollama_chat if kind == "chat" else replies.openai_to_ollama_generate
        )
        out = convert(
            doc, model=job.public_id, started_ns=int(ctx.wall0 * 1e9), now_ns=time.time_ns()
        )
        await ctx.json(200, out)

    return shape


def ollama_embed_shaper(legacy: bool) -> Shaper:
    async def shape(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
        data = await resp.read()
        if resp.status >= 300:
            await ctx.respond(resp.status, replies.openai_error_to_ollama(data))
            return
        try:
            doc = orjson.loads(data)
            out = replies.openai_to_ollama_embed(
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
