"""Kobold's generation follow-ups: `/api/extra/generate/check` (the text so far) and
`/api/extra/abort`, both naming the generation by the `genkey` its generate carried.

A generate with a genkey runs on this node's backend as a streamed completion whose text is
kept while it runs (`node.generations`), and is answered whole as Kobold answers, ended early
when the client aborts it. Run on another node, the genkey is remembered (`node.sticky`) so a
check or abort goes to the node that runs it. Such a generation is never lent: its follow-ups
must find it where it runs. `/api/extra/generate/stream` keeps its text the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson

from proxy.forwarding.generations import Generation
from proxy.forwarding.local import Job, Shaper, content_type_of
from proxy.forwarding.remote import forward_remote
from proxy.forwarding.rewrite import LineBuffer, UsageTracker, split_lines
from proxy.node import Node
from proxy.request import SSE, Ctx, parse_json_body
from proxy.serving.sticky import Holder
from registry.cluster import Replica
from routerproject.errors import RouterError

GENERATIONS = "kobold_generations"
"""The sticky family of genkeys whose generation runs on another node."""
_DATA = b"data:"
_DONE = b"[DONE]"


def genkey_of(doc: dict[str, Any]) -> str | None:
    """The request's `genkey`, None when it has none; anything but a string is refused."""
    genkey = doc.get("genkey")
    if genkey in (None, ""):
        return None
    if not isinstance(genkey, str):
        raise RouterError(400, "genkey must be a string", param="genkey")
    return genkey


def remember_remote(node: Node, genkey: str, target: Replica, public_id: str) -> None:
    node.sticky.remember(GENERATIONS, genkey, Holder(target.node_id, public_id, target.local_id))


class CompletionText:
    """The text and finish reason of an OpenAI completion stream, read as it arrives."""

    def __init__(self, generation: Generation) -> None:
        self._lines = LineBuffer()
        self._generation = generation
        self.finish: str | None = None

    def feed(self, data: bytes) -> None:
        for line in split_lines(self._lines.take(data)):
            self._line(line)

    def _line(self, line: bytes) -> None:
        payload = line[len(_DATA) :].strip() if line.startswith(_DATA) else b""
        if not payload or payload == _DONE:
            return
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        text = choices[0].get("text")
        if isinstance(text, str):
            self._generation.pieces.append(text)
        if isinstance(choices[0].get("finish_reason"), str):
            self.finish = choices[0]["finish_reason"]


async def read_until_stopped(
    resp: aiohttp.ClientResponse,
    stop: asyncio.Event | None,
    feed: Callable[[bytes], Awaitable[None]],
) -> bool:
    """Feed the answer's chunks until it ends or `stop` is set (leaving the rest unread: the
    connection closes and the backend frees its slot); whether `stop` ended it."""
    if stop is None:
        async for data in resp.content.iter_any():
            await feed(data)
        return False
    stopped = asyncio.ensure_future(stop.wait())
    read: asyncio.Future[bytes] | None = None
    try:
        while True:
            read = asyncio.ensure_future(resp.content.readany())
            await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                return True
            data = read.result()
            if not data:
                return False
            await feed(data)
    finally:
        for pending in (stopped, read):
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending


def tracked_shape(generation: Generation) -> Shaper:
    """Answer a streamed completion as Kobold's whole generate answer, keeping its text in
    `generation` as it comes; an abort ends it with the text so far."""

    async def shape(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
        ctype = content_type_of(resp)
        if resp.status >= 300 or not ctype.startswith(SSE):
            await ctx.respond(resp.status, await resp.read(), ctype)
            return
        text = CompletionText(generation)
        tracker = UsageTracker()

        async def feed(data: bytes) -> None:
            tracker.feed(data)
            text.feed(data)

        await read_until_stopped(resp, generation.stop, feed)
        job.usage = tracker.usage()
        # KoboldCpp says "stop" for a generation that ended early, aborted ones included.
        finish = "length" if text.finish == "length" else "stop"
        await ctx.json(200, {"results": [{"text": generation.text, "finish_reason": finish}]})

    return shape


# -- check and abort -------------------------------------------------------------------------


def _follow_up_genkey(ctx: Ctx) -> str | None:
    if ctx.method == "GET" or not ctx.body.strip():
        return None
    return genkey_of(parse_json_body(ctx))


async def _on_holder(ctx: Ctx, node: Node, genkey: str) -> bool:
    """Send the follow-up to the node that runs `genkey`'s generation; False when no other
    node does."""
    holder = node.sticky.lookup(GENERATIONS, genkey)
    if holder is None or holder.node_id == node.node_id:
        return False
    for replica in node.cluster.by_public_id.get(holder.public_id, []):
        if replica.node_id == holder.node_id and replica.local_id == holder.local_id:
            if not replica.available:
                break
            await forward_remote(
                ctx,
                node,
                replica,
                lane="text",
                path=ctx.path,
                body=ctx.body,
                public_id=holder.public_id,
                served_id=holder.local_id,
            )
            return True
    return False


async def handle_check(ctx: Ctx, node: Node) -> None:
    """`/api/extra/generate/check`: the text so far of the generation `genkey` names (empty
    when none of this key's runs under it, as KoboldCpp answers)."""
    genkey = _follow_up_genkey(ctx)
    generation = node.generations.find(genkey, ctx.key_name) if genkey is not None else None
    if generation is None and genkey is not None and await _on_holder(ctx, node, genkey):
        return
    text = generation.text if generation is not None else ""
    await ctx.json(200, {"results": [{"text": text}]})


async def handle_abort(ctx: Ctx, node: Node) -> None:
    """`/api/extra/abort`: stop the generation `genkey` names; its generate is answered with
    the text so far. `success` says whether one of this key's was running under it."""
    genkey = _follow_up_genkey(ctx)
    if genkey is None:
        # Without a genkey KoboldCpp stops its one generation; here that could be anyone's.
        raise RouterError(400, "genkey is required: the generation to abort", param="genkey")
    generation = node.generations.find(genkey, ctx.key_name)
    if generation is None and await _on_holder(ctx, node, genkey):
        return
    if generation is not None:
        generation.stop.set()
    await ctx.json(200, {"success": str(generation is not None).lower(), "done": "true"})
