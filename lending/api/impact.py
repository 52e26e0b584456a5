"""`GET /router/v1/site/offload/impact`: what lending saved, against the same traffic replayed
without its links (lending/impact.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from channels.db import database_sync_to_async
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from lending.api import serializers as s
from lending.gather import gather_remote
from lending.impact import (
    impact_compute,
    impact_minutes,
    impact_rows,
    impact_window,
    merge_rows,
    plain_summary,
)
from lending.ports import running_node
from lending.settings_store import EffectiveSettings
from lending.whatif import replay_settings
from routerproject.api import SiteAPIView, error_response

BAD_REQUEST = error_response("The request is invalid; `param` names the field at fault.")
# The replays run in a worker thread; past this, owners not yet replayed are listed, not waited on.
REPLAY_BUDGET_SECS = 5.0
# A quiet gap this long ends a burst (as `lending_replay --gap`).
BURST_GAP_SECS = 2.0


class ImpactView(SiteAPIView):
    @extend_schema(
        operation_id="offloadImpactGet",
        summary="What lending saved: measured waiting and makespans against the same traffic "
        "replayed without links",
        description="Every node hands over its rows for the window; the master replays each "
        "owner model that lent through the real planner with its links removed.",
        parameters=[
            OpenApiParameter(
                "minutes", int, default=60, description="The last N minutes, 1 to 1440."
            ),
            OpenApiParameter(
                "since_ms", int, description="Or an explicit window (with `until_ms`), Unix ms."
            ),
            OpenApiParameter("until_ms", int, description="The window's end, Unix ms."),
        ],
        responses={200: OpenApiResponse(s.ImpactSerializer, "The impact."), 400: BAD_REQUEST},
    )
    async def get(self, request: Request) -> Response:
        query = {k: str(v) for k, v in request.query_params.items()}
        recent = "since_ms" not in query and "until_ms" not in query
        if recent:
            minutes = impact_minutes(query)
            until = time.time()
            since = until - minutes * 60
        else:
            since, until = impact_window(query)
            minutes = max(1, round((until - since) / 60))
        node = running_node()
        settings = node.lending.settings
        fit_since = since - settings.sample_window_secs
        await node.decisions.flush()
        local = await database_sync_to_async(impact_rows)(
            since_s=since, until_s=until, fit_since_s=fit_since
        )
        params = {
            "since_ms": str(int(since * 1000)),
            "until_ms": str(int(until * 1000)),
            "fit_since_ms": str(int(fit_since * 1000)),
        }
        remote, errors = await gather_remote(
            node, "/router/v1/node/offload/impact-rows", params=params
        )
        answers: dict[str, Any] = {node.node_id: local}
        answers.update({k: v for k, v in remote.items() if isinstance(v, dict)})
        body = await asyncio.to_thread(_compute, list(answers.values()), settings, (since, until))
        body.update(
            minutes=minutes,
            since_ms=int(since * 1000),
            until_ms=int(until * 1000),
            summary=plain_summary(body["totals"], minutes, recent=recent),
            truncated_nodes=sorted(k for k, v in answers.items() if v.get("truncated")),
        )
        if errors:
            body["node_errors"] = errors
        return Response(body)


def _compute(
    answers: list[dict[str, Any]], settings: EffectiveSettings, window: tuple[float, float]
) -> dict[str, Any]:
    return impact_compute(
        merge_rows(answers),
        settings,
        replay_settings(settings),
        window=window,
        gap_secs=BURST_GAP_SECS,
        budget_secs=REPLAY_BUDGET_SECS,
    )
