from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

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
