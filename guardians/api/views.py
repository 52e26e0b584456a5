"""Site API for guardian models: `GET|POST|DELETE /router/v1/site/guardians`.

Saving takes effect at once: the master routes with the new settings and pushes them to every
slave. A POST is validated whole before anything is written, so a bad entry changes nothing.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from access.audit import aaudited_write
from guardians.api import serializers as s
from guardians.ports import GuardiansNode, running_node
from guardians.services import (
    changes_resolve,
    guardian_candidates,
    guardians_publish,
    text_model_nodes,
)
from guardians.store import Change, guardians_apply, guardians_load
from routerproject.api import SiteAPIView, error_response


def _document(node: GuardiansNode, errors: dict[str, str] | None = None) -> dict[str, Any]:
    doc = node.guardians.as_dict()
    effective = {}
    for public_id, node_id in text_model_nodes(node).items():
        guardian = node.guardians.for_model(public_id, node_id)
        if guardian is not None:
            effective[public_id] = guardian
    doc["effective"] = effective
    doc["candidates"] = guardian_candidates(node)
    if errors:
        doc["node_errors"] = [{"node_id": k, "error": v} for k, v in sorted(errors.items())]
    return doc


def _change_target(change: Change) -> str:
    return "cluster" if change.scope == "cluster" else f"{change.scope} {change.key}"


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
        changes = changes_resolve(node, body.validated_data)
        return await self._apply(request, node, changes, "guardian.update")

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
        return await self._apply(
            request, running_node(), [Change(scope, key, None)], "guardian.delete"
        )

    @staticmethod
    async def _apply(
        request: Request, node: GuardiansNode, changes: list[Change], action: str
    ) -> Response:
        await aaudited_write(
            request,
            action=action,
            target=", ".join(_change_target(change) for change in changes) or "guardians",
            read=lambda: guardians_load().as_audit(),
            write=partial(guardians_apply, changes),
        )
        errors = await guardians_publish(node)
        return Response(_document(node, errors))
