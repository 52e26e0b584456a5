"""The audit log's query (`GET /router/v1/site/audit` and the node route that answers it for the
master) and the shapes of its answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from access.audit import ACTION_MAX_CHARS, ACTOR_MAX_CHARS, Cursor
from routerproject.api import (
    NodeErrorSerializer,
    StrictCharField,
    WholeNumberQueryField,
    validated,
)
from routerproject.errors import RouterError

AUDIT_DEFAULT_LIMIT = 100
AUDIT_MAX_LIMIT = 1000
SINCE_MS_MAX = 10**15
QUERY_FIELDS = ("since_ms", "actor", "action", "limit", "before")


class AuditQuerySerializer(serializers.Serializer):
    since_ms = WholeNumberQueryField(min_value=0, max_value=SINCE_MS_MAX, required=False)
    actor = StrictCharField(max_length=ACTOR_MAX_CHARS, required=False, allow_blank=True)
    action = StrictCharField(max_length=ACTION_MAX_CHARS, required=False, allow_blank=True)
    limit = WholeNumberQueryField(min_value=1, max_value=AUDIT_MAX_LIMIT, required=False)
    before = StrictCharField(max_length=300, required=False, allow_blank=True)


def audit_query_parse(params: Mapping[str, Any]) -> dict[str, Any]:
    """The filters of an audit query string, or a RouterError 400 naming the parameter."""
    data = validated(AuditQuerySerializer(data={k: params[k] for k in QUERY_FIELDS if k in params}))
    cursor = None
    if data.get("before"):
        cursor = Cursor.parse(data["before"])
        if cursor is None:
            raise RouterError(
                400, "before must be a `next_before` value from an earlier page", param="before"
            )
    return {
        "since_ms": data.get("since_ms"),
        "actor": data.get("actor") or None,
        "action": data.get("action") or None,
        "before": cursor,
        "limit": data.get("limit", AUDIT_DEFAULT_LIMIT),
    }


def audit_query_params(filters: Mapping[str, Any]) -> dict[str, str]:
    """`filters` as the query string the node route reads (for the master's fan-out)."""
    params = {k: str(v) for k, v in filters.items() if v is not None and k != "before"}
    if filters.get("before") is not None:
        params["before"] = filters["before"].text()
    return params


class AuditRowSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The row's ID on its node (with node_id, unique).")
    at_ms = serializers.IntegerField(help_text="When the write was made (Unix ms).")
    actor = serializers.CharField(
        help_text="A stored key's name, the admin user, `config key`, or `master` for what the "
        "master pushed to a slave."
    )
    action = serializers.CharField(help_text="Dotted: link.create, settings.update, model.load, …")
    target = serializers.CharField(help_text="What was written (a link's anchor, a model, …).")
    before = serializers.JSONField(
        allow_null=True, help_text="Its state before; fields named like a secret are never kept."
    )
    after = serializers.JSONField(allow_null=True, help_text="Its state after.")
    node_id = serializers.CharField(help_text="The node whose table holds the row.")
    request_id = serializers.CharField(help_text="The X-Request-Id of the write, if any.")

    class Meta:
        ref_name = "AuditRow"


class AuditPageSerializer(serializers.Serializer):
    rows = AuditRowSerializer(many=True, help_text="Newest first.")
    next_before = serializers.CharField(
        allow_null=True,
        help_text="Pass as `before` for the next (older) page; null on the last page.",
    )
    node_errors = NodeErrorSerializer(many=True, required=False)

    class Meta:
        ref_name = "AuditPage"
