"""`GET /router/v1/site/audit`: the audit log of the whole cluster, newest first.

It lives with lending, not with the audit log (`access`), only because it asks every node as the
decision log does, through lending's `gather_remote`; `access` sits below the registry and its
node client. Each node keeps its own rows: the master's are every write made through the site
API and the admin there, a slave's are what the master pushed to it (actor `master`) and writes
made on that node directly (`/router/v1/load`, its admin). A node that fails is listed in
`node_errors` and the others still answer.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from access.api.audit import (
    AUDIT_DEFAULT_LIMIT,
    AUDIT_MAX_LIMIT,
    AuditPageSerializer,
    audit_query_params,
    audit_query_parse,
)
from access.audit import audit_query, merge_rows, row_cursor
from lending.gather import gather_remote
from lending.ports import running_node
from routerproject.api import SiteAPIView, error_response


class AuditView(SiteAPIView):
    @extend_schema(
        operation_id="auditList",
        summary="Who changed what: one row per management write, every node's, newest first",
        description="Links, lending settings, guardians, load and unload, disable and enable, "
        "recipes, asset binds and substitutions, API keys, and writes through the Django admin. "
        "`before` and `after` are the thing's state around the write, without any field named "
        "like a secret. Page with `before`: pass the answer's `next_before` to get the next, "
        "older page, with the same filters; `next_before` is null on the last page.",
        parameters=[
            OpenApiParameter("since_ms", int, description="Only rows at or after this Unix ms."),
            OpenApiParameter("actor", str, description="Only this actor (exact)."),
            OpenApiParameter(
                "action", str, description="Only this action (exact), e.g. link.create."
            ),
            OpenApiParameter(
                "limit",
                int,
                default=AUDIT_DEFAULT_LIMIT,
                description=f"At most this many rows, 1 to {AUDIT_MAX_LIMIT}.",
            ),
            OpenApiParameter(
                "before", str, description="The `next_before` of the previous page: older rows."
            ),
        ],
        responses={
            200: OpenApiResponse(AuditPageSerializer, "One page of rows."),
            400: error_response("A malformed parameter; `param` names it."),
        },
    )
    async def get(self, request: Request) -> Response:
        filters = audit_query_parse(request.query_params)
        node = running_node()
        per_node: dict[str, list[dict[str, Any]]] = {
            node.node_id: await database_sync_to_async(audit_query)(**filters)
        }
        answers, errors = await gather_remote(
            node, "/router/v1/node/audit", params=audit_query_params(filters)
        )
        for node_id, doc in answers.items():
            rows = doc.get("rows") if isinstance(doc, dict) else None
            if isinstance(rows, list):
                per_node[node_id] = [r for r in rows if isinstance(r, dict)]
        rows = merge_rows(per_node, limit=filters["limit"])
        # A full page may have more behind it; a short one is the last.
        more = len(rows) == filters["limit"]
        body: dict[str, Any] = {
            "rows": rows,
            "next_before": row_cursor(rows[-1]).text() if more and rows else None,
        }
        if errors:
            body["node_errors"] = errors
        return Response(body)
