"""Sending image requests that a text-only model cannot read to its guardian.

Two moments: before dispatch, when the request carries an image and the chosen replica's
record says the model has no vision; and after a backend refused the image anyway (HTTP 400
or 500 whose body says "not supported"), which is how a model whose record claims vision, or
an upstream server the router cannot inspect, turns out to be blind.

The answer always carries the model ID the client asked for. When the guardian runs on the
node that holds the text-only model, it shares that node's runtime, and the model it displaced
is loaded back once the node is quiet (see lending/restore.py); a guardian on another node
answers and keeps its own runtime as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from guardians.ports import GuardiansNode
from registry.cluster import Replica
from registry.routing import candidates, choose
from routerproject.errors import RouterError

REFUSAL_STATUSES = frozenset({400, 500})


class ImageRefused(Exception):
    """A backend refused the image in a request; carries its answer for when no guardian exists."""

    def __init__(self, status: int, body: bytes, content_type: bytes) -> None:
        super().__init__(f"backend refused the image (HTTP {status})")
        self.status = status
        self.body = body
        self.content_type = content_type


def is_image_refusal(status: int, body: bytes) -> bool:
    return status in REFUSAL_STATUSES and b"not supported" in body.lower()


@dataclass(frozen=True)
class GuardianRoute:
    replica: Replica
    guardian_id: str
    restore: bool
    """The guardian runs where the text-only model lives, so that node loads its model back."""


def reads_images(record: Any) -> bool:
    # An upstream server's abilities are unknown until it answers; only a refusal tells.
    return bool(record.get("has_multimodal")) or record.get("backend_mode") == "upstream"


def is_guardian_candidate(replicas: list[Replica]) -> bool:
    return any(
        r.record.get("has_llm") and r.record.get("has_multimodal") and not r.record.get("disabled")
        for r in replicas
    )


def guardian_route(node: GuardiansNode, public_id: str, replica: Replica) -> GuardianRoute | None:
    """Where the guardian of `public_id` (as served by `replica`) answers; None when unset."""
    guardian_id = node.guardians.for_model(public_id, replica.node_id)
    if guardian_id is None:
        return None
    found = [r for r in candidates(node, guardian_id, "llm") if r.record.get("has_multimodal")]
    if not found:
        # Gone from the cluster, or (on a slave) a model of another node. Worded as a refusal,
        # so a master that forwarded the request here can still send it to the guardian.
        raise RouterError(
            400,
            f'model "{public_id}" does not accept image input (image input is not supported) '
            f'and its guardian "{guardian_id}" is not a multimodal text model this node can reach',
            param="messages",
            code="image_not_supported",
        )
    # The guardian shares the text-only model's node when it can: no second node disturbed.
    same_node = [r for r in found if r.node_id == replica.node_id and (r.is_local or r.available)]
    try:
        chosen = same_node[0] if same_node else choose(node, guardian_id, "llm", found)
    except RouterError as exc:
        raise RouterError(
            exc.status,
            f'guardian "{guardian_id}" of model "{public_id}" is unavailable: {exc.message}',
            type=exc.type,
            code=exc.code,
        ) from exc
    return GuardianRoute(chosen, guardian_id, restore=chosen.node_id == replica.node_id)


def before_dispatch(
    node: GuardiansNode, public_id: str, replica: Replica, has_image: bool
) -> GuardianRoute | None:
    """The guardian route for an image request to a model without vision; None otherwise.

    Without a guardian such a request gets a clear 400 here, before any backend sees it.
    """
    if not has_image or reads_images(replica.record):
        return None
    route = guardian_route(node, public_id, replica)
    if route is None:
        raise RouterError(
            400,
            f'model "{public_id}" does not accept image input (image input is not supported) '
            "and no guardian model is set for it",
            param="messages",
            code="image_not_supported",
        )
    return route
