"""Site API `inventory`: every node of the cluster with its hardware, models and model files."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.node import get_node
from registry.api.views import admin_api
from registry.inventory import include_files_parse, inventory_site


@admin_api(("GET",), site=True)
async def site_inventory(request: HttpRequest) -> HttpResponse:
    include_files = include_files_parse(request.GET.get("include_files"))
    return JsonResponse(await inventory_site(node=get_node(), include_files=include_files))
