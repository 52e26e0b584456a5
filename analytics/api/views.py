from __future__ import annotations

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from analytics.selectors import analytics_recent
from proxy.node import get_node
from registry.api.views import admin_api
from routerproject.errors import RouterError

MAX_LIMIT = 5000


@admin_api(("GET",), site=True)
async def analytics(request: HttpRequest) -> HttpResponse:
    """Recent request or load rows of this node, newest first (buffered rows flushed first)."""
    kind = request.GET.get("kind", "requests")
    if kind not in ("requests", "loads"):
        raise RouterError(400, "kind must be requests or loads", param="kind")
    raw_limit = request.GET.get("limit", "200")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise RouterError(400, f"limit must be a whole number from 1 to {MAX_LIMIT}", param="limit")
    await get_node().recorder.flush()
    rows = await database_sync_to_async(analytics_recent)(kind=kind, limit=int(raw_limit))
    return JsonResponse({"kind": kind, "records": rows})
