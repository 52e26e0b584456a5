"""Site API for guardian models: `GET|POST|DELETE /router/v1/site/guardians`.

Saving takes effect at once: the master routes with the new settings and pushes them to every
slave. A POST is validated whole before anything is written, so a bad entry changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from channels.db import database_sync_to_async
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from guardians.api import serializers as s
from guardians.ports import GuardiansNode, running_node
from guardians.routing import is_guardian_candidate
from guardians.services import guardians_publish
from guardians.store import Change, guardians_apply
from registry.routing import candidates
from routerproject.api import SiteAPIView, error_response
from routerproject.errors import RouterError


def guardian_candidates(node: GuardiansNode) -> list[str]:
    """Public IDs that may be set as a guardian: multimodal text models."""
    return sorted(
        public_id
        for public_id, replicas in node.cluster.by_public_id.items()
        if is_guardian_candidate(replicas)
    )


def _text_models(node: GuardiansNode) -> dict[str, str]:
    """Every text model's public ID → the node of its first replica (for the node scope)."""
    out = {}
    for public_id in sorted(node.cluster.by_public_id):
        replicas = candidates(node, public_id, "llm")
        if replicas:
            out[public_id] = replicas[0].node_id
    return out


def _document(node: GuardiansNode, errors: dict[str, str] | None = None) -> dict[str, Any]:
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
    text_models = _text_models(node)
    for field, scope in (("nodes", "node"), ("models", "model")):
        for key, value in body.get(field, {}).items():
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


GUARDIANS_ANSWER = OpenApiResponse(s.GuardiansSerializer, "The guardians after the change.")


class GuardiansView(SiteAPIView):
    """Guardian models per scope and in effect."""

    @extend_schema(
        operation_id="guardiansGet",
        summary="Guardian models per scope and in effect",
        responses={
            200: OpenApiResponse(
                s.GuardiansSerializer, "The guardians and the models that may be one."
            )
        },
    )
    async def get(self, request: Request) -> Response:
        return Response(_document(running_node()))

    @extend_schema(
        operation_id="guardiansSet",
        summary="Set guardians for any of the three scopes",
        request=s.GuardiansUpdateSerializer,
        responses={
            200: GUARDIANS_ANSWER,
            400: error_response(
                "A guardian that is not a multimodal text model (code invalid_guardian), an "
                "unknown node or text model, a model set to guard itself, or an unknown field. "
                "Nothing is saved."
            ),
        },
    )
    async def post(self, request: Request) -> Response:
        body = s.GuardiansUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node = running_node()
        return await self._apply(node, changes_resolve(node, body.validated_data))

    @extend_schema(
        operation_id="guardiansClear",
        summary="Clear the guardian of one scope",
        parameters=[s.GuardianClearQuerySerializer],
        responses={
            200: GUARDIANS_ANSWER,
            400: error_response("An unknown scope, or no key for node or model."),
        },
    )
    async def delete(self, request: Request) -> Response:
        query = s.GuardianClearQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        scope = query.validated_data["scope"]
        key = "" if scope == "cluster" else query.validated_data["key"]
        return await self._apply(running_node(), [Change(scope, key, None)])

    @staticmethod
    async def _apply(node: GuardiansNode, changes: list[Change]) -> Response:
        await database_sync_to_async(guardians_apply)(changes)
        errors = await guardians_publish(node)
        return Response(_document(node, errors))
