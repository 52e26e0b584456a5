"""The KoboldCpp paths: generate translated to OpenAI and back, and what KoboldCpp says of
itself and of its model."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import aiohttp
import orjson

from proxy.families.text import koboldgen, replies, translate
from proxy.families.text.dispatch import prefix_of
from proxy.forwarding.local import Job, content_type_of, shape_openai
from proxy.node import Node
from proxy.request import Ctx, parse_json_body
from proxy.serving.core import enabled_image_ids, failover, serve_on
from registry.cluster import Replica
from registry.routing import resolve
from routerproject.errors import RouterError

# Kobold's own paths share Ollama's `/api/` prefix; an unknown one is not Ollama's.
KOBOLD_PREFIXES = ("/api/v1/", "/api/extra/")


async def handle_kobold(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = doc.get("model")
    if model in (None, ""):
        model = loaded_text_model(node)
    if not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    ctx.model = model
    prefix, ctx.prefix_match = prefix_of(node, doc)
    replica = resolve(
        node, model, "llm", borrowed=ctx.borrowed, prefix=prefix, match=ctx.prefix_match
    )
    if replica.cfg is not None:
        kobold_translated(doc)  # a request it cannot translate is refused before anything runs
    genkey = koboldgen.genkey_of(doc)

    def serve(target: Replica) -> Awaitable[None]:
        if target.cfg is None:
            if genkey is not None:
                koboldgen.remember_remote(node, genkey, target, model)
            return serve_on(
                ctx,
                node,
                target,
                kind="llm",
                public_id=model,
                path=ctx.path,
                body=orjson.dumps({**doc, "model": model}),
                shape=shape_openai,
            )
        path, body_doc = kobold_translated(doc)
        body_doc["model"] = target.local_id
        if genkey is not None:
            return _serve_tracked(ctx, node, target, model, path, body_doc, genkey)
        return serve_on(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            path=path,
            body=orjson.dumps(body_doc),
            shape=shape_kobold,
        )

    await failover(ctx, node, model, "llm", replica, serve)


async def _serve_tracked(
    ctx: Ctx,
    node: Node,
    target: Replica,
    model: str,
    path: str,
    body_doc: dict[str, Any],
    genkey: str,
) -> None:
    """A generate with a genkey: streamed from the backend so a check sees its text so far and
    an abort can end it (see koboldgen); never lent, so both find it here."""
    generation = node.generations.start(genkey, ctx.key_name)
    try:
        await serve_on(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            path=path,
            body=orjson.dumps({**body_doc, "stream": True}),
            shape=koboldgen.tracked_shape(generation),
            stream=True,
            lendable=False,
        )
    finally:
        node.generations.end(genkey, generation)


# KoboldCpp's own default generation length, for clients that send no max_length.
KOBOLD_DEFAULT_MAX_LENGTH = 100


def kobold_translated(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    try:
        path, body_doc, _ = translate.kobold_generate_request(doc)
    except translate.TranslationError as exc:
        raise RouterError(400, str(exc), param=exc.param) from exc
    body_doc.setdefault("max_tokens", KOBOLD_DEFAULT_MAX_LENGTH)
    return path, body_doc


def loaded_text_model(node: Node) -> str:
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


# What KoboldCpp says of itself; clients (KoboldAI Lite, SillyTavern) read the name and the
# version to tell KoboldCpp from other servers and to know which of its APIs exist.
KOBOLD_NAME = "KoboldCpp"
KOBOLD_API_VERSION = "1.98"


async def handle_kobold_model(ctx: Ctx, node: Node) -> None:
    """`GET /api/v1/model`: the model a Kobold client's generate would run."""
    try:
        model: str | None = loaded_text_model(node)
    except RouterError:
        model = None
    if model is None or not ctx.may_use(model):
        # No single text model to name (or none this key may use): KoboldCpp says so with its
        # read-only marker, and the client then names a model itself (or asks the user to).
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
            "txt2img": bool(enabled_image_ids(node)),
            "vision": any_has("has_multimodal"),
            "transcribe": any_has("has_voice"),
            "embeddings": any_has("has_embeddings"),
            "multiplayer": False,
            "websearch": False,
            "tts": any_has("has_tts"),
        },
    )


async def shape_kobold(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
    data = await resp.read()
    if resp.status >= 300:
        await ctx.respond(resp.status, data, content_type_of(resp))
        return
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RouterError(502, "backend returned invalid json", type="backend_error") from exc
    job.usage = doc.get("usage") if isinstance(doc, dict) else None
    await ctx.json(200, replies.openai_to_kobold(doc))
