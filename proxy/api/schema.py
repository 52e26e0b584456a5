"""The OpenAPI 3.1 document of the router's HTTP surface at `GET /router/v1/schema`, and Swagger
UI for it at `GET /router/v1/docs`.

Two parts make the document. drf-spectacular generates the management part from each app's
views and serializers (`routerproject.api.RouterSchemaGenerator`); the client paths, which the
proxy serves ahead of Django, are described by hand by each path family and joined in
`proxy.api.client_paths`. The merge lives here, at the top layer, because only here are both in
reach. The node protocol (`/router/v1/node/…`) is left out on purpose: only nodes of one cluster
speak it, with the cluster token.

The document is public. It describes the surface, not anything behind it, and a client that
has no key yet needs it most; every operation it describes still checks its own keys. Swagger UI
is a management page like any other, behind the admin key; its scripts and styles are the ones
drf-spectacular-sidecar ships, served from /static/ by this node, never from a CDN.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar

import orjson
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from proxy.api.client_paths import client_paths
from proxy.api.examples import add_request_examples
from proxy.families.openapi import INFERENCE_KEY, TAGS, client_components
from routerproject.api import RouterSchemaGenerator

__all__ = ["OPENAPI_CONTENT_TYPE", "DocsView", "SchemaView", "openapi_bytes", "openapi_document"]

OPENAPI_CONTENT_TYPE = "application/vnd.oai.openapi+json;version=3.1"


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document (callers may change it)."""
    doc: dict[str, Any] = orjson.loads(openapi_bytes())
    return doc


@cache
def openapi_bytes() -> bytes:
    """The serialized document, built once per process (it depends only on the build)."""
    # `default=str` renders the lazy translation strings drf-spectacular leaves in descriptions.
    return orjson.dumps(_merged(), default=str)


def _merged() -> dict[str, Any]:
    doc = RouterSchemaGenerator().get_schema(request=None, public=True)
    components = doc["components"]
    schemas = components["schemas"]
    client = client_components()
    clash = sorted(set(schemas) & set(client))
    if clash:
        raise ImproperlyConfigured(f"schema components defined twice: {', '.join(clash)}")
    schemas.update(client)
    components["securitySchemes"]["inferenceKey"] = INFERENCE_KEY
    doc["paths"] = {**client_paths(), **doc["paths"]}
    add_request_examples(doc["paths"])
    doc["tags"] = [*TAGS, *doc.get("tags", [])]
    return doc


class SchemaView(APIView):
    """The document itself: public, on every role."""

    http_method_names = ["get"]
    admin_key_required: ClassVar[bool] = False

    @extend_schema(
        operation_id="schemaGet",
        summary="This OpenAPI document",
        tags=["Schema"],
        responses={
            (200, OPENAPI_CONTENT_TYPE): OpenApiResponse(
                {"type": "object"}, "The OpenAPI 3.1 document (public, on every role)."
            )
        },
    )
    def get(self, request: Request) -> HttpResponse:
        return HttpResponse(openapi_bytes(), content_type=OPENAPI_CONTENT_TYPE)


class DocsView(SpectacularSwaggerView):
    """Swagger UI for the document, with the assets of drf-spectacular-sidecar."""

    http_method_names = ["get"]
    url_name = "router-schema"
    title = "Cluster router API"

    @extend_schema(
        operation_id="docsGet",
        summary="Swagger UI for this document",
        tags=["Schema"],
        responses={
            (200, "text/html"): OpenApiResponse(
                {"type": "string"}, "The page; its scripts and styles come from /static/."
            )
        },
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)
