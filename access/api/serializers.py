"""Bodies and answers of the stored-key site routes (contract §8)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from access.keys import ROLES
from routerproject.api import (
    BodySerializer,
    NodeErrorSerializer,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
    StrictListField,
)

NAME_MAX_CHARS = 64
MODELS_MAX = 1000


class StrictPositiveNumberField(serializers.FloatField):
    """A JSON number above zero (`true` and "1" are not numbers)."""

    default_error_messages = {
        "required": "is required",
        "null": "must be a number above 0",
        "invalid": "must be a number above 0",
    }

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float) or not data > 0:
            self.fail("invalid")
        return float(data)


@extend_schema_field(OpenApiTypes.DATETIME)
class FutureTimeField(serializers.Field):
    """An RFC 3339 time with its offset, later than now."""

    default_error_messages = {
        "required": "is required",
        "invalid": "must be an RFC 3339 time with an offset, or null",
        "past": "must be in the future",
    }

    def to_internal_value(self, data: Any) -> datetime:
        parsed = parse_datetime(data) if isinstance(data, str) else None
        if parsed is None or parsed.tzinfo is None:
            self.fail("invalid")
        assert parsed is not None
        if parsed <= timezone.now():
            self.fail("past")
        return parsed

    def to_representation(self, value: Any) -> Any:
        return value


def _limit(what: str) -> StrictIntegerField:
    return StrictIntegerField(
        min_value=1,
        allow_null=True,
        required=False,
        help_text=f"{what}; null = no limit.",
        error_messages={"min_value": "must be at least 1, or null for no limit"},
    )


class _KeyFields(BodySerializer):
    """The fields of a key a client sets; any other field is refused (nothing is stored)."""

    name = StrictCharField(
        max_length=NAME_MAX_CHARS,
        help_text="Unique name; usage and the audit log show it.",
        error_messages={"max_length": f"must be at most {NAME_MAX_CHARS} characters"},
    )
    role = StrictChoiceField(
        ROLES,
        required=False,
        help_text="`inference` opens the client paths; `admin` the management API too.",
    )
    models = StrictListField(
        child=StrictCharField(),
        allow_null=True,
        required=False,
        max_length=MODELS_MAX,
        help_text="Public model IDs the key may ask for; null = every model.",
    )
    rpm = _limit("Requests per minute")
    tpm = _limit("Tokens (prompt + completion) per minute")
    max_concurrent = _limit("Requests in flight at once")
    share = StrictPositiveNumberField(
        required=False, help_text="Weight of the key in fair sharing (default 1)."
    )
    expires_at = FutureTimeField(
        allow_null=True,
        required=False,
        help_text="RFC 3339 time after which the key stops working; null = never.",
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: "is not a field of this body"})
        return super().to_internal_value(data)


class ApiKeyCreateSerializer(_KeyFields):
    """A new key: `name` is required, every other field has its default."""


class ApiKeyUpdateSerializer(_KeyFields):
    """The fields to change (at least one); the secret never changes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["name"].required = False

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError({"name": "(or another field of a key) is required"})
        return attrs


class ApiKeySerializer(serializers.Serializer):
    """A stored key as listed: never its secret or hash."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    key_prefix = serializers.CharField(
        help_text="The secret's first characters, to tell keys apart."
    )
    role = serializers.ChoiceField(choices=list(ROLES))
    models = serializers.ListField(child=serializers.CharField(), allow_null=True)
    rpm = serializers.IntegerField(allow_null=True)
    tpm = serializers.IntegerField(allow_null=True)
    max_concurrent = serializers.IntegerField(allow_null=True)
    share = serializers.FloatField()
    expires_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)
    active = serializers.BooleanField(help_text="Neither revoked nor expired.")
    node_errors = NodeErrorSerializer(
        many=True, required=False, help_text="Slaves the change could not be pushed to yet."
    )

    class Meta:
        ref_name = "ApiKey"


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(
        help_text="The secret (`rk-…`): shown in this answer only, stored hashed."
    )

    class Meta:
        ref_name = "ApiKeyCreated"


class ApiKeyListSerializer(serializers.Serializer):
    keys = ApiKeySerializer(many=True)

    class Meta:
        ref_name = "ApiKeyList"
