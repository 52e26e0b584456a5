"""Site API for routing links: `routing-groups` (image lane) and `text-routing-groups` (text).

Saving takes effect at once: the master runs the new link set and pushes it to every slave.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from lending import links as svc
from lending.propagate import links_publish
from proxy.node import get_node
from registry.api.views import _json_body, admin_api
from routerproject.errors import RouterError


def _endpoints(lane: svc.Lane) -> dict[tuple[str, str], svc.Endpoint]:
    node = get_node()
    return svc.lane_endpoints(node.cluster.records(), lane)


def _anchor_query(request: HttpRequest) -> tuple[str, str] | None:
    node_id = request.GET.get("node_id", "")
    model_id = request.GET.get("model_id", "")
    if not node_id and not model_id:
        return None
    if not node_id or not model_id:
        missing = "node_id" if not node_id else "model_id"
        raise RouterError(400, f"{missing} is required with an anchor", param=missing)
    return node_id, model_id


async def _links(request: HttpRequest, lane: svc.Lane) -> HttpResponse:
    node = get_node()
    if request.method == "GET":
        anchor_ref = _anchor_query(request)
        if anchor_ref is None:
            return JsonResponse({"links": await database_sync_to_async(svc.links_all)(lane)})
        endpoints = _endpoints(lane)
        anchor = svc.resolve_anchor(endpoints, *anchor_ref, lane)
        doc = await database_sync_to_async(svc.links_for_anchor)(
            lane=lane, anchor=anchor, endpoints=endpoints
        )
        return JsonResponse(doc)
    if request.method == "POST":
        body = _json_body(request)
        anchor, specs, ack = svc.parse_link_set(body, lane=lane, endpoints=_endpoints(lane))
        saved = await database_sync_to_async(svc.links_replace)(
            lane=lane, anchor=anchor, specs=specs, acknowledged=ack
        )
        errors = await links_publish(node)
        return JsonResponse(_answer(anchor, saved, errors))
    anchor_ref = _anchor_query(request)
    if anchor_ref is None:
        raise RouterError(400, "node_id and model_id are required", param="node_id")
    deleted = await database_sync_to_async(svc.links_delete)(
        lane=lane, node_id=anchor_ref[0], model_id=anchor_ref[1]
    )
    errors = await links_publish(node)
    return JsonResponse({"deleted": deleted, **_push_errors(errors)})


def _push_errors(errors: dict[str, str]) -> dict[str, Any]:
    if not errors:
        return {}
    return {"node_errors": [{"node_id": k, "error": v} for k, v in sorted(errors.items())]}


def _answer(
    anchor: svc.Endpoint, saved: list[dict[str, Any]], errors: dict[str, str]
) -> dict[str, Any]:
    return {
        "anchor": {"node_id": anchor.node_id, "model_id": anchor.model_id},
        "links": saved,
        **_push_errors(errors),
    }


@admin_api(("GET", "POST", "DELETE"), site=True)
async def routing_groups(request: HttpRequest) -> HttpResponse:
    return await _links(request, "image")


@admin_api(("GET", "POST", "DELETE"), site=True)
async def text_routing_groups(request: HttpRequest) -> HttpResponse:
    return await _links(request, "text")
