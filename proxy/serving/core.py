"""The serving core every path family stands on: serve a request on a replica, fail over once.

A family's handler parses what it needs, picks the replica (registry/routing.py), and hands the
request here: `serve_on` runs it on a local runtime (`forward`) or on the node that holds the
model (`forward_remote`), and `failover` runs it once more on another replica when it never
reached the first. The route types of the families' tables are here too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from proxy import work
from proxy.forwarding.faults import NotSent
from proxy.forwarding.local import Job, Shaper, forward
from proxy.forwarding.remote import forward_remote
from proxy.node import Node
from proxy.request import Ctx
from registry.bodies import set_body_model, set_image_body_model
from registry.cluster import Replica
from registry.kcpps import Lane
from registry.routing import Kind, candidates, choose, lane_of, resolve
from routerproject.errors import RouterError

Handler = Callable[[Ctx, Node], Awaitable[None]]
# (methods, handler, whether an inference key is required)
Route = tuple[frozenset[str], Handler, bool]
logger = logging.getLogger(__name__)

POST = frozenset({"POST"})
GET = frozenset({"GET", "HEAD"})
ALL_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

Serve = Callable[[Replica], Awaitable[None]]

MODEL_HEADER = b"x-tensors-model"


async def failover(
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


def _with_model(body: bytes, public_id: str, served_id: str) -> bytes:
    return body if public_id == served_id else set_body_model(body, served_id)


async def serve_on(
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
    to = _addressed(ctx, node, replica, kind, public_id, body, content_type, has_image)
    if replica.cfg is None:
        # Another node serves it; it translates Ollama/Kobold itself, so the client's own path
        # and shape go over the wire unchanged apart from the model ID.
        await _serve_remote(ctx, node, replica, lane, public_id, content_type, guardian_restore, to)
        return
    job = Job(
        cfg=replica.cfg,
        lane=lane,
        model_id=to.served_id,
        public_id=public_id,
        backend_path=path,
        body=to.body,
        content_type=content_type,
        stream=stream,
        prompt_bytes=len(to.body),
        image=image,
        max_tokens=max_tokens,
        has_image=has_image,
        guardian_fallback=to.fallback,
        guardian_restore=guardian_restore,
        model_header=to.model_header,
        method=ctx.method,
        query=query,
        lendable=lendable,
        cached_prompt_bytes=_cached_prompt_bytes(ctx, replica),
    )
    await forward(ctx, node, job, shape)


class _Addressed(NamedTuple):
    """A request addressed to the replica that serves it."""

    served_id: str
    """The ID the replica serves the model under."""
    model_header: str | None
    """The client's `X-Tensors-Model` (images), set to `served_id` when it named the model."""
    body: bytes
    """The body under `served_id`."""
    fallback: bool
    """Whether a backend's refusal of the request's image goes to the model's guardian."""


def _addressed(
    ctx: Ctx,
    node: Node,
    replica: Replica,
    kind: Kind,
    public_id: str,
    body: bytes,
    content_type: bytes,
    has_image: bool,
) -> _Addressed:
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
    fallback = _guardian_fallback(ctx, node, replica, public_id, has_image)
    return _Addressed(served_id, model_header, body, fallback)


async def _serve_remote(
    ctx: Ctx,
    node: Node,
    replica: Replica,
    lane: Lane,
    public_id: str,
    content_type: bytes,
    guardian_restore: bool,
    to: _Addressed,
) -> None:
    await forward_remote(
        ctx,
        node,
        replica,
        lane=lane,
        path=ctx.path,
        body=to.body,
        public_id=public_id,
        served_id=to.served_id,
        content_type=content_type,
        guardian_fallback=to.fallback,
        guardian_restore=guardian_restore,
        model_header=to.model_header,
    )


def _cached_prompt_bytes(ctx: Ctx, replica: Replica) -> int:
    """Leading prompt bytes the replica's backend holds in cache (the replica choice's match)."""
    if ctx.prefix_match is None:
        return 0
    return ctx.prefix_match.bytes_on(replica.node_id, replica.local_id)


def _guardian_fallback(
    ctx: Ctx, node: Node, replica: Replica, public_id: str, has_image: bool
) -> bool:
    """Only a request that could still go elsewhere watches for the backend refusing its image:
    a guardian must be set, and this must not already be that guardian."""
    return (
        has_image
        and not ctx.borrowed
        and replica.public_id == public_id  # not already running as some model's guardian
        and node.guardians.for_model(public_id, replica.node_id) is not None
    )


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
    ctx.model = model
    replica = resolve(node, model, kind, borrowed=ctx.borrowed)

    def serve(target: Replica) -> Awaitable[None]:
        return serve_on(
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

    await failover(ctx, node, model, kind, replica, serve)


def enabled_image_ids(node: Node) -> list[str]:
    """The public image IDs with a replica that is not disabled."""
    return sorted(
        pid
        for pid, replicas in node.cluster.by_public_image_id.items()
        if any(not r.record.get("disabled") for r in replicas)
    )
