"""What every app's management API shares: the admin-key rule, the role permission, the one
error envelope, strict body fields and the schema conventions (JSON in and out: `api_formats`).

The admin key is checked at the ASGI edge (`proxy.edge.app.ProxyApp`), before Django reads the body,
where `admin_key_required` from here says which requests need one and `access.keys.admin_caller`
accepts a config admin key or a stored key of role `admin` (`admin_key_valid` is the config-only
rule); DRF permissions express only role rules (`SiteRoute`). Bodies are validated by
serializers built from the strict fields below, and a serializer error answers 400 in the
OpenAI envelope with `param` naming the field at fault.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from adrf.views import APIView
from django.conf import settings
from django.urls import Resolver404, resolve
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, serializers
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from routerproject.errors import RouterError, error_envelope

JSON = "application/json"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MANAGEMENT_PREFIX = "/router/v1/"
SITE_NOTE = (
    "Site route: served by a master or a standalone node; a slave answers 404, as if the "
    "route did not exist. The document is the same on every role."
)
ERROR_REF = {"$ref": "#/components/schemas/Error"}
NOT_FOUND_MESSAGE = "endpoint not found"

# -- the admin key, checked at the ASGI edge ---------------------------------------------------


def admin_key_valid(authorization: bytes | None, keys: Sequence[str]) -> bool:
    """Whether an `Authorization` header carries one of `keys` (any header when none are set)."""
    if not keys:
        return True
    header = authorization or b""
    token = header[7:].strip() if header.startswith(b"Bearer ") else b""
    # Every key is compared, match or not, so timing says nothing about which one is close.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(token, key.encode())
    return ok


def admin_key_required(path: str, method: str) -> bool:
    """Whether a request reaches a management view, by a method it serves, that is not public.

    A method the view does not serve, or a path that is no route, goes on to Django and its 404
    without a key, as it always has: probing the surface reveals no more than the schema does.
    """
    if not path.startswith(MANAGEMENT_PREFIX):
        return False
    try:
        match = resolve(path)
    except Resolver404:
        return False
    view_class = getattr(match.func, "cls", None)
    if view_class is None:
        # Not a DRF view, so nothing says it is public: it needs the key.
        return True
    if not getattr(view_class, "admin_key_required", True):
        return False
    return method.lower() in served_methods(view_class)


def served_methods(view_class: type) -> set[str]:
    names: Iterable[str] = getattr(view_class, "http_method_names", ())
    return {name for name in names if hasattr(view_class, name)}


# -- role rules ----------------------------------------------------------------------------------


class SiteRoute(BasePermission):
    """Site routes control the whole cluster: only a master or a standalone node serves them.

    On a slave they do not exist (404), as operators of the reference expect.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        if settings.ROUTER.cluster.role == "slave":
            raise exceptions.NotFound(NOT_FOUND_MESSAGE)
        return True


# -- errors ----------------------------------------------------------------------------------------


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's errors in the router's one envelope."""
    if isinstance(exc, RouterError):
        return Response(exc.envelope(), status=exc.status)
    if isinstance(exc, exceptions.MethodNotAllowed | exceptions.NotFound):
        # A method a route does not serve has always been a 404, as if the route did not exist.
        return Response(error_envelope(NOT_FOUND_MESSAGE, type="not_found"), status=404)
    if isinstance(exc, exceptions.ValidationError):
        param, message = field_error(exc.detail)
        return Response(error_envelope(message, type="invalid_request_error", param=param), 400)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    message = str(data.get("detail", data)) if isinstance(data, dict) else str(data)
    kind = "invalid_request_error" if response.status_code < 500 else "server_error"
    response.data = error_envelope(message, type=kind)
    return response


def field_error(detail: Any, path: str = "") -> tuple[str | None, str]:
    """The first error of a serializer's errors as (param, message).

    `param` is the dotted path of the field (`lends_to[1].node_id`); the message is that path
    followed by the field's predicate ("is required", "must be true or false"). DRF's own
    sentences ("This field may not be blank.") follow the path after a colon.
    """
    if isinstance(detail, dict):
        for key, value in detail.items():
            if not value:
                continue
            if key == api_settings.NON_FIELD_ERRORS_KEY:
                sub = path
            elif isinstance(key, int):
                sub = f"{path}[{key}]"
            else:
                sub = f"{path}.{key}" if path else str(key)
            return field_error(value, sub)
    if isinstance(detail, list):
        for index, item in enumerate(detail):
            if not item:
                continue
            if isinstance(item, dict):
                return field_error(item, f"{path}[{index}]")
            return field_error(item, path)
    text = str(detail)
    if not path:
        return None, text
    joiner = " " if text[:1].islower() else ": "
    return path, f"{path}{joiner}{text}"


def validated(serializer: serializers.Serializer[Any]) -> dict[str, Any]:
    """The serializer's validated data, or a RouterError 400 naming the field at fault: for
    bodies read outside DRF (the node protocol) that follow the same rules."""
    if not serializer.is_valid():
        param, message = field_error(serializer.errors)
        raise RouterError(400, message, param=param)
    data: dict[str, Any] = dict(serializer.validated_data)
    return data


def error_response(description: str) -> OpenApiResponse:
    return OpenApiResponse(response=ERROR_REF, description=description)


# -- strict body fields ------------------------------------------------------------------------
# JSON has types, and the API always held clients to them: "1" is not a generation and "yes" is
# not true. DRF's fields coerce, so these refuse anything but the JSON type they describe. Their
# messages are predicates that `field_error` puts after the field's path.


class StrictCharField(serializers.CharField):
    default_error_messages = {
        "required": "is required",
        "null": "is required",
        "blank": "is required",
        "invalid": "must be a string",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {
        "required": "is required",
        "null": "must be true or false",
        "invalid": "must be true or false",
    }

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {
        "required": "is required",
        "null": "must be an integer",
        "invalid": "must be an integer",
        "min_value": "must be at least {min_value}",
        "max_value": "must be at most {max_value}",
    }

    def to_internal_value(self, data: Any) -> int:
        # bool is an int to Python, but `true` is not a number.
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictListField(serializers.ListField):
    default_error_messages = {
        "required": "is required",
        "null": "must be a list",
        "not_a_list": "must be a list",
        "empty": "must not be empty",
    }


class StrictDictField(serializers.DictField):
    default_error_messages = {
        "required": "is required",
        "null": "must be an object",
        "not_a_dict": "must be an object",
        "empty": "must not be empty",
    }


class StrictChoiceField(serializers.ChoiceField):
    """A string from a fixed list; the message lists the choices."""

    def __init__(self, choices: Sequence[str], **kwargs: Any) -> None:
        listed = ", ".join(choices)
        messages = {
            "required": "is required",
            "null": f"must be one of {listed}",
            "invalid_choice": f"must be one of {listed}",
            **kwargs.pop("error_messages", {}),
        }
        super().__init__(choices=list(choices), error_messages=messages, **kwargs)


class WholeNumberQueryField(serializers.IntegerField):
    """A query-string integer within bounds: digits only, one message for every way it fails."""

    def __init__(self, *, min_value: int, max_value: int, **kwargs: Any) -> None:
        message = f"must be a whole number from {min_value} to {max_value}"
        keys = ("invalid", "min_value", "max_value", "max_string_length")
        messages: dict[str, Any] = dict.fromkeys(keys, message)
        super().__init__(
            min_value=min_value, max_value=max_value, error_messages=messages, **kwargs
        )

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, str) or not data.isdigit():
            self.fail("invalid")
        return int(super().to_internal_value(data))


class BodySerializer(serializers.Serializer):
    """A request body: a JSON object, checked field by field."""

    default_error_messages = {"invalid": "request body must be a JSON object"}


class NodeErrorSerializer(serializers.Serializer):
    """A node that failed while the master asked every node; the answer still carries what the
    other nodes said."""

    node_id = serializers.CharField()
    error = serializers.CharField(help_text="Why that node did not answer.")

    class Meta:
        ref_name = "NodeError"


# -- views -------------------------------------------------------------------------------------


class RouterAPIView(APIView):
    """A management view: async (adrf), so it runs on the router's event loop beside the node's
    runtimes, with the admin key required unless `admin_key_required` is False.

    HEAD and OPTIONS are not served: every route answers only the methods it names, and 404
    to any other, as it always has.
    """

    http_method_names = ["get", "post", "delete"]
    admin_key_required: ClassVar[bool] = True


class SiteAPIView(RouterAPIView):
    permission_classes = [SiteRoute]


# -- the schema ------------------------------------------------------------------------------------


class RouterAutoSchema(AutoSchema):
    """drf-spectacular's schema, with the router's conventions added to every operation: the
    admin key as the security requirement and its 401, and a site route's 404 on a slave."""

    def get_tags(self) -> list[str]:
        return ["Site"] if self._site_route() else ["Management"]

    def map_parsers(self) -> list[Any]:
        return [JSON]

    def get_description(self) -> str:  # type: ignore[override]
        text = super().get_description() or ""
        if self._site_route():
            text = f"{text}\n\n{SITE_NOTE}" if text else SITE_NOTE
        return text

    def get_operation(
        self, path: str, path_regex: str, path_prefix: str, method: str, registry: Any
    ) -> dict[str, Any] | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation["responses"]
        if getattr(self.view, "admin_key_required", True):
            operation["security"] = [{"adminKey": []}]
            responses["401"] = _error_object(
                "Admin keys exist (`auth.admin_keys` or a stored admin key) and the request "
                "carries none of them."
            )
        else:
            operation["security"] = []
        if self._site_route():
            # A site route's own 404s (an unknown node, …) share the status with the slave's.
            responses.setdefault(
                "404", _error_object("On a slave, where site routes do not exist.")
            )
        # What the node's front door answers before the view runs (README, "The front door").
        responses.setdefault(
            "400", _error_object("The `Host` is not in `server.allowed_hosts` (host_not_allowed).")
        )
        responses.setdefault(
            "403",
            _error_object(
                "The client is outside `server.allowed_cidrs` (address_not_allowed), or a write "
                "on a node without admin keys comes from another origin (cross_origin)."
            ),
        )
        if method.upper() in WRITE_METHODS:
            responses.setdefault(
                "413", _error_object("The body is larger than `server.max_body_bytes`.")
            )
            responses.setdefault(
                "415", _error_object("The body's Content-Type is not application/json.")
            )
        responses.setdefault(
            "503", _error_object("The database is unavailable (database_unavailable).")
        )
        return operation

    def _site_route(self) -> bool:
        return SiteRoute in getattr(self.view, "permission_classes", ())


def _error_object(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {JSON: {"schema": dict(ERROR_REF)}},
    }


ADMIN_KEY_SCHEME: dict[str, Any] = {
    "type": "http",
    "scheme": "bearer",
    "description": "One of `auth.admin_keys`, or a stored key of role `admin` (`rk-…`). "
    "Checked only when either exists.",
}


class RouterSchemaGenerator(SchemaGenerator):
    """The management part of the document, with the components every operation refers to."""

    def get_schema(self, request: Any = None, public: bool = False) -> dict[str, Any]:
        schema: dict[str, Any] = _without_enum_ids(
            super().get_schema(request=request, public=public)
        )
        components = schema.setdefault("components", {})
        components.setdefault("schemas", {})["Error"] = ERROR_SCHEMA
        components.setdefault("securitySchemes", {})["adminKey"] = ADMIN_KEY_SCHEME
        return schema


def _without_enum_ids(node: Any) -> Any:
    # drf-spectacular tags each enum for its enum-component hook, which the router leaves off
    # (settings.SPECTACULAR_SETTINGS): the tags would otherwise reach the published document.
    if isinstance(node, dict):
        return {k: _without_enum_ids(v) for k, v in node.items() if k != "x-spec-enum-id"}
    if isinstance(node, list):
        return [_without_enum_ids(item) for item in node]
    return node


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The OpenAI error envelope every path except Ollama's answers with.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {
                    "type": "string",
                    "description": "What went wrong, for a person to read.",
                },
                "type": {
                    "type": "string",
                    "description": "The kind of error: invalid_request_error, unauthorized, "
                    "not_found, backend_error, server_error, …",
                },
                "param": {
                    "type": "string",
                    "description": "The request field at fault; absent when none is.",
                },
                "code": {
                    "type": ["string", "integer"],
                    "description": "A stable code for programs (model_not_found, "
                    "node_unavailable, different_weights, …); absent when there is none. A "
                    "backend's own error passes through as it sent it, and llama-server puts the "
                    "HTTP status here as a number.",
                },
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}
"""The envelope of `routerproject.errors.error_envelope`, written once for every app's schema."""
