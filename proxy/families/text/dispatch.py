"""What the text family's chat and generate paths share: the replica choice's prefix
fingerprints, and the guardian of a text-only model for a request that carries an image."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from guardians import routing as guardians
from guardians.routing import ImageRefused
from proxy.families.text import replies
from proxy.node import Node
from proxy.request import Ctx
from proxy.serving.core import failover
from registry import affinity
from registry.cluster import Replica
from routerproject.errors import is_ollama_path

logger = logging.getLogger(__name__)

RunOn = Callable[[Replica, bool], Awaitable[None]]


def dispatch(
    ctx: Ctx, node: Node, public_id: str, replica: Replica, has_image: bool, run: RunOn
) -> Awaitable[None]:
    """What serves a text request: its guardian check when it carries an image, else `run`."""

    def attempt(target: Replica, restore: bool) -> Awaitable[None]:
        return failover(ctx, node, public_id, "llm", target, lambda t: run(t, restore))

    if has_image and not ctx.borrowed:
        return _guarded(ctx, node, public_id, replica, attempt)
    # A plain function, not a coroutine: the common case costs no extra frame, and memory per
    # held request counts.
    return attempt(replica, ctx.guardian_restore)


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
            body, ctype = replies.openai_error_to_ollama(body), b"application/json"
        await ctx.respond(refusal.status, body, ctype)


def prefix_of(
    node: Node, doc: dict[str, Any]
) -> tuple[list[affinity.Fingerprint], affinity.PrefixMatch | None]:
    """A text body's prefix fingerprints, and the match the replica choice fills; neither is
    made with cache affinity off, so the hot path pays nothing for it."""
    if not node.cache_affinity:
        return [], None
    return affinity.fingerprints(doc), affinity.PrefixMatch()
