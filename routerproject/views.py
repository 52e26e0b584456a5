from __future__ import annotations

import sys

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from routerproject.dbhealth import DATABASE, is_database_error, unavailable_response
from routerproject.errors import error_envelope


def index(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        {
            "service": "cluster router",
            "endpoints": ["/v1/models", "/router/v1/models"],
            "webui": ["/ui/nodes", "/ui/lending"],
        }
    )


def nodes_page(request: HttpRequest) -> HttpResponse:
    """The Nodes page: one card per node with loaded models, active and held requests."""
    if settings.ROUTER.cluster.role == "slave":
        return not_found(request)
    return render(request, "ui/nodes.html")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return JsonResponse(error_envelope("endpoint not found", type="not_found"), status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's answer to an unhandled error, in the router's envelope.

    A database error is the outage it most likely is: 503 "database unavailable", logged once
    per outage by `DATABASE` rather than with a traceback per request.
    """
    exc = sys.exc_info()[1]
    if exc is not None and is_database_error(exc):
        DATABASE.failed(f"{request.method} {request.path[:100]}", exc)
        return unavailable_response()
    return JsonResponse(error_envelope("internal server error", type="server_error"), status=500)
