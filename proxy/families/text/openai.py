"""The OpenAI text paths: chat, completions, embeddings and the model list."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import orjson

from guardians.detect import body_has_image
from proxy import work
from proxy.families.text.dispatch import dispatch, prefix_of
from proxy.forwarding.local import shape_openai
from proxy.node import Node
from proxy.request import Ctx, parse_json_body, require_model
from proxy.serving.core import serve_named, serve_on
from registry.cluster import Replica
from registry.routing import not_found, require_view, resolve
from routerproject.errors import RouterError


async def handle_openai_text(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    model = ctx.model = require_model(doc)
    prefix, ctx.prefix_match = prefix_of(node, doc)
    replica = resolve(
        node, model, "llm", borrowed=ctx.borrowed, prefix=prefix, match=ctx.prefix_match
    )
    has_image = body_has_image(doc)

    def run(target: Replica, restore: bool) -> Awaitable[None]:
        return serve_on(
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

    await dispatch(ctx, node, model, replica, has_image, run)


async def handle_embeddings(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    body = ctx.body
    if doc.get("model") in (None, ""):
        model = default_embeddings(node)
        doc["model"] = model
        body = orjson.dumps(doc)
    else:
        model = ctx.model = require_model(doc)
    await serve_named(ctx, node, model, kind="embeddings", body=body, shape=shape_openai)


def default_embeddings(node: Node) -> str:
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


def _listed(node: Node, ctx: Ctx) -> list[tuple[str, dict[str, Any]]]:
    """The text models a model list shows: those the request's key may use."""
    out = []
    for public_id, replicas in sorted(node.cluster.by_public_id.items()):
        rec = replicas[0].record
        if (
            (rec.get("has_llm") or rec.get("has_embeddings"))
            and not rec.get("disabled")
            and ctx.may_use(public_id)
        ):
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
    data = [_openai_model(pid, rec) for pid, rec in _listed(node, ctx)]
    await ctx.json(200, {"object": "list", "data": data})


MODEL_PATH_PREFIX = "/v1/models/"


async def handle_model(ctx: Ctx, node: Node) -> None:
    """`GET /v1/models/{id}` (the OpenAI SDK's `models.retrieve`): one entry of the list."""
    wanted = ctx.model = ctx.path[len(MODEL_PATH_PREFIX) :]
    for public_id, rec in _listed(node, ctx):
        if public_id == wanted:
            await ctx.json(200, _openai_model(public_id, rec))
            return
    raise not_found(wanted, [public_id for public_id, _ in _listed(node, ctx)])
