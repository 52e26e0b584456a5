"""Site API for guardian models: `GET|POST|DELETE /router/v1/site/guardians`.

Saving takes effect at once: the master routes with the new settings and pushes them to every
slave. A POST is validated whole before anything is written, so a bad entry changes nothing.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from guardians.routing import is_guardian_candidate
from guardians.store import SCOPES, Change, guardians_apply
from lending.propagate import guardians_publish
from proxy.node import Node, get_node
from proxy.routing import candidates
from registry.api.views import _json_body, admin_api
from routerproject.errors import RouterError

_BODY_KEYS = ("cluster", "nodes", "models")


def guardian_candidates(node: Node) -> list[str]:
    """Public IDs that may be set as a guardian: multimodal text models."""
    return sorted(
        public_id
        for public_id, replicas in node.cluster.by_public_id.items()
        if is_guardian_candidate(replicas)
    )


def _text_models(node: Node) -> dict[str, str]:
    """Every text model's public ID → the node of its first replica (for the node scope)."""
    out = {}
    for public_id in sorted(node.cluster.by_public_id):
        replicas = candidates(node, public_id, "llm")
        if replicas:
            out[public_id] = replicas[0].node_id
    return out


def _document(node: Node, errors: dict[str, str] | None = None) -> dict[str, Any]:
    doc = node.guardians.as_dict()
    effective = {}
    for public_id, node_id in _text_models(node).items():
        guardian = node.guardians.for_model(public_id, node_id)
        if guardian is not None:
            effective[public_id] = guardian
    doc["effective"] = effective
    doc["candidates"] = guardian_candidates(node)
    if errors:
        doc["node_errors"] = [{"node_id": k, "error": v} for k, v in sorted(errors.items())]
    return doc


def _guardian_value(value: Any, param: str, allowed: set[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise RouterError(400, f"{param} must be a model ID or null", param=param)
    if value not in allowed:
        raise RouterError(
            400,
            f'guardian "{value}" is not a multimodal text model (one with vision) in this cluster',
            param=param,
            code="invalid_guardian",
        )
    return value


def parse_changes(node: Node, body: dict[str, Any]) -> list[Change]:
    unknown = sorted(set(body) - set(_BODY_KEYS))
    if unknown:
        raise RouterError(400, f"unknown field {unknown[0]!r}", param=unknown[0])
    if not any(key in body for key in _BODY_KEYS):
        raise RouterError(400, "set at least one of cluster, nodes, models", param="cluster")
    allowed = set(guardian_candidates(node))
    changes: list[Change] = []
    if "cluster" in body:
        changes.append(Change("cluster", "", _guardian_value(body["cluster"], "cluster", allowed)))
    known_nodes = {node.node_id, *node.cluster.nodes}
    text_models = _text_models(node)
    for field, scope in (("nodes", "node"), ("models", "model")):
        if field not in body:
            continue
        entries = body[field]
        if not isinstance(entries, dict):
            raise RouterError(400, f"{field} must be an object", param=field)
        for key, value in entries.items():
            param = f"{field}.{key}"
            if scope == "node" and key not in known_nodes:
                raise RouterError(400, f'node "{key}" is not in this cluster', param=param)
            if scope == "model" and key not in text_models:
                raise RouterError(400, f'"{key}" is not a text model in this cluster', param=param)
            guardian = _guardian_value(value, param, allowed)
            if scope == "model" and guardian == key:
                raise RouterError(400, f'model "{key}" cannot guard itself', param=param)
            changes.append(Change(scope, key, guardian))
    return changes


def _delete_change(request: HttpRequest) -> Change:
    scope = request.GET.get("scope", "")
    if scope not in SCOPES:
        raise RouterError(400, "scope must be cluster, node or model", param="scope")
    key = request.GET.get("key", "")
    if scope != "cluster" and not key:
        raise RouterError(400, f"key is required for the {scope} scope", param="key")
    return Change(scope, "" if scope == "cluster" else key, None)


@admin_api(("GET", "POST", "DELETE"), site=True)
async def guardians(request: HttpRequest) -> HttpResponse:
    node = get_node()
    if request.method == "GET":
        return JsonResponse(_document(node))
    if request.method == "POST":
        changes = parse_changes(node, _json_body(request))
    else:
        changes = [_delete_change(request)]
    await database_sync_to_async(guardians_apply)(changes)
    errors = await guardians_publish(node)
    return JsonResponse(_document(node, errors))
