"""Site API for stored keys: `POST|GET /router/v1/site/api-keys`,
`GET|PATCH|DELETE /router/v1/site/api-keys/{id}` (contract §8).

Each write runs one service (access/services.py), then the master rebuilds its table from the
database and pushes it to every slave, so the change holds on every node within seconds. The
secret exists in one answer only: the 201 of the POST.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from access import selectors, services
from access.api import serializers as s
from access.audit import aactor_of, record, request_id_of
from access.ports import AccessNode, running_node
from routerproject.api import SiteAPIView, error_response
from routerproject.errors import RouterError

BAD_INPUT = error_response(
    "A bad field (an unknown field, a taken name, a model the cluster does not know, a limit "
    "below 1, a share not above 0, an expires_at in the past, a wrong type); `param` names it. "
    "Nothing is stored."
)
NO_KEY = error_response("No key with this id (code key_not_found), or a slave.")
KEY_ANSWER = OpenApiResponse(s.ApiKeySerializer, "The key as it is now (never its secret).")


def _fields(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in services.FIELDS}


def _checked(body: Any, node: AccessNode) -> dict[str, Any]:
    body.is_valid(raise_exception=True)
    fields = _fields(dict(body.validated_data))
    if fields.get("models") is not None:
        services.api_key_check_models(models=fields["models"], known=node.public_model_ids())
    return fields


def _key_id(text: str) -> int:
    # The path's ID is the row's integer key; anything else names no key.
    if not text.isdigit() or len(text) > 18:
        raise RouterError(
            404, f"no key with id {text[:40]!r}", type="not_found", code="key_not_found"
        )
    return int(text)


async def _audited(
    request: Request, action: str, write: Callable[[], services.KeyWrite]
) -> services.KeyWrite:
    """Run a key write and its audit row in one transaction: the write stands only with its row."""
    actor, request_id = await aactor_of(request), request_id_of(request)

    def run() -> services.KeyWrite:
        with transaction.atomic():
            done = write()
            if done.before == done.after:
                # Revoking a revoked key changes nothing, so nothing is written to the log.
                return done
            record(
                actor=actor,
                action=action,
                target=done.key.name,
                before=done.before,
                after=done.after,
                request_id=request_id,
            )
        return done

    result: services.KeyWrite = await database_sync_to_async(run)()
    return result


def _answer(after: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
    if errors:
        after = {
            **after,
            "node_errors": [{"node_id": k, "error": v} for k, v in sorted(errors.items())],
        }
    return after


class ApiKeysView(SiteAPIView):
    """The cluster's stored keys."""

    @extend_schema(
        operation_id="apiKeysList",
        summary="List stored keys (without secrets)",
        responses={200: OpenApiResponse(s.ApiKeyListSerializer, "Every key, by name.")},
    )
    async def get(self, request: Request) -> Response:
        rows = await database_sync_to_async(selectors.api_keys_list)(now=timezone.now())
        return Response({"keys": rows})

    @extend_schema(
        operation_id="apiKeysCreate",
        summary="Create a key; the answer carries its secret, once",
        request=s.ApiKeyCreateSerializer,
        responses={
            201: OpenApiResponse(s.ApiKeyCreatedSerializer, "The key, with its secret `key`."),
            400: BAD_INPUT,
        },
    )
    async def post(self, request: Request) -> Response:
        node = running_node()
        fields = _checked(s.ApiKeyCreateSerializer(data=request.data), node)
        now = timezone.now()
        write = await _audited(
            request, "api_key.create", lambda: services.api_key_create(**fields, now=now)
        )
        errors = await node.keys_publish()
        return Response({**_answer(write.after, errors), "key": write.secret}, status=201)


class ApiKeyView(SiteAPIView):
    """One stored key."""

    http_method_names = ["get", "patch", "delete"]

    @extend_schema(
        operation_id="apiKeysGet",
        summary="One stored key (without its secret)",
        responses={200: KEY_ANSWER, 404: NO_KEY},
    )
    async def get(self, request: Request, key_id: str) -> Response:
        def read() -> dict[str, Any]:
            key = services.api_key_get(key_id=_key_id(key_id))
            return selectors.api_key_dict(key, now=timezone.now())

        return Response(await database_sync_to_async(read)())

    @extend_schema(
        operation_id="apiKeysUpdate",
        summary="Change a key's name, role, models, limits, share or expiry",
        request=s.ApiKeyUpdateSerializer,
        responses={
            200: KEY_ANSWER,
            400: BAD_INPUT,
            404: NO_KEY,
            409: error_response("The key is revoked (code key_revoked)."),
        },
    )
    async def patch(self, request: Request, key_id: str) -> Response:
        node = running_node()
        number = _key_id(key_id)
        fields = _checked(s.ApiKeyUpdateSerializer(data=request.data), node)
        now = timezone.now()
        write = await _audited(
            request,
            "api_key.update",
            lambda: services.api_key_update(key_id=number, fields=fields, now=now),
        )
        errors = await node.keys_publish()
        return Response(_answer(write.after, errors))

    @extend_schema(
        operation_id="apiKeysRevoke",
        summary="Revoke a key (the row stays, so usage and the audit log keep its name)",
        responses={200: KEY_ANSWER, 404: NO_KEY},
    )
    async def delete(self, request: Request, key_id: str) -> Response:
        node = running_node()
        number, now = _key_id(key_id), timezone.now()
        write = await _audited(
            request, "api_key.revoke", lambda: services.api_key_revoke(key_id=number, now=now)
        )
        errors = await node.keys_publish()
        return Response(_answer(write.after, errors))
