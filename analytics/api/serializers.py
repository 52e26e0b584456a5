"""Bodies of the analytics site route."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import PolymorphicProxySerializer
from rest_framework import serializers

from routerproject.api import NodeErrorSerializer, StrictChoiceField, WholeNumberQueryField

MAX_LIMIT = 5000


class AnalyticsQuerySerializer(serializers.Serializer):
    kind = StrictChoiceField(
        ["requests", "loads"],
        required=False,
        default="requests",
        help_text="Which rows.",
        error_messages={"invalid_choice": "must be requests or loads"},
    )
    limit = WholeNumberQueryField(
        min_value=1, max_value=MAX_LIMIT, required=False, default=200, help_text="How many."
    )


class RequestRowSerializer(serializers.Serializer):
    """A row of analytics_requests."""

    id = serializers.IntegerField()
    node_id = serializers.CharField()
    model_id = serializers.CharField(help_text="Local model ID (image ID for images).")
    config_filename = serializers.CharField(required=False)
    lane = serializers.CharField()
    path = serializers.CharField(required=False)
    status = serializers.IntegerField(
        help_text="How the request ended: the HTTP status the client got, 499 when it hung up, "
        "502 for a stream its backend cut off after a 200 head."
    )
    success = serializers.BooleanField()
    borrowed = serializers.BooleanField(required=False)
    stream = serializers.BooleanField(required=False)
    prompt_bytes = serializers.IntegerField(required=False)
    prompt_tokens = serializers.IntegerField(required=False)
    cached_tokens = serializers.IntegerField(
        required=False, help_text="Of prompt_tokens, those the backend's prompt cache reused."
    )
    output_tokens = serializers.IntegerField(required=False)
    image_width = serializers.IntegerField(required=False)
    image_height = serializers.IntegerField(required=False)
    image_steps = serializers.IntegerField(required=False)
    image_count = serializers.IntegerField(required=False)
    duration_ms = serializers.FloatField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField()
    request_id = serializers.CharField(
        allow_null=True, help_text="The X-Request-Id the client got (null in older rows)."
    )
    key_name = serializers.CharField(
        allow_null=True,
        help_text="The stored API key it came with (the owner's for a lent request); null for "
        "config-file keys, keyless nodes and older rows.",
    )


class LoadRowSerializer(serializers.Serializer):
    """A row of analytics_loads."""

    id = serializers.IntegerField()
    node_id = serializers.CharField()
    model_id = serializers.CharField()
    config_filename = serializers.CharField(required=False)
    lane = serializers.CharField()
    reason = serializers.CharField(required=False)
    success = serializers.BooleanField()
    error = serializers.CharField(required=False)
    duration_ms = serializers.FloatField()
    finished_at = serializers.DateTimeField()


class AnalyticsRowsSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(["requests", "loads"])
    records = serializers.ListField(
        child=PolymorphicProxySerializer(
            component_name="AnalyticsRow",
            serializers=[RequestRowSerializer, LoadRowSerializer],
            resource_type_field_name=None,
        ),
        help_text="Newest first.",
    )


class UsageQuerySerializer(serializers.Serializer):
    """The usage query, for the schema (analytics/usage.py parses it, with the same rules on
    the node protocol)."""

    since_ms = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Rows finished at or after this Unix time in ms (default: 30 days before "
        "until_ms).",
    )
    until_ms = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Rows finished at or before this Unix time in ms (default: now).",
    )
    group_by = serializers.CharField(
        required=False,
        default="key",
        help_text="Comma-separated dimensions out of key, model, node, day (UTC).",
    )


class UsageRowSerializer(serializers.Serializer):
    """One group: only the fields grouped by are present, then the measures."""

    key_name = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="The stored API key's name; null for config-file keys and keyless nodes.",
    )
    model = serializers.CharField(
        required=False, help_text="The public model ID of the model that answered."
    )
    node_id = serializers.CharField(required=False, help_text="The node that answered.")
    day = serializers.DateField(required=False, help_text="The UTC day it finished.")
    requests = serializers.IntegerField(
        help_text="Requests answered, each once: one a helper ran counts on the helper."
    )
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    backend_ms = serializers.FloatField(help_text="The backends' own time on them.")
    lent = serializers.IntegerField(
        help_text="Of `requests`, those a helper ran for another node's model (not added to "
        "`requests`)."
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # `errors` is a Serializer attribute, so the field is added here rather than declared.
        fields: dict[str, serializers.Field[Any, Any, Any, Any]] = super().get_fields()
        fields["errors"] = serializers.IntegerField(
            help_text="Of `requests`, those that did not succeed."
        )
        return fields


class UsageSerializer(serializers.Serializer):
    rows = UsageRowSerializer(many=True)
    node_errors = NodeErrorSerializer(
        many=True, help_text="Nodes that did not answer in time: their requests are missing."
    )
