"""Site API `offload/summary`: each node's build, settings fingerprint and held requests, and the
live leases (the Lending tab's header and the Nodes page's held requests)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from lending.gather import gather_remote
from proxy.node import get_node
from proxy.nodeapi import lending_summary
from registry.api.views import admin_api


def _leases(node: Any) -> list[dict[str, Any]]:
    if node.role != "master":
        return []
    from lending.master import get_master

    return get_master(node).live_leases()


@admin_api(("GET",), site=True)
async def summary(request: HttpRequest) -> HttpResponse:
    node = get_node()
    answers, errors = await gather_remote(node, "/router/v1/node/offload/summary")
    nodes: list[dict[str, Any]] = [lending_summary(node)]
    nodes.extend(answers[nid] for nid in sorted(answers) if isinstance(answers[nid], dict))
    doc: dict[str, Any] = {
        "master_fingerprint": node.lending.fingerprint,
        "nodes": nodes,
        "leases": _leases(node),
    }
    if errors:
        doc["node_errors"] = errors
    return JsonResponse(doc)
