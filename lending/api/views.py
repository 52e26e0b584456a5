"""Site API for lending: routing links, the settings store, the decision log and the summary
(master or standalone).

Saving links or settings takes effect at once: the master runs the new values and pushes them to
every slave. The views are async (adrf) because they read and push the router's in-memory state.
"""

from __future__ import annotations

import base64
import json
import time
from functools import partial
from typing import Any, ClassVar

from channels.db import database_sync_to_async
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework.request import Request
from rest_framework.response import Response

from access.audit import aaudited_write
from lending import links as link_svc
from lending import selectors, services
from lending.api import serializers as s
from lending.decisions import (
    FOLD_SIGNATURE,
    decisions_fold,
    decisions_query,
    merge_folds,
    merge_node_records,
    parse_decision_filters,
)
from lending.gather import gather_remote
from lending.keys import LendingSettingError
from lending.ports import running_node
from lending.propagate import links_publish
from lending.settings_store import overrides_load
from lending.timeline import lane_slots, merge_timelines, timeline_local, timeline_window
from routerproject.api import SiteAPIView, error_response
from routerproject.errors import RouterError

DECISIONS_DEFAULT_LIMIT = 500
DECISIONS_MAX_LIMIT = 5000
FOLDS_DEFAULT_LIMIT = 50
FOLDS_MAX_LIMIT = 500
BAD_REQUEST = error_response("The request is invalid; `param` names the field at fault.")

# -- routing links -----------------------------------------------------------------------------


def _node_errors(errors: dict[str, str]) -> dict[str, Any]:
    if not errors:
        return {}
    return {"node_errors": [{"node_id": k, "error": v} for k, v in sorted(errors.items())]}


def _anchor_parameters(lane: str, *, required: bool) -> list[OpenApiParameter]:
    return [
        OpenApiParameter("node_id", str, required=required, description="The anchor's node."),
        OpenApiParameter(
            "model_id", str, required=required, description=f"The anchor's {lane} model."
        ),
    ]


def _links_schema(lane: str, prefix: str) -> dict[str, Any]:
    """The schema decorators of one lane's three operations."""
    listing = PolymorphicProxySerializer(
        component_name=f"{lane.capitalize()}LinkListing",
        serializers=[s.LinkListSerializer, s.AnchorLinksSerializer],
        resource_type_field_name=None,
    )
    return {
        "get": extend_schema(
            operation_id=f"{prefix}List",
            summary=f"The {lane} links: all of them, or one anchor's with its candidates",
            parameters=_anchor_parameters(lane, required=False),
            responses={
                200: OpenApiResponse(
                    listing,
                    "Without a query every link; with node_id and model_id the anchor's links "
                    "and every model it could be linked with.",
                ),
                400: BAD_REQUEST,
            },
        ),
        "post": extend_schema(
            operation_id=f"{prefix}Set",
            summary=f"Replace the {lane} links of one anchor",
            description="Takes effect at once: the master runs the new set and pushes it to "
            "every slave.",
            request=s.LinkSetSerializer,
            responses={
                200: OpenApiResponse(s.LinkSetResultSerializer, "The anchor's links as saved."),
                400: error_response(
                    "Invalid body, unknown or ineligible model, or different weights without "
                    "acknowledge_different_weights (code different_weights). Nothing is saved."
                ),
            },
        ),
        "delete": extend_schema(
            operation_id=f"{prefix}Delete",
            summary=f"Remove every {lane} link touching one model",
            parameters=_anchor_parameters(lane, required=True),
            responses={
                200: OpenApiResponse(s.LinkDeleteResultSerializer, "How many links were removed."),
                400: BAD_REQUEST,
            },
        ),
    }


def _link_target(lane: str, node_id: str, model_id: str) -> str:
    return f"{lane} {node_id}/{model_id}"


class _LinksView(SiteAPIView):
    lane: ClassVar[link_svc.Lane]

    def _endpoints(self) -> dict[tuple[str, str], link_svc.Endpoint]:
        return link_svc.lane_endpoints(running_node().cluster.records(), self.lane)

    def _links_of(self, node_id: str, model_id: str) -> dict[str, Any]:
        """An anchor's links as its audit rows keep them."""
        return {
            "links": link_svc.links_touching(lane=self.lane, node_id=node_id, model_id=model_id)
        }

    def _anchor_query(self, request: Request) -> tuple[str, str] | None:
        query = s.AnchorQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return query.anchor()

    async def get(self, request: Request) -> Response:
        anchor_ref = self._anchor_query(request)
        if anchor_ref is None:
            return Response({"links": await database_sync_to_async(link_svc.links_all)(self.lane)})
        endpoints = self._endpoints()
        anchor = link_svc.resolve_anchor(endpoints, *anchor_ref, self.lane)
        doc = await database_sync_to_async(link_svc.links_for_anchor)(
            lane=self.lane, anchor=anchor, endpoints=endpoints
        )
        return Response(doc)

    async def post(self, request: Request) -> Response:
        body = s.LinkSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        anchor, specs = link_svc.link_set_resolve(
            lane=self.lane,
            endpoints=self._endpoints(),
            anchor=(data["anchor"]["node_id"], data["anchor"]["model_id"]),
            lends_to=data["lends_to"],
            borrows_from=data["borrows_from"],
        )
        saved = await aaudited_write(
            request,
            # A first save for the anchor creates its links; any later one changes them.
            action=lambda before: "link.update" if before["links"] else "link.create",
            target=_link_target(self.lane, anchor.node_id, anchor.model_id),
            read=partial(self._links_of, anchor.node_id, anchor.model_id),
            write=partial(
                link_svc.links_replace,
                lane=self.lane,
                anchor=anchor,
                specs=specs,
                acknowledged=data["acknowledge_different_weights"],
            ),
        )
        errors = await links_publish(running_node())
        return Response(
            {
                "anchor": {"node_id": anchor.node_id, "model_id": anchor.model_id},
                "links": saved,
                **_node_errors(errors),
            }
        )

    async def delete(self, request: Request) -> Response:
        anchor_ref = self._anchor_query(request)
        if anchor_ref is None:
            raise RouterError(400, "node_id and model_id are required", param="node_id")
        deleted = await aaudited_write(
            request,
            action="link.delete",
            target=_link_target(self.lane, *anchor_ref),
            read=partial(self._links_of, *anchor_ref),
            write=partial(
                link_svc.links_delete,
                lane=self.lane,
                node_id=anchor_ref[0],
                model_id=anchor_ref[1],
            ),
        )
        errors = await links_publish(running_node())
        return Response({"deleted": deleted, **_node_errors(errors)})


_IMAGE_LINKS = _links_schema("image", "imageLinks")
_TEXT_LINKS = _links_schema("text", "textLinks")


class ImageLinksView(_LinksView):
    """Routing links of the image lane (`routing-groups`)."""

    lane = "image"

    @_IMAGE_LINKS["get"]
    async def get(self, request: Request) -> Response:
        return await super().get(request)

    @_IMAGE_LINKS["post"]
    async def post(self, request: Request) -> Response:
        return await super().post(request)

    @_IMAGE_LINKS["delete"]
    async def delete(self, request: Request) -> Response:
        return await super().delete(request)


class TextLinksView(_LinksView):
    """Routing links of the text lane (`text-routing-groups`)."""

    lane = "text"

    @_TEXT_LINKS["get"]
    async def get(self, request: Request) -> Response:
        return await super().get(request)

    @_TEXT_LINKS["post"]
    async def post(self, request: Request) -> Response:
        return await super().post(request)

    @_TEXT_LINKS["delete"]
    async def delete(self, request: Request) -> Response:
        return await super().delete(request)


# -- settings ----------------------------------------------------------------------------------

SETTINGS_ANSWER = OpenApiResponse(s.SettingsSerializer, "Every lending setting.")


class SettingsView(SiteAPIView):
    """The lending settings with their layers: GET them, POST overrides, DELETE [?key=]."""

    @extend_schema(
        operation_id="offloadSettingsGet",
        summary="The lending settings with their layers",
        responses={200: SETTINGS_ANSWER},
    )
    async def get(self, request: Request) -> Response:
        entries = await database_sync_to_async(selectors.settings_entries)()
        return Response(selectors.settings_document(entries))

    @extend_schema(
        operation_id="offloadSettingsSet",
        summary="Store overrides",
        description="Applied at once and pushed to every slave.",
        request=s.SettingsUpdateSerializer,
        responses={
            200: SETTINGS_ANSWER,
            400: error_response("Invalid body, or an unknown key or value (`param` names it)."),
        },
    )
    async def post(self, request: Request) -> Response:
        body = s.SettingsUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            entries = await aaudited_write(
                request,
                action="settings.update",
                target="lending settings",
                read=overrides_load,
                write=partial(
                    services.settings_update,
                    values=body.validated_data["values"],
                    now_ms=int(time.time() * 1000),
                ),
            )
        except LendingSettingError as exc:
            raise RouterError(400, str(exc), param=exc.key) from exc
        await services.settings_changed(entries=entries)
        return Response(selectors.settings_document(entries))

    @extend_schema(
        operation_id="offloadSettingsReset",
        summary="Remove one override, or all",
        parameters=[OpenApiParameter("key", str, description="The setting to reset; default all.")],
        responses={200: SETTINGS_ANSWER, 400: error_response("An unknown key.")},
    )
    async def delete(self, request: Request) -> Response:
        key = request.query_params.get("key", "").strip() or None
        try:
            entries = await aaudited_write(
                request,
                action="settings.reset",
                target=f"lending settings: {key}" if key else "lending settings",
                read=overrides_load,
                write=partial(services.settings_reset, key=key),
            )
        except LendingSettingError as exc:
            raise RouterError(400, str(exc), param=exc.key) from exc
        await services.settings_changed(entries=entries)
        return Response(selectors.settings_document(entries))


# -- decisions ---------------------------------------------------------------------------------


_FILTER_PARAMETERS = [
    OpenApiParameter("lane", str, enum=["image", "text"], description="Only this lane."),
    OpenApiParameter("outcome", str, description="Only this outcome."),
    OpenApiParameter("kind", str, description="Only this kind (plan, dispatch, helper)."),
    OpenApiParameter(
        "model_id", str, description="Only rows whose owner or helper model is this local ID."
    ),
    OpenApiParameter("request_id", str, description="Only rows about this request."),
    OpenApiParameter(
        "node_id",
        str,
        many=True,
        explode=True,
        style="form",
        description="Only these nodes (repeat the parameter); default all.",
    ),
    OpenApiParameter("since_ms", int, description="Only rows recorded at or after this Unix ms."),
    OpenApiParameter("until_ms", int, description="Only rows recorded at or before this Unix ms."),
]


class DecisionsView(SiteAPIView):
    @extend_schema(
        operation_id="offloadDecisionsList",
        summary="Lending decisions of every node",
        description="Repeated `node_id` parameters choose the nodes; each is asked "
        "concurrently, and a node that fails is listed in `node_errors` rather than failing "
        "the whole answer.",
        parameters=[
            *_FILTER_PARAMETERS,
            OpenApiParameter(
                "limit",
                int,
                default=DECISIONS_DEFAULT_LIMIT,
                description=f"At most this many rows (capped at {DECISIONS_MAX_LIMIT}).",
            ),
        ],
        responses={
            200: OpenApiResponse(s.DecisionsSerializer, "Rows, newest first."),
            400: BAD_REQUEST,
        },
    )
    async def get(self, request: Request) -> Response:
        # The node protocol filters with the same rule, so it lives with the decision log.
        filters = parse_decision_filters(
            request.query_params,
            default_limit=DECISIONS_DEFAULT_LIMIT,
            max_limit=DECISIONS_MAX_LIMIT,
        )
        node = running_node()
        wanted = set(request.query_params.getlist("node_id")) or None
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
        return Response(body)


class DecisionFoldsView(SiteAPIView):
    @extend_schema(
        operation_id="offloadDecisionFoldsList",
        summary="The decision log folded: one line per repeated decision, a page at a time",
        description="Rows with the same node, kind, lane, owner, helper, outcome and reason fold "
        "into one, with the count, time span, triggers and each measure's range, whatever the "
        "numbers. Each node folds its own rows in its database; a node that fails is listed in "
        "`node_errors`.",
        parameters=[
            *_FILTER_PARAMETERS,
            OpenApiParameter(
                "cursor",
                str,
                description="Start after the fold this names: the `next_cursor` of the page "
                "before (keyset paging: lines that turned up on top since then shift nothing).",
            ),
            OpenApiParameter(
                "offset",
                int,
                default=0,
                description="Skip this many folds (counted after `cursor`, when given).",
            ),
            OpenApiParameter(
                "limit",
                int,
                default=FOLDS_DEFAULT_LIMIT,
                description=f"At most this many folds (capped at {FOLDS_MAX_LIMIT}).",
            ),
        ],
        responses={
            200: OpenApiResponse(s.DecisionFoldsSerializer, "One page of folds."),
            400: BAD_REQUEST,
        },
    )
    async def get(self, request: Request) -> Response:
        filters = parse_decision_filters(
            request.query_params, default_limit=FOLDS_DEFAULT_LIMIT, max_limit=FOLDS_MAX_LIMIT
        )
        limit = filters.pop("limit")
        offset = _offset(request.query_params.get("offset", ""))
        after = _fold_place(request.query_params.get("cursor", ""))
        node = running_node()
        wanted = set(request.query_params.getlist("node_id")) or None
        per_node: dict[str, dict[str, Any]] = {}
        if wanted is None or node.node_id in wanted:
            await node.decisions.flush()
            per_node[node.node_id] = await database_sync_to_async(decisions_fold)(**filters)
        params = {k: str(v) for k, v in filters.items() if v is not None}
        remote_ids = None if wanted is None else wanted - {node.node_id}
        answers, errors = await gather_remote(
            node, "/router/v1/node/offload/decisions/folded", params=params, node_ids=remote_ids
        )
        for node_id, doc in answers.items():
            if isinstance(doc, dict):
                per_node[node_id] = doc
        body = merge_folds(per_node, offset=offset, limit=limit, after=after)
        if errors:
            body["node_errors"] = errors
        return Response(body)


def _fold_place(raw: str) -> tuple[Any, ...] | None:
    """The place in the folds' order a cursor (`fold_cursor`) names; None for no cursor, and
    a cursor we did not write is a 400."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        place = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, TypeError):
        place = None
    if (
        not isinstance(place, list)
        or len(place) != 1 + len(FOLD_SIGNATURE)
        or type(place[0]) is not int
        or not all(isinstance(v, str) for v in place[1:])
    ):
        raise RouterError(400, "cursor is not one this API wrote", param="cursor")
    return (-place[0], *place[1:])


def _offset(raw: str) -> int:
    raw = raw.strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise RouterError(400, "offset must be a whole number of at least 0", param="offset")
    return int(raw)


class TimelineView(SiteAPIView):
    @extend_schema(
        operation_id="offloadTimelineGet",
        summary="Lending over time: per node own, borrowed and idle time and lent requests; "
        "per owner its held depth and lent count",
        description="Sixty buckets over the last `minutes`; every node answers from its own "
        "database and a node that fails is listed in `node_errors`.",
        parameters=[
            OpenApiParameter(
                "minutes", int, default=15, description="The window, 1 to 1440 minutes."
            )
        ],
        responses={200: OpenApiResponse(s.TimelineSerializer, "The series."), 400: BAD_REQUEST},
    )
    async def get(self, request: Request) -> Response:
        query = {"minutes": str(request.query_params.get("minutes", ""))}
        since, until, step = timeline_window(query, now_ms=int(time.time() * 1000))
        node = running_node()
        await node.decisions.flush()
        answers: dict[str, dict[str, Any]] = {
            node.node_id: await database_sync_to_async(timeline_local)(
                node_id=node.node_id,
                since_ms=since,
                until_ms=until,
                step_ms=step,
                slots=lane_slots(node.catalog.configs.values()),
            )
        }
        params = {"since_ms": str(since), "until_ms": str(until), "step_ms": str(step)}
        remote, errors = await gather_remote(
            node, "/router/v1/node/offload/timeline", params=params
        )
        answers.update({k: v for k, v in remote.items() if isinstance(v, dict)})
        body = merge_timelines(answers, since_ms=since, until_ms=until, step_ms=step)
        if errors:
            body["node_errors"] = errors
        return Response(body)


# -- summary -----------------------------------------------------------------------------------


def _leases(node: Any) -> list[dict[str, Any]]:
    if node.role != "master":
        return []
    from lending.master import get_master

    leases: list[dict[str, Any]] = get_master(node).live_leases()
    return leases


class SummaryView(SiteAPIView):
    @extend_schema(
        operation_id="offloadSummaryGet",
        summary="Each node's build, settings fingerprint and held requests; the live leases",
        responses={200: OpenApiResponse(s.OffloadSummarySerializer, "The summary.")},
    )
    async def get(self, request: Request) -> Response:
        node = running_node()
        answers, errors = await gather_remote(node, "/router/v1/node/offload/summary")
        nodes: list[dict[str, Any]] = [selectors.lending_summary(node=node)]
        nodes.extend(answers[nid] for nid in sorted(answers) if isinstance(answers[nid], dict))
        doc: dict[str, Any] = {
            "master_fingerprint": node.lending.fingerprint,
            "nodes": nodes,
            "leases": _leases(node),
        }
        if errors:
            doc["node_errors"] = errors
        return Response(doc)
