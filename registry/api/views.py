"""Management API for the node's models: list, load, unload, state, inventory.

These views are async (adrf) because they act on the router process's in-memory runtimes, which
live on the event loop; Django runs async views on that same loop under ASGI.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from access.audit import aaudit_request
from registry import services
from registry.api import serializers as s
from registry.inventory import include_files_parse, inventory_site
from registry.ports import RegistryNode, running_node
from routerproject.api import RouterAPIView, SiteAPIView, error_response
from routerproject.errors import BackendError, RouterError, echo

PROTOCOL_VERSION = 2

MODEL_ERRORS = {
    400: error_response("The request is invalid; `param` names the field at fault."),
    404: error_response("The model is not known (code model_not_found)."),
    502: error_response("The backend or the owning node failed."),
    503: error_response("The owning node is not healthy (code node_unavailable)."),
}
NODE_ERRORS = {
    404: error_response("The node is not known, or this node is a slave."),
    502: error_response("The node did not answer."),
}


def _loaded(node: RegistryNode, model_id: str) -> dict[str, Any]:
    """What the cluster view says of a model's load, for the audit row's `before`."""
    replicas = node.cluster.by_public_id.get(model_id) or node.cluster.by_public_image_id.get(
        model_id, []
    )
    return {"loaded_on": sorted(r.node_id for r in replicas if r.record.get("loaded"))}


def _enabled(node: RegistryNode, node_id: str, local_id: str) -> dict[str, Any]:
    if node_id == node.node_id:
        return {"enabled": local_id not in node.disabled}
    remote = node.cluster.nodes.get(node_id)
    records = remote.records if remote is not None else []
    found = [not rec.get("disabled") for rec in records if rec.get("local_id") == local_id]
    return {"enabled": found[0] if found else None}


class ModelsView(RouterAPIView):
    @extend_schema(
        operation_id="modelsList",
        summary="Every model record of the cluster view",
        description="A slave or standalone node lists its own models.",
        responses={200: OpenApiResponse(s.ModelListSerializer, "The records.")},
    )
    async def get(self, request: Request) -> Response:
        return Response({"models": services.model_records(node=running_node())})


class VersionView(RouterAPIView):
    @extend_schema(
        operation_id="versionGet",
        summary="Build and cluster protocol versions",
        responses={200: OpenApiResponse(s.VersionSerializer, "The versions.")},
    )
    async def get(self, request: Request) -> Response:
        return Response(
            {
                "version": settings.ROUTER_VERSION,
                "protocol_version": PROTOCOL_VERSION,
                "minimum_protocol_version": PROTOCOL_VERSION,
            }
        )


class LoadView(RouterAPIView):
    @extend_schema(
        operation_id="modelLoad",
        summary="Load a model on the node that owns it",
        request=s.LoadSerializer,
        responses={
            200: OpenApiResponse(s.LoadResultSerializer, "The model is loaded."),
            **MODEL_ERRORS,
        },
    )
    async def post(self, request: Request) -> Response:
        body = s.LoadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node, model = running_node(), body.validated_data["model"]
        before = _loaded(node, model)
        try:
            result = await services.model_load(node=node, model_id=model)
        except BackendError as exc:
            raise RouterError(502, str(exc), type="backend_error") from exc
        await aaudit_request(request, "model.load", model, before, result)
        return Response(result)


class UnloadView(RouterAPIView):
    @extend_schema(
        operation_id="modelUnload",
        summary="Unload a model, or empty this node's runtimes",
        request=s.UnloadSerializer,
        responses={
            200: OpenApiResponse(s.UnloadResultSerializer, "What was unloaded."),
            **MODEL_ERRORS,
        },
    )
    async def post(self, request: Request) -> Response:
        body = s.UnloadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        model = body.validated_data.get("model")
        target = body.validated_data.get("target", "all" if not model else None)
        node = running_node()
        before = _loaded(node, model) if model else None
        result = await services.model_unload(node=node, model_id=model or None, target=target)
        what = model or f"{node.node_id} ({target})"
        await aaudit_request(request, "model.unload", what, before, result)
        return Response(result)


class NodesStateView(SiteAPIView):
    @extend_schema(
        operation_id="nodesState",
        summary="Backends, loaded models, active and held requests of a node",
        parameters=[
            OpenApiParameter("node_id", str, description="Another node to ask; default this node."),
            OpenApiParameter(
                "nodes",
                str,
                enum=["all"],
                description="`all`: also every other node's state (`node_states`, asked in "
                "parallel; those that fail are in `node_errors`). Without `node_id` only.",
            ),
        ],
        responses={200: OpenApiResponse(s.NodeStateSerializer, "The node's state."), **NODE_ERRORS},
    )
    async def get(self, request: Request) -> Response:
        node = running_node()
        wanted = request.query_params.get("node_id")
        every = request.query_params.get("nodes")
        if every is not None and every != "all":
            raise RouterError(
                400,
                f"nodes must be 'all', not {echo(every)!r}",
                type="invalid_request_error",
                param="nodes",
            )
        if wanted and wanted != node.node_id:
            remote = node.cluster.nodes.get(wanted)
            if remote is None:
                raise RouterError(404, f"node {wanted!r} is not known", type="not_found")
            return Response(await services.remote_node_state(node=node, remote=remote))
        state: dict[str, Any] = services.node_state(node=node)
        state["cluster"] = services.cluster_state(node=node)
        if every == "all":
            state["node_states"], errors = await services.remote_node_states(node=node)
            if errors:
                state["node_errors"] = errors
        return Response(state)


class NodesUnloadView(SiteAPIView):
    @extend_schema(
        operation_id="nodesUnload",
        summary="Unload one runtime of a node if it still holds the load the caller saw",
        description="Waits for the requests on that runtime to finish, borrowed "
        "(lent-to-this-node) ones included, then stops it. The generation is checked again "
        "after that wait, so a model switched in meanwhile is not unloaded. Another node's "
        "runtime is unloaded by that node, through the master.",
        request=s.RuntimeUnloadSerializer,
        responses={
            200: OpenApiResponse(
                s.NodeStateSerializer,
                "The runtime is unloaded; the answer is that node's fresh state (without "
                "`cluster`).",
            ),
            400: error_response(
                "A missing or mistyped field, or a backend or runtime the node does not have; "
                "`param` names the field."
            ),
            **NODE_ERRORS,
            409: error_response(
                "The runtime holds another load now, or nothing (code stale_generation): the "
                "message says what is loaded; nothing changed."
            ),
        },
    )
    async def post(self, request: Request) -> Response:
        body = s.RuntimeUnloadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        state = await services.runtime_unload(node=running_node(), **data)
        target = f"{data['node_id']}/{data['backend_id']}/{data['runtime_id']}"
        before = {"generation": data["expected_generation"], "loaded": True}
        await aaudit_request(request, "model.unload", target, before, {"loaded": False})
        return Response(state)


class ModelStateView(SiteAPIView):
    @extend_schema(
        operation_id="modelStateSet",
        summary="Enable or disable a model on one node",
        description="Kept in that node's own database, so it survives restarts. A disabled "
        "model that is loaded stays loaded until it is unloaded or replaced; new requests for "
        "it get 404 at once, on the master too.",
        request=s.ModelStateSerializer,
        responses={
            200: OpenApiResponse(s.NodeSnapshotSerializer, "The node's snapshot after the change."),
            400: error_response("A field is missing or of the wrong type (`param` names it)."),
            404: error_response(
                "The node is not known, the model is not a config on it (code model_not_found), "
                "or this node is a slave."
            ),
            502: error_response("The node did not answer."),
        },
    )
    async def post(self, request: Request) -> Response:
        body = s.ModelStateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data, node = body.validated_data, running_node()
        before = _enabled(node, data["node_id"], data["local_id"])
        snapshot = await services.model_state_set(node=node, **data)
        action = "model.enable" if data["enabled"] else "model.disable"
        target = f"{data['node_id']}/{data['local_id']}"
        await aaudit_request(request, action, target, before, {"enabled": data["enabled"]})
        return Response(snapshot)


class InventoryView(SiteAPIView):
    @extend_schema(
        operation_id="siteInventory",
        summary="Every node with its hardware, models and (on request) model files",
        description="The master asks every healthy node at once; a node that fails has "
        "`available: false` and `error` set, and the rest still answers. Memory is VRAM when "
        "nvidia-smi answers, else RAM (Linux), else null with a note.",
        parameters=[
            OpenApiParameter(
                "include_files",
                str,
                enum=["true", "false", "1", "0"],
                default="false",
                description="List the files below each node's models.file_roots (capped); "
                "without it no file is looked at.",
            )
        ],
        responses={
            200: OpenApiResponse(s.InventorySerializer, "The inventory."),
            400: error_response("The request is invalid; `param` names the field at fault."),
        },
    )
    async def get(self, request: Request) -> Response:
        # The node protocol reads the same parameter, so its rule lives with the inventory.
        include_files = include_files_parse(request.query_params.get("include_files"))
        return Response(await inventory_site(node=running_node(), include_files=include_files))
