"""Site API for analytics: recent request or load rows of this node, and the cluster's usage."""

from __future__ import annotations

import time

from channels.db import database_sync_to_async
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from analytics.api import serializers as s
from analytics.ports import running_node
from analytics.selectors import analytics_recent
from analytics.usage import parse_usage_query, usage_site
from routerproject.api import SiteAPIView, error_response


class AnalyticsView(SiteAPIView):
    @extend_schema(
        operation_id="analyticsList",
        summary="Recent request or load rows of this node",
        description="Newest first; rows still buffered in the recorder are written first.",
        parameters=[s.AnalyticsQuerySerializer],
        responses={
            200: OpenApiResponse(s.AnalyticsRowsSerializer, "Rows, newest first."),
            400: error_response("The request is invalid; `param` names the field at fault."),
        },
    )
    async def get(self, request: Request) -> Response:
        query = s.AnalyticsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        kind, limit = query.validated_data["kind"], query.validated_data["limit"]
        await running_node().recorder.flush()
        rows = await database_sync_to_async(analytics_recent)(kind=kind, limit=limit)
        return Response({"kind": kind, "records": rows})


class UsageView(SiteAPIView):
    @extend_schema(
        operation_id="usageList",
        summary="Requests, errors, tokens, backend time and lent requests over the cluster, "
        "grouped by key, model, node and day",
        description="Every node sums its own rows in the range and the master merges them; "
        "nodes are asked concurrently with one deadline, and one that does not answer is "
        "listed in `node_errors`. A request counts once, on the node that answered it.",
        parameters=[s.UsageQuerySerializer],
        responses={
            200: OpenApiResponse(s.UsageSerializer, "One row per group."),
            400: error_response("The request is invalid; `param` names the field at fault."),
        },
    )
    async def get(self, request: Request) -> Response:
        query = parse_usage_query(request.query_params, now_ms=int(time.time() * 1000))
        return Response(await usage_site(running_node(), query))
