"""Bodies of lending's site routes: links, settings, decisions and the summary."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from lending.decisions import FLOAT_FIELDS, INT_FIELDS, TEXT_FIELDS
from registry.api.serializers import HeldRequestSerializer
from routerproject.api import (
    BodySerializer,
    NodeErrorSerializer,
    StrictBooleanField,
    StrictCharField,
    StrictDictField,
    StrictListField,
)

ENDPOINT_SHAPE = "must be an object with node_id and model_id"

# -- links -------------------------------------------------------------------------------------


def _endpoint_part() -> StrictCharField:
    messages = dict.fromkeys(("required", "null", "blank", "invalid"), "is required")
    return StrictCharField(error_messages=messages)


class EndpointSerializer(BodySerializer):
    """A model on a node: local model ID (text lane) or image ID (image lane)."""

    default_error_messages = dict.fromkeys(("invalid", "required", "null"), ENDPOINT_SHAPE)

    node_id = _endpoint_part()
    model_id = _endpoint_part()


class LinkTargetSerializer(EndpointSerializer):
    """A model on another node to link the anchor with, and how the link behaves."""

    load_if_unloaded = StrictBooleanField(
        default=True,
        allow_null=True,
        help_text="The helper may load the model to take lent work (null: the default).",
    )
    restore_after_borrow = StrictBooleanField(
        default=False,
        allow_null=True,
        help_text="The helper reloads the model it held before, once quiet (null: the default).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # An explicit null has always meant the default.
        for name in ("load_if_unloaded", "restore_after_borrow"):
            if attrs.get(name) is None:
                attrs[name] = self.fields[name].default
        return attrs


class LinkSetSerializer(BodySerializer):
    """Replaces every link touching the anchor with the ones listed."""

    anchor = EndpointSerializer()
    lends_to = StrictListField(
        child=LinkTargetSerializer(),
        required=False,
        default=list,
        help_text="Helpers the anchor may lend to.",
    )
    borrows_from = StrictListField(
        child=LinkTargetSerializer(),
        required=False,
        default=list,
        help_text="Owners the anchor may borrow from.",
    )
    acknowledge_different_weights = StrictBooleanField(
        default=False,
        help_text="Required to create a first link between models whose weights differ.",
    )


class AnchorQuerySerializer(serializers.Serializer):
    """`?node_id=&model_id=`: both name an anchor, neither means every link of the lane."""

    node_id = StrictCharField(required=False, allow_blank=True)
    model_id = StrictCharField(required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        node_id, model_id = attrs.get("node_id", ""), attrs.get("model_id", "")
        if bool(node_id) != bool(model_id):
            missing = "model_id" if node_id else "node_id"
            raise serializers.ValidationError({missing: "is required with an anchor"})
        return attrs

    def anchor(self) -> tuple[str, str] | None:
        data = self.validated_data
        if not data.get("node_id"):
            return None
        return data["node_id"], data["model_id"]


class LinkSerializer(serializers.Serializer):
    """A one-way link: the owner may lend held requests to the helper."""

    owner_node_id = serializers.CharField()
    owner_model_id = serializers.CharField()
    helper_node_id = serializers.CharField()
    helper_model_id = serializers.CharField()
    load_if_unloaded = serializers.BooleanField(
        help_text="The helper may load the model to take lent work."
    )
    restore_after_borrow = serializers.BooleanField(
        help_text="The helper reloads the model it held before, once quiet."
    )


class LinkListSerializer(serializers.Serializer):
    links = LinkSerializer(many=True)


class LinkSelectionSerializer(serializers.Serializer):
    selected = serializers.BooleanField(help_text="Whether this link exists.")
    load_if_unloaded = serializers.BooleanField()
    restore_after_borrow = serializers.BooleanField()


class LinkCandidateSerializer(serializers.Serializer):
    """A model on another node that the anchor could be linked with."""

    node_id = serializers.CharField()
    model_id = serializers.CharField()
    public_id = serializers.CharField(allow_null=True)
    weights_match = serializers.BooleanField()
    lends_to = LinkSelectionSerializer()
    borrows_from = LinkSelectionSerializer()
    context_size = serializers.IntegerField(
        required=False, allow_null=True, help_text="Text lane only."
    )
    eligible = serializers.BooleanField(required=False, help_text="Text lane only.")
    ineligible_reason = serializers.CharField(
        required=False, allow_null=True, help_text="Text lane only."
    )


class AnchorSerializer(serializers.Serializer):
    """A model on a node: local model ID (text lane) or image ID (image lane)."""

    node_id = serializers.CharField()
    model_id = serializers.CharField()


class AnchorLinksSerializer(serializers.Serializer):
    anchor = AnchorSerializer()
    links = LinkSerializer(many=True)
    candidates = LinkCandidateSerializer(many=True)


def _node_errors(help_text: str) -> NodeErrorSerializer:
    return NodeErrorSerializer(many=True, required=False, help_text=help_text)


class LinkSetResultSerializer(serializers.Serializer):
    anchor = AnchorSerializer()
    links = LinkSerializer(many=True)
    node_errors = _node_errors("Slaves the new link set could not be pushed to.")


class LinkDeleteResultSerializer(serializers.Serializer):
    deleted = serializers.IntegerField(help_text="How many links were removed.")
    node_errors = _node_errors("Slaves the new link set could not be pushed to.")


# -- settings ----------------------------------------------------------------------------------


@extend_schema_field({"type": ["string", "number", "boolean"]})
class SettingValueField(serializers.Field):
    """A setting's value as sent; the settings store judges it and names the key it refuses."""

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class SettingsUpdateSerializer(BodySerializer):
    # DRF formats its messages, so the braces of the example are doubled.
    values = StrictDictField(
        child=SettingValueField(),
        help_text="Setting name → value; all are stored or, if one is refused, none.",
        error_messages=dict.fromkeys(
            ("required", "null", "not_a_dict"),
            'must be an object: {{"values": {{key: value, ...}}}}',
        ),
    )


class SettingEntrySerializer(serializers.Serializer):
    """One lending setting with its layers; values are canonical strings."""

    key = serializers.CharField()
    kind = serializers.ChoiceField(["duration", "integer", "boolean"])
    description = serializers.CharField()
    default = serializers.CharField()
    config = serializers.CharField(
        required=False, help_text="The value in the config file, if it sets one."
    )
    override = serializers.CharField(
        required=False, help_text="The database override, if one is stored (valid or not)."
    )
    effective = serializers.CharField(help_text="The value the cluster runs.")
    # Named like a DRF Field attribute: the metaclass takes it as a field all the same.
    source = serializers.ChoiceField(["default", "config", "db"])  # type: ignore[assignment]


class SettingsSerializer(serializers.Serializer):
    entries = SettingEntrySerializer(many=True)
    fingerprint = serializers.CharField(
        help_text="Equal on two nodes exactly when they run the same values."
    )
    editable = serializers.BooleanField()


# -- decisions ---------------------------------------------------------------------------------

_DECISION_REQUIRED = frozenset({"id", "recorded_at", "node_id", "kind", "router_version"})


def _decision_row_fields() -> dict[str, Any]:
    # The columns come from the decision log's own field lists, so the two cannot drift.
    fields: dict[str, Any] = {"id": serializers.IntegerField()}
    for names, kind in (
        (TEXT_FIELDS, serializers.CharField),
        (INT_FIELDS, serializers.IntegerField),
        (FLOAT_FIELDS, serializers.FloatField),
    ):
        for name in names:
            fields[name] = kind(required=name in _DECISION_REQUIRED)
    fields["recorded_at"] = serializers.IntegerField(help_text="Unix time in milliseconds.")
    return fields


DecisionRowSerializer: type[serializers.Serializer[Any]] = type(
    "DecisionRowSerializer",
    (serializers.Serializer,),
    {
        "__doc__": "A row of offload_decisions; fields that are empty or 0 are left out.",
        "__module__": __name__,
        **_decision_row_fields(),
    },
)


class DecisionsSerializer(serializers.Serializer):
    records = DecisionRowSerializer(many=True, help_text="Newest first, from every node asked.")
    node_errors = _node_errors("Nodes that did not answer.")


class DecisionFoldSerializer(serializers.Serializer):
    """Rows of one decision (same node, kind, lane, owner, helper, outcome and reason)."""

    node_id = serializers.CharField()
    kind = serializers.CharField()
    lane = serializers.CharField()
    owner_node_id = serializers.CharField()
    owner_model_id = serializers.CharField()
    helper_node_id = serializers.CharField()
    helper_model_id = serializers.CharField()
    outcome = serializers.CharField()
    reason = serializers.CharField()
    count = serializers.IntegerField(help_text="How many rows fold into this one.")
    first_at = serializers.IntegerField(help_text="The earliest row, Unix ms.")
    last_at = serializers.IntegerField(help_text="The latest row, Unix ms.")
    triggers = serializers.DictField(
        child=serializers.IntegerField(), help_text="Rows per trigger (plan rows)."
    )
    measures = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2),
        help_text="[min, max] of each measure across the rows; measures 0 throughout left out.",
    )
    router_versions = serializers.ListField(child=serializers.CharField())
    service_sources = serializers.ListField(child=serializers.CharField())
    request_ids = serializers.ListField(
        child=serializers.CharField(),
        help_text="A sample (at most 10) of the request IDs the rows are about.",
    )
    key_names = serializers.ListField(
        child=serializers.CharField(),
        help_text="A sample of the stored keys the rows' requests came with (a lent request "
        "names its owner's key).",
    )


class DecisionFoldsSerializer(serializers.Serializer):
    folds = DecisionFoldSerializer(many=True, help_text="Newest last_at first; one page.")
    offset = serializers.IntegerField()
    total_folds = serializers.IntegerField(help_text="Folds matching the filters, all pages.")
    total_rows = serializers.IntegerField(help_text="Rows in those folds.")
    truncated_nodes = serializers.ListField(
        child=serializers.CharField(),
        help_text="Nodes with more distinct decisions in the window than they answer; their "
        "oldest folds are not counted. Narrow the time range to see them.",
    )
    next_cursor = serializers.CharField(
        allow_null=True,
        help_text="Pass as `cursor` for the next page; null on the last page.",
    )
    node_errors = _node_errors("Nodes that did not answer.")


class TimelineNodeSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    own_ms = serializers.ListField(
        child=serializers.IntegerField(), help_text="Backend time on own requests per bucket."
    )
    borrowed_ms = serializers.ListField(
        child=serializers.IntegerField(), help_text="Backend time on borrowed requests per bucket."
    )
    idle_ms = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="Slot time left idle per bucket: own + borrowed + idle = slots times the bucket.",
    )
    slots = serializers.IntegerField(
        required=False,
        help_text="The node's backend slots (each lane's; the text lane's is its widest "
        "`parallel`). Times above are slot-milliseconds.",
    )
    lent = serializers.ListField(
        child=serializers.IntegerField(), help_text="Requests this node lent per bucket."
    )


class TimelineOwnerSerializer(serializers.Serializer):
    owner_node_id = serializers.CharField()
    owner_model_id = serializers.CharField()
    lane = serializers.CharField()
    held_max = serializers.ListField(
        child=serializers.IntegerField(), help_text="Deepest planned hold per bucket."
    )
    lent = serializers.ListField(child=serializers.IntegerField(), help_text="Lent per bucket.")


class TimelineSerializer(serializers.Serializer):
    since_ms = serializers.IntegerField()
    until_ms = serializers.IntegerField()
    step_ms = serializers.IntegerField(help_text="Bucket length.")
    buckets = serializers.IntegerField()
    nodes = TimelineNodeSerializer(many=True)
    owners = TimelineOwnerSerializer(many=True)
    node_errors = _node_errors("Nodes that did not answer.")


# -- the impact ----------------------------------------------------------------------------------


class ImpactFiguresSerializer(serializers.Serializer):
    requests = serializers.IntegerField(help_text="Requests of the owner models that lent.")
    lent = serializers.IntegerField(help_text="Of them, answered by a helper.")
    waited_ms = serializers.FloatField(help_text="Arrival to answer, summed, as measured.")
    waited_without_links_ms = serializers.FloatField(
        help_text="The same traffic replayed with the links removed (the owner alone)."
    )
    waiting_saved_ms = serializers.FloatField()
    waiting_saved_pct = serializers.FloatField(allow_null=True)


class ImpactOwnerSerializer(ImpactFiguresSerializer):
    lane = serializers.CharField()
    owner_node_id = serializers.CharField()
    owner_model_id = serializers.CharField()
    helpers = serializers.ListField(child=serializers.CharField())
    bursts = serializers.IntegerField()
    makespan_ms = serializers.FloatField(
        help_text="First arrival to last answer, per burst, summed."
    )
    makespan_without_links_ms = serializers.FloatField()
    notes = serializers.ListField(child=serializers.CharField())


class ImpactSerializer(serializers.Serializer):
    minutes = serializers.IntegerField()
    since_ms = serializers.IntegerField()
    until_ms = serializers.IntegerField()
    summary = serializers.CharField(
        help_text='In words: "lending saved 14 min of waiting (38 %) over the last hour".'
    )
    totals = ImpactFiguresSerializer()
    owners = ImpactOwnerSerializer(many=True)
    not_replayed = serializers.ListField(
        child=serializers.CharField(), help_text="Owners the time budget left unreplayed."
    )
    truncated_nodes = serializers.ListField(
        child=serializers.CharField(), help_text="Nodes that had more rows than they hand over."
    )
    node_errors = _node_errors("Nodes that did not answer: their rows are missing.")


# -- the summary ---------------------------------------------------------------------------------


class LeaseSerializer(serializers.Serializer):
    """A live lease of the master's plan."""

    lane = serializers.ChoiceField(["image", "text"])
    owner_node_id = serializers.CharField()
    owner_model_id = serializers.CharField()
    helper_node_id = serializers.CharField()
    helper_model_id = serializers.CharField()
    load_helper_model = serializers.BooleanField(required=False)
    restore_helper_model = serializers.BooleanField(required=False)
    helper_slots = serializers.IntegerField()
    ttl_ms = serializers.IntegerField()
    probe = serializers.BooleanField(required=False)
    owner_job_ms = serializers.FloatField(required=False)
    helper_switch_ms = serializers.FloatField(required=False)
    helper_service_ms = serializers.FloatField(required=False)
    expires_in_ms = serializers.IntegerField()


class NodeLendingSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    build_version = serializers.CharField()
    settings_fingerprint = serializers.CharField()
    settings_source = serializers.CharField(
        required=False, help_text="Where the node's settings came from (local, master)."
    )
    held_requests = HeldRequestSerializer(many=True)


class OffloadSummarySerializer(serializers.Serializer):
    master_fingerprint = serializers.CharField()
    nodes = NodeLendingSerializer(many=True, help_text="This node first, then every other.")
    leases = LeaseSerializer(many=True, help_text="Empty unless this node is the master.")
    node_errors = _node_errors("Nodes that did not answer.")
