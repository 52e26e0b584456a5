"""Bodies of the guardians site route."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from guardians.store import SCOPES
from routerproject.api import (
    BodySerializer,
    NodeErrorSerializer,
    StrictCharField,
    StrictChoiceField,
    StrictDictField,
)

GUARDIAN = "Public ID of a multimodal text model."


def _guardian_setting(**kwargs: Any) -> StrictCharField:
    return StrictCharField(
        allow_null=True,
        help_text=GUARDIAN + " null clears the entry.",
        error_messages=dict.fromkeys(("blank", "invalid"), "must be a model ID or null"),
        **kwargs,
    )


class GuardiansUpdateSerializer(BodySerializer):
    """Any of the three scopes (at least one); entries not named stay as they are. Validated
    whole: a bad entry, or a field that is none of the three, changes nothing."""

    cluster = _guardian_setting(required=False)
    nodes = StrictDictField(
        child=_guardian_setting(), required=False, help_text="Node ID → guardian."
    )
    models = StrictDictField(
        child=_guardian_setting(), required=False, help_text="Text model's public ID → guardian."
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: "is not a field of this body"})
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError({"cluster": "(or nodes, or models) is required"})
        return attrs


class GuardianClearQuerySerializer(serializers.Serializer):
    scope = StrictChoiceField(
        SCOPES,
        help_text="Which.",
        error_messages={
            "required": "must be cluster, node or model",
            "invalid_choice": "must be cluster, node or model",
        },
    )
    key = StrictCharField(
        required=False,
        allow_blank=True,
        help_text="The node ID or public model ID (node and model).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        scope = attrs["scope"]
        if scope != "cluster" and not attrs.get("key"):
            raise serializers.ValidationError({"key": f"is required for the {scope} scope"})
        return attrs


class GuardiansSerializer(serializers.Serializer):
    cluster = serializers.CharField(
        allow_null=True, help_text="The cluster-wide guardian. " + GUARDIAN
    )
    nodes = serializers.DictField(
        child=serializers.CharField(help_text=GUARDIAN), help_text="Node ID → guardian."
    )
    models = serializers.DictField(
        child=serializers.CharField(help_text=GUARDIAN), help_text="Public model ID → guardian."
    )
    effective = serializers.DictField(
        child=serializers.CharField(help_text=GUARDIAN),
        help_text="Text model's public ID → the guardian that answers its image requests "
        "(model, then node, then cluster scope).",
    )
    candidates = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="The models that may be set as a guardian.",
    )
    node_errors = NodeErrorSerializer(
        many=True, required=False, help_text="Slaves the change could not be pushed to."
    )
