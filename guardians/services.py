"""Checking and publishing guardian settings.

One set of rules decides whether a change is valid, for the site API and the admin alike.
The master routes with its database rows and pushes them on, like links and lending
settings: at once after a change, on every lending tick, and to a slave that (re)registers
with other settings, so a slave routes image requests as its master would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from channels.db import database_sync_to_async

from guardians.ports import GuardiansNode
from guardians.routing import is_guardian_candidate
from guardians.store import Change, Guardians, guardians_load
from registry.routing import candidates
from registry.slavepush import push_to_slaves
from routerproject.errors import RouterError

GUARDIANS_PATH = "/router/v1/node/guardians"


# -- validation: the site API and the admin check a change with the same rules ----------------


def guardian_candidates(node: GuardiansNode) -> list[str]:
    """Public IDs that may be set as a guardian: multimodal text models."""
    return sorted(
        public_id
        for public_id, replicas in node.cluster.by_public_id.items()
        if is_guardian_candidate(replicas)
    )


def text_model_nodes(node: GuardiansNode) -> dict[str, str]:
    """Every text model's public ID → the node of its first replica (for the node scope)."""
    out = {}
    for public_id in sorted(node.cluster.by_public_id):
        replicas = candidates(node, public_id, "llm")
        if replicas:
            out[public_id] = replicas[0].node_id
    return out


def _guardian_value(value: str | None, param: str, allowed: set[str]) -> str | None:
    if value is not None and value not in allowed:
        raise RouterError(
            400,
            f'guardian "{value}" is not a multimodal text model (one with vision) in this cluster',
            param=param,
            code="invalid_guardian",
        )
    return value


def changes_resolve(node: GuardiansNode, body: Mapping[str, Any]) -> list[Change]:
    """The changes of a well-formed update, checked against the cluster view: every guardian is
    a multimodal text model, every node and model is known, and no model guards itself."""
    allowed = set(guardian_candidates(node))
    changes: list[Change] = []
    if "cluster" in body:
        changes.append(Change("cluster", "", _guardian_value(body["cluster"], "cluster", allowed)))
    known_nodes = {node.node_id, *node.cluster.nodes}
    text_models = text_model_nodes(node)
    for field, scope in (("nodes", "node"), ("models", "model")):
        for key, value in body.get(field, {}).items():
            param = f"{field}.{key}"
            if scope == "node" and key not in known_nodes:
                raise RouterError(400, f'node "{key}" is not in this cluster', param=param)
            if scope == "model" and key not in text_models:
                raise RouterError(400, f'"{key}" is not a text model in this cluster', param=param)
            guardian = _guardian_value(value, param, allowed)
            if scope == "model" and guardian == key:
                raise RouterError(
                    400, f'model "{key}" cannot guard itself', param=param, code="self_guardian"
                )
            changes.append(Change(scope, key, guardian))
    return changes


# -- publishing ---------------------------------------------------------------------------------


async def guardians_publish(node: GuardiansNode) -> dict[str, str]:
    """Load the guardian settings from the database, route with them here, push them."""
    if node.role == "slave":
        return {}
    return await guardians_push(node, await database_sync_to_async(guardians_load)())


async def guardians_push(node: GuardiansNode, guardians: Guardians) -> dict[str, str]:
    """Route with `guardians` (as just loaded from the database) here and push them on."""
    if node.role == "slave":
        return {}
    node.guardians = guardians
    return await push_to_slaves(node, GUARDIANS_PATH, node.guardians.as_dict())


async def guardians_catch_up(node: GuardiansNode, node_id: str) -> None:
    """Bring one slave that just (re)registered up to the master's guardians."""
    if node.role != "master":
        return
    await push_to_slaves(node, GUARDIANS_PATH, node.guardians.as_dict(), only=node_id)
