"""Site API for analytics: recent request or load rows of this node."""

from __future__ import annotations

from channels.db import database_sync_to_async
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from analytics.api import serializers as s
from analytics.ports import running_node
from analytics.selectors import analytics_recent
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
