"""Management API for the node's models: list, load, unload, state.

These views are async because they act on the router process's in-memory runtimes, which live
on the event loop; Django runs async views on that same loop under ASGI.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine
from functools import wraps
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from proxy.node import get_node
from proxy.runtimes import BackendError
from registry import services
from routerproject.errors import RouterError, error_envelope

View = Callable[..., Coroutine[Any, Any, HttpResponse]]
PROTOCOL_VERSION = 2


def _error(err: RouterError) -> JsonResponse:
    return JsonResponse(err.envelope(), status=err.status)


def admin_api(methods: tuple[str, ...], *, site: bool = False) -> Callable[[View], View]:
    """Admin-key check, method check and one error shape for every management view.

    `site` routes control the whole cluster, so only a master or a standalone node serves
    them; on a slave they do not exist (404), as operators of the reference expect.
    """

    def decorate(view: View) -> View:
        @csrf_exempt
        @wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods or (site and settings.ROUTER.cluster.role == "slave"):
                return JsonResponse(
                    error_envelope("endpoint not found", type="not_found"), status=404
                )
            keys = settings.ROUTER.auth.admin_keys
            if keys:
                header = request.headers.get("Authorization", "")
                token = header[7:].strip() if header.startswith("Bearer ") else ""
                ok = False
                for key in keys:
                    ok |= hmac.compare_digest(token.encode(), key.encode())
                if not ok:
                    return _error(
                        RouterError(401, "a valid admin key is required", type="unauthorized")
                    )
            try:
                return await view(request, *args, **kwargs)
            except RouterError as err:
                return _error(err)

        return wrapper

    return decorate


def _json_body(request: HttpRequest) -> dict[str, Any]:
    if not request.body.strip():
        return {}
    try:
        doc = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise RouterError(400, f"invalid JSON body: {exc}") from exc
    if not isinstance(doc, dict):
        raise RouterError(400, "request body must be a JSON object")
    return doc


@admin_api(("GET",))
async def models_list(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"models": services.model_records(node=get_node())})


@admin_api(("GET",))
async def version(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        {
            "version": settings.ROUTER_VERSION,
            "protocol_version": PROTOCOL_VERSION,
            "minimum_protocol_version": PROTOCOL_VERSION,
        }
    )


@admin_api(("POST",))
async def load(request: HttpRequest) -> HttpResponse:
    doc = _json_body(request)
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise RouterError(400, "model is required", param="model")
    try:
        result = await services.model_load(node=get_node(), model_id=model)
    except BackendError as exc:
        raise RouterError(502, str(exc), type="backend_error") from exc
    return JsonResponse(result)


@admin_api(("POST",))
async def unload(request: HttpRequest) -> HttpResponse:
    doc = _json_body(request)
    model = doc.get("model")
    target = doc.get("target", "all" if not model else None)
    if model is not None and not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    if target is not None and target not in services.UNLOAD_TARGETS:
        raise RouterError(
            400, f"target must be one of {', '.join(services.UNLOAD_TARGETS)}", param="target"
        )
    result = await services.model_unload(node=get_node(), model_id=model or None, target=target)
    return JsonResponse(result)


@admin_api(("GET",), site=True)
async def nodes_state(request: HttpRequest) -> HttpResponse:
    node = get_node()
    wanted = request.GET.get("node_id")
    if wanted and wanted != node.node_id:
        remote = node.cluster.nodes.get(wanted)
        if remote is None:
            raise RouterError(404, f"node {wanted!r} is not known", type="not_found")
        return JsonResponse(await services.remote_node_state(node=node, remote=remote))
    state = services.node_state(node=node)
    state["cluster"] = services.cluster_state(node=node)
    return JsonResponse(state)


@admin_api(("POST",), site=True)
async def nodes_unload(request: HttpRequest) -> HttpResponse:
    fields = services.runtime_unload_parse(_json_body(request))
    return JsonResponse(await services.runtime_unload(node=get_node(), **fields))


@admin_api(("POST",), site=True)
async def model_state(request: HttpRequest) -> HttpResponse:
    doc = _json_body(request)
    node_id = doc.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise RouterError(
            400, "node_id is required: the node that serves the model", param="node_id"
        )
    local_id, enabled = services.model_state_parse(doc)
    snapshot = await services.model_state_set(
        node=get_node(), node_id=node_id, local_id=local_id, enabled=enabled
    )
    return JsonResponse(snapshot)
