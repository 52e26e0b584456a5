from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles import finders
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render

from routerproject.dbhealth import DATABASE, is_database_error, unavailable_response
from routerproject.errors import error_envelope


def index(request: HttpRequest) -> HttpResponse:
    """`/`: the Nodes page on a node that has pages; on a slave, where its pages are."""
    cluster = settings.ROUTER.cluster
    if cluster.role != "slave":
        return redirect("ui-nodes")
    doc = {
        "service": "cluster router",
        "role": "slave",
        "node_id": cluster.node_id,
        "message": "This node is a slave: it has no pages. Its master shows the whole cluster.",
        "master_url": cluster.master_url,
        "webui": f"{cluster.master_url.rstrip('/')}/ui/nodes" if cluster.master_url else "",
        "endpoints": ["/v1/models", "/router/v1/models"],
    }
    if "text/html" in request.headers.get("Accept", ""):
        return render(request, "ui/slave.html", doc)
    return JsonResponse(doc)


def nodes_page(request: HttpRequest) -> HttpResponse:
    """The Nodes page: one card per node with loaded models, active and held requests."""
    if settings.ROUTER.cluster.role == "slave":
        return not_found(request)
    return render(request, "ui/nodes.html")


# Browsers ask every site for /favicon.ico; without one each page view logged a 404 WARNING.
FAVICON_STATIC_PATH = "registry/favicon.ico"
FAVICON_MAX_AGE_SECS = 86400


@cache
def _favicon_bytes() -> bytes:
    found = finders.find(FAVICON_STATIC_PATH)
    if not isinstance(found, str):
        raise ImproperlyConfigured(f"static file {FAVICON_STATIC_PATH} is missing")
    return Path(found).read_bytes()


def favicon(request: HttpRequest) -> HttpResponse:
    """`/favicon.ico`: the pages' icon (registry/static/registry/favicon.ico), public."""
    response = HttpResponse(_favicon_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = f"public, max-age={FAVICON_MAX_AGE_SECS}"
    return response


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
