from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from routerproject.errors import error_envelope


def index(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        {"service": "cluster router", "endpoints": ["/v1/models", "/router/v1/models"]}
    )


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return JsonResponse(error_envelope("endpoint not found", type="not_found"), status=404)
