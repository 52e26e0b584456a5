"""Site API for lending: the settings store and the decision log (master or standalone)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from lending import selectors, services
from lending.decisions import decisions_query, merge_node_records, parse_decision_filters
from lending.keys import LendingSettingError
from lending.settings_store import SettingEntry
from registry.api.views import admin_api
from routerproject.errors import RouterError

DECISIONS_DEFAULT_LIMIT = 500
DECISIONS_MAX_LIMIT = 5000


def _values_from_body(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RouterError(400, f"invalid JSON body: {exc}") from exc
    values = doc.get("values") if isinstance(doc, dict) else None
    if not isinstance(values, dict):
        raise RouterError(400, 'body must be {"values": {key: value, ...}}', param="values")
    return values


def _refused(exc: LendingSettingError) -> RouterError:
    return RouterError(400, str(exc), param=exc.key)


def _settings_response(entries: list[SettingEntry]) -> JsonResponse:
    return JsonResponse(selectors.settings_document(entries))


@admin_api(("GET", "POST", "DELETE"), site=True)
async def offload_settings(request: HttpRequest) -> HttpResponse:
    """GET the lending settings; POST ``{"values": {...}}`` to override; DELETE [?key=]."""
    if request.method == "GET":
        return _settings_response(await database_sync_to_async(selectors.settings_entries)())
    try:
        if request.method == "POST":
            values = _values_from_body(request.body)
            entries = await database_sync_to_async(services.settings_update)(
                values=values, now_ms=int(time.time() * 1000)
            )
        else:
            key = request.GET.get("key", "").strip() or None
            entries = await database_sync_to_async(services.settings_reset)(key=key)
    except LendingSettingError as exc:
        raise _refused(exc) from exc
    await services.settings_changed(entries=entries)
    return _settings_response(entries)


@admin_api(("GET",), site=True)
async def offload_decisions(request: HttpRequest) -> HttpResponse:
    """Every node's decision rows, newest first, filtered by the query string.

    Repeated `node_id` parameters choose the nodes; each is asked concurrently, and a node that
    fails is listed in `node_errors` rather than failing the whole answer.
    """
    from lending.gather import gather_remote
    from proxy.node import get_node

    filters = parse_decision_filters(
        request.GET, default_limit=DECISIONS_DEFAULT_LIMIT, max_limit=DECISIONS_MAX_LIMIT
    )
    node = get_node()
    wanted = set(request.GET.getlist("node_id")) or None
    per_node: dict[str, list[dict[str, Any]]] = {}
    if wanted is None or node.node_id in wanted:
        await node.decisions.flush()
        per_node[node.node_id] = await database_sync_to_async(decisions_query)(**filters)
    params = {k: str(v) for k, v in filters.items() if v is not None and k != "node_id"}
    remote_ids = None if wanted is None else wanted - {node.node_id}
    answers, errors = await gather_remote(
        node, "/router/v1/node/offload/decisions", params=params, node_ids=remote_ids
    )
    for node_id, doc in answers.items():
        rows = doc.get("records") if isinstance(doc, dict) else None
        if isinstance(rows, list):
            per_node[node_id] = [r for r in rows if isinstance(r, dict)]
    body: dict[str, Any] = {"records": merge_node_records(per_node, limit=filters["limit"])}
    if errors:
        body["node_errors"] = errors
    return JsonResponse(body)
