"""Bodies of the analytics site route."""

from __future__ import annotations

from drf_spectacular.utils import PolymorphicProxySerializer
from rest_framework import serializers

from routerproject.api import StrictChoiceField, WholeNumberQueryField

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
