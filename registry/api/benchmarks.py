"""`/router/v1/benchmarks[/run]`: calibrate a node's models (the Nodes page's Benchmark button
and `manage.py benchmark_models` both start it here)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from access.audit import aaudit_request
from registry.api import serializers as s
from registry.benchmarks import benchmark_start, benchmark_status
from registry.ports import running_node
from routerproject.api import RouterAPIView, error_response

STATUS_ERRORS = {
    404: error_response("The node is not known."),
    502: error_response("The node did not answer."),
}
RUN_ERRORS = {
    400: error_response("The request is invalid; `param` names the field at fault."),
    404: error_response("The node is not known, or the model is not a config on it."),
    409: error_response(
        "A calibration is already running on that node (code benchmark_running), or the model "
        "is disabled (code model_disabled)."
    ),
    502: error_response("The node did not answer."),
}


class BenchmarksView(RouterAPIView):
    @extend_schema(
        operation_id="benchmarksGet",
        summary="A node's model calibrations: the one running and the last result of each model",
        parameters=[
            OpenApiParameter("node_id", str, description="Another node to ask; default this node.")
        ],
        responses={
            200: OpenApiResponse(s.BenchmarkStatusSerializer, "The calibrations."),
            **STATUS_ERRORS,
        },
    )
    async def get(self, request: Request) -> Response:
        node_id = request.query_params.get("node_id") or None
        return Response(await benchmark_status(node=running_node(), node_id=node_id))


class BenchmarkRunView(RouterAPIView):
    @extend_schema(
        operation_id="benchmarksStart",
        summary="Calibrate a node's models in the background",
        description="On the node that holds them, each model is unloaded and sent requests of "
        "varying prompt and output sizes (image models: sizes and steps), at least "
        "`scheduling_min_samples` of them, the first of which loads it again. They are recorded "
        "as the node's own measured requests, so the model gets its cost fit, and the requests, "
        "their measured times, the load and the fit are kept in "
        "`<store_dir>/benchmarks/<model>-<UTC time>.json` on that node. One calibration runs "
        "at a time per node.",
        request=s.BenchmarkSerializer,
        responses={
            202: OpenApiResponse(s.BenchmarkStatusSerializer, "Started; the node's status."),
            **RUN_ERRORS,
        },
    )
    async def post(self, request: Request) -> Response:
        body = s.BenchmarkSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        node = running_node()
        node_id = data.get("node_id") or node.node_id
        models = data.get("models")
        status = await benchmark_start(node=node, node_id=node_id, models=models)
        target = f"{node_id}/{','.join(models) if models else '*'}"
        after = {"current": status.get("current"), "pending": status.get("pending", [])}
        await aaudit_request(request, "model.benchmark", target, None, after)
        return Response(status, status=202)
