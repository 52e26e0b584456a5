"""Bodies of the registry's management routes: what they accept (validated here) and what they
answer (described here for the schema; the services build the answers)."""

from __future__ import annotations

from rest_framework import serializers

from registry.api.assets import TransferSerializer
from registry.services import UNLOAD_TARGETS
from routerproject.api import (
    BodySerializer,
    NodeErrorSerializer,
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
)

LANES = ["text", "image", "whisper"]
ROLES = ["standalone", "master", "slave"]

# -- request bodies ------------------------------------------------------------------------------


def _required_text(help_text: str, predicate: str = "is required") -> StrictCharField:
    messages = dict.fromkeys(("required", "null", "blank", "invalid"), predicate)
    return StrictCharField(help_text=help_text, error_messages=messages)


class LoadSerializer(BodySerializer):
    model = _required_text("Public model ID (or image ID).")


class UnloadSerializer(BodySerializer):
    model = StrictCharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="Public model ID: unload it wherever it is loaded.",
    )
    target = StrictChoiceField(
        UNLOAD_TARGETS,
        required=False,
        allow_null=True,
        help_text="Without a model: which runtimes of this node to empty (default all).",
    )


def _runtime_text(help_text: str) -> StrictCharField:
    messages = {
        "required": "is required",
        "null": "is required",
        "blank": "must be a non-empty string",
        "invalid": "must be a non-empty string",
    }
    return StrictCharField(help_text=help_text, error_messages=messages)


class RuntimeUnloadSerializer(BodySerializer):
    node_id = _runtime_text("The node whose runtime to unload.")
    backend_id = _runtime_text("The backend's `id` in the node state.")
    runtime_id = _runtime_text("The loaded model's `runtime_id` there.")
    expected_generation = StrictIntegerField(
        min_value=0,
        help_text="The `generation` the caller saw: the runtime is unloaded only while it still "
        "holds that load.",
        error_messages={
            "required": "is required",
            "null": "is required",
            **dict.fromkeys(("invalid", "min_value"), "must be a non-negative integer"),
        },
    )


def _local_id() -> StrictCharField:
    return _required_text("The model's local ID on that node.", "is required: the model's local ID")


def _enabled() -> StrictBooleanField:
    return StrictBooleanField(
        help_text="false disables the model; true enables it again.",
        error_messages={"required": "must be true or false"},
    )


class NodeModelStateSerializer(BodySerializer):
    """A node's own enable/disable body (node protocol): the node is the one asked."""

    local_id = _local_id()
    enabled = _enabled()


class ModelStateSerializer(BodySerializer):
    node_id = _required_text(
        "The node that serves the model.", "is required: the node that serves the model"
    )
    local_id = _local_id()
    enabled = _enabled()


class BenchmarkSerializer(BodySerializer):
    node_id = StrictCharField(
        required=False,
        allow_null=True,
        help_text="The node whose models to calibrate (default this node); a master reaches "
        "any node of its cluster.",
        error_messages={"blank": "must be a non-empty string", "invalid": "must be a string"},
    )
    models = serializers.ListField(
        child=StrictCharField(
            error_messages={
                "blank": "must name each model by a non-empty string",
                "invalid": "must name each model by a non-empty string",
                "null": "must name each model by a non-empty string",
            }
        ),
        required=False,
        allow_null=True,
        allow_empty=False,
        help_text="Local model IDs on that node (default every enabled text or image model).",
        error_messages={
            "not_a_list": "must be a list of model IDs",
            "empty": "must name at least one model",
        },
    )


# -- answers -------------------------------------------------------------------------------------


class ModelRecordSerializer(serializers.Serializer):
    """One replica of a model in the cluster view."""

    public_id = serializers.CharField(
        help_text="The ID clients use; suffixed when two models share a name."
    )
    local_id = serializers.CharField(
        help_text="The ID on the node that serves it (the .kcpps file's stem)."
    )
    image_id = serializers.CharField(
        required=False, help_text="Image model ID, when the config has an image model."
    )
    public_image_id = serializers.CharField(required=False, help_text="The image ID clients use.")
    filename = serializers.CharField(help_text="The .kcpps file name.")
    created = serializers.IntegerField(required=False, help_text="Unix time of the config file.")
    size = serializers.IntegerField(required=False, help_text="Bytes of the model's weights.")
    has_llm = serializers.BooleanField()
    has_image = serializers.BooleanField()
    has_embeddings = serializers.BooleanField()
    has_multimodal = serializers.BooleanField(
        help_text="A text model that reads images (has a projector)."
    )
    has_voice = serializers.BooleanField()
    has_music = serializers.BooleanField(required=False)
    has_tts = serializers.BooleanField(
        required=False, help_text="Speaks text (TTS): the config has a ttsmodel, or tts: true."
    )
    model_hash = serializers.CharField(
        help_text="Hash of the weights: equal hashes mean the same model."
    )
    config_hash = serializers.CharField(help_text="Hash of the config's options.")
    capabilities = serializers.DictField(
        required=False,
        help_text="Per capability (llm, image, embeddings, multimodal, voice, context).",
    )
    options = serializers.DictField(
        required=False, help_text="The config's options, secrets removed."
    )
    backend_mode = serializers.CharField(help_text="kobold, llama_sdcpp, vllm, sim or upstream.")
    # Named like a DRF Field attribute: the metaclass takes it as a field all the same.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        ["local", "master", "slave"],
        help_text="local (standalone), master (the master's own) or slave (polled from a slave).",
    )
    node_id = serializers.CharField()
    node_url = serializers.CharField()
    available = serializers.BooleanField(
        help_text="False while the node that serves it is unhealthy."
    )
    loaded = serializers.BooleanField()
    disabled = serializers.BooleanField(
        required=False,
        help_text="Disabled on its node: requests for it get 404 and client model lists leave "
        "it out (POST /router/v1/site/models/state).",
    )
    context_size = serializers.IntegerField(required=False, allow_null=True)
    parallel = serializers.IntegerField(required=False, allow_null=True)
    text_ineligible_reason = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="Why the model cannot be linked for text lending; null if it can.",
    )
    unresolved_fields = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Path fields that wait for their files to be resolved.",
    )
    asset_state = serializers.ChoiceField(
        ["unresolved", "resolving", "failed"],
        required=False,
        help_text="Only on a portable config whose weights are not resolved yet.",
    )
    asset_error = serializers.CharField(
        required=False, help_text="Why the last resolution failed (asset_state failed)."
    )


class ModelListSerializer(serializers.Serializer):
    models = ModelRecordSerializer(many=True)


class NodeSnapshotSerializer(serializers.Serializer):
    """What a node reports about itself to its master."""

    node_id = serializers.CharField()
    node_url = serializers.CharField(
        help_text="The node's public URL (empty on a standalone node)."
    )
    role = serializers.ChoiceField(ROLES)
    models = ModelRecordSerializer(
        many=True, help_text="The node's own records, before public-ID suffixing."
    )
    protocol_version = serializers.IntegerField()
    minimum_protocol_version = serializers.IntegerField()
    build_version = serializers.CharField()
    settings_fingerprint = serializers.CharField(
        help_text="Fingerprint of the lending settings it runs."
    )
    api_keys_fingerprint = serializers.CharField(
        help_text="Fingerprint of the stored-key table it checks keys against."
    )


class VersionSerializer(serializers.Serializer):
    version = serializers.CharField(help_text="The router's build version.")
    protocol_version = serializers.IntegerField(help_text="The cluster protocol this build speaks.")
    minimum_protocol_version = serializers.IntegerField(
        help_text="The oldest cluster protocol it accepts."
    )


class LoadResultSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    node_id = serializers.CharField(help_text="The node that loaded it.")
    model = serializers.CharField(help_text="Its local ID there.")
    lanes = serializers.ListField(
        child=serializers.ChoiceField(LANES), help_text="The runtimes the model was loaded into."
    )
    duration_ms = serializers.FloatField()


class UnloadResultSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    node_id = serializers.CharField()
    unloaded = serializers.ListField(
        child=serializers.ChoiceField(LANES),
        help_text="The runtimes that held a model and now do not.",
    )


class LoadedModelSerializer(serializers.Serializer):
    model_id = serializers.CharField()
    lane = serializers.CharField()
    runtime_id = serializers.CharField(
        help_text="The lane, or upstream-N for an upstream server's runtime."
    )
    generation = serializers.IntegerField(
        help_text="Counts the runtime's loads: what a generation-checked unload names."
    )
    borrowed = serializers.BooleanField(
        help_text="Borrowed (lent-to-this-node) requests are waiting for or running on the runtime."
    )
    active = serializers.IntegerField(help_text="Requests running on the runtime now.")


class LoadUnderWaySerializer(serializers.Serializer):
    """A load in progress on a runtime."""

    model_id = serializers.CharField(help_text="The model being loaded.")
    elapsed_ms = serializers.IntegerField(help_text="How long the load has run so far.")
    waiting = serializers.IntegerField(help_text="Requests waiting for this load to finish.")
    expected_ms = serializers.FloatField(
        allow_null=True,
        help_text="This node's mean time to load the config, from its own loads; null until "
        "it has loaded it once.",
    )


class RealtimeSessionSerializer(serializers.Serializer):
    model = serializers.CharField(help_text="The public ID the session named.")
    since = serializers.FloatField(help_text="Unix time the session took the lane.")
    idle_secs = serializers.FloatField(
        help_text="Seconds since a frame last passed either way; at "
        "server.realtime_idle_timeout the session is closed."
    )


class BackendSerializer(serializers.Serializer):
    """One runtime of the node (text, image or whisper)."""

    id = serializers.CharField()
    display_name = serializers.CharField()
    mode = serializers.CharField(help_text="The node's backend mode.")
    lifecycle_state = serializers.ChoiceField(["empty", "loading", "ready", "failed", "stopping"])
    loaded_models = LoadedModelSerializer(many=True)
    active = serializers.IntegerField(help_text="Requests running now.")
    waiting = serializers.IntegerField(help_text="Requests waiting for this runtime.")
    loading = serializers.CharField(allow_null=True, help_text="The model being loaded, if any.")
    load = LoadUnderWaySerializer(allow_null=True, help_text="The load under way, if any.")
    last_error = serializers.CharField(help_text="Why the last load (or the backend) failed.")
    last_error_at = serializers.FloatField(
        allow_null=True, help_text="Unix time of last_error; null when there is none."
    )
    pid = serializers.IntegerField(allow_null=True)
    base_url = serializers.CharField(allow_null=True)
    probe_ok = serializers.BooleanField(
        help_text="The loaded backend's last readiness probe (repeated every second) passed; "
        "while it fails, requests go to another replica."
    )
    realtime_sessions = RealtimeSessionSerializer(
        many=True,
        help_text="`/v1/realtime` sessions holding this runtime's model: no other model loads "
        "here until they end.",
    )


class NodeSummarySerializer(serializers.Serializer):
    node_id = serializers.CharField()
    node_url = serializers.CharField()
    healthy = serializers.BooleanField()
    suspect = serializers.BooleanField(
        help_text="Unhealthy because it stopped answering (a missed poll deadline or a "
        "refused connection): skipped for routing until it answers a poll again."
    )
    error = serializers.CharField(help_text="The last poll's error; empty while healthy.")
    build_version = serializers.CharField()
    models = serializers.IntegerField(help_text="How many model records the node has.")
    updated_at = serializers.FloatField(
        required=False, help_text="Unix time of the last successful poll."
    )


class ClusterStateSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    role = serializers.ChoiceField(ROLES)
    revision = serializers.IntegerField(help_text="Counts changes of the cluster view.")
    view_ready = serializers.BooleanField(
        help_text="False on a master until its first round of polls has finished or timed out."
    )
    nodes = NodeSummarySerializer(many=True, help_text="Every registered node (empty standalone).")


class HeldRequestSerializer(serializers.Serializer):
    lane = serializers.CharField()
    model_id = serializers.CharField()
    state = serializers.ChoiceField(["queued", "held", "lent"])
    waiting_ms = serializers.IntegerField()
    arrived_at = serializers.FloatField(help_text="The node's monotonic clock, in seconds.")
    pinned = serializers.BooleanField()
    returned = serializers.BooleanField(required=False, help_text="Handed back by a helper.")
    helper_node_id = serializers.CharField(required=False, help_text="Lent requests only.")
    helper_model_id = serializers.CharField(required=False, help_text="Lent requests only.")
    key = serializers.CharField(
        allow_null=True,
        required=False,
        help_text="The stored key it came with (its owner's, when borrowed); null without one.",
    )


class WaitingByKeySerializer(serializers.Serializer):
    lane = serializers.CharField()
    model_id = serializers.CharField()
    key = serializers.CharField(allow_null=True, help_text="null: requests without a stored key.")
    waiting = serializers.IntegerField(help_text="Queued or held in the router queue now.")


class AffinityCountsSerializer(serializers.Serializer):
    hits = serializers.IntegerField(help_text="Sent to the replica holding its prompt prefix.")
    misses = serializers.IntegerField(help_text="No replica held a usable prefix: rotation.")
    overrides = serializers.IntegerField(
        help_text="A replica held the prefix, but its wait or a small saving kept the rotation."
    )


class AffinitySerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="cluster.routing_cache_affinity")
    entries = serializers.IntegerField(help_text="Prefixes remembered (routing_affinity_entries).")
    models = serializers.DictField(
        child=AffinityCountsSerializer(), help_text="Choices this node made, per public model ID."
    )


class NodeStateSerializer(serializers.Serializer):
    """`cluster` is present only for the answering node itself (no node_id)."""

    node_id = serializers.CharField()
    role = serializers.ChoiceField(ROLES)
    backends = BackendSerializer(many=True)
    active_requests = serializers.ListField(
        child=serializers.CharField(),
        help_text="The local model ID once per request running on it.",
    )
    held_requests = HeldRequestSerializer(many=True)
    waiting_by_key = WaitingByKeySerializer(
        many=True,
        help_text="Requests waiting in the router queue per lane, model and key (every model "
        "with auth.fair_share, else linked models).",
    )
    analytics_buffered = serializers.IntegerField(help_text="Analytics rows not yet written.")
    asset_transfers = TransferSerializer(
        many=True, help_text="Model asset copies into this node: running ones, then the last 5."
    )
    affinity = AffinitySerializer(help_text="Cache-affine replica choice on this node.")
    cluster = ClusterStateSerializer(required=False)
    node_states = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="With nodes=all: every other healthy node's state (each of this shape, "
        "without `cluster`), in node ID order.",
    )
    node_errors = NodeErrorSerializer(
        many=True, required=False, help_text="With nodes=all: nodes whose state is missing."
    )


# -- the site inventory ------------------------------------------------------------------------


class MemorySerializer(serializers.Serializer):
    kind = serializers.ChoiceField(
        ["vram", "ram"], help_text="vram (summed over the GPUs nvidia-smi reports) or ram."
    )
    total_bytes = serializers.IntegerField(min_value=0)
    used_bytes = serializers.IntegerField(
        min_value=0, help_text="In use now; for RAM, what MemAvailable says cannot be had."
    )


class HardwareSerializer(serializers.Serializer):
    memory = MemorySerializer(allow_null=True, help_text="Null when the node could not read it.")
    cpu_count = serializers.IntegerField(allow_null=True)
    note = serializers.CharField(
        help_text="Why something could not be read; empty when all went well."
    )


class FileRootSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="A `models.file_roots` entry.")
    note = serializers.CharField(
        help_text="Why it was not listed (missing, not a directory, inside another root, the "
        "listing already full) or what could not be read; empty when all went well."
    )


class FileEntrySerializer(serializers.Serializer):
    # Named like a DRF Field attribute: the metaclass takes it as a field all the same.
    root = serializers.CharField(help_text="The root it lies below.")  # type: ignore[assignment]
    path = serializers.CharField(help_text="Relative to the root, with / separators.")
    size = serializers.IntegerField(min_value=0)
    mtime = serializers.FloatField(help_text="Unix time of the last change.")


class FileListingSerializer(serializers.Serializer):
    roots = FileRootSerializer(many=True)
    entries = FileEntrySerializer(
        many=True, help_text="Regular files, root by root, depth first in name order."
    )
    truncated = serializers.BooleanField(
        help_text="The listing stopped at its cap (10 000 files per node)."
    )


class InventoryNodeSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    node_url = serializers.CharField(help_text="Empty for a standalone node.")
    # Named like a DRF Field attribute: the metaclass takes it as a field all the same.
    source = serializers.ChoiceField(["local", "master", "slave"])  # type: ignore[assignment]
    role = serializers.ChoiceField(ROLES)
    backend_mode = serializers.CharField(help_text="Empty when the node did not answer.")
    available = serializers.BooleanField(
        help_text="False when the node is unhealthy or did not answer."
    )
    hardware = HardwareSerializer(allow_null=True, help_text="Null when the node did not answer.")
    models = ModelRecordSerializer(
        many=True,
        help_text="The node's own records (local IDs); the last poll's when it did not answer.",
    )
    files = FileListingSerializer(
        allow_null=True, help_text="Only with include_files=true and when the node answered."
    )
    error = serializers.CharField(help_text="Why the node did not answer; empty when it did.")
    build_version = serializers.CharField()


class RecipeComponentSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(["text", "image", "embeddings", "voice", "music"])
    node_id = serializers.CharField()
    model_id = serializers.CharField()
    image_id = serializers.CharField()
    config_filename = serializers.CharField()


class RecipeSerializer(serializers.Serializer):
    """A split recipe: one public model made of components on several nodes."""

    id = serializers.CharField()
    public_id = serializers.CharField()
    public_image_id = serializers.CharField(
        help_text="Empty when the recipe has no image component."
    )
    components = RecipeComponentSerializer(many=True)


class InventorySerializer(serializers.Serializer):
    role = serializers.ChoiceField(["standalone", "master"])
    node_id = serializers.CharField()
    node_url = serializers.CharField()
    nodes = InventoryNodeSerializer(
        many=True, help_text="This node first, then every registered node."
    )
    models = ModelRecordSerializer(many=True, help_text="The cluster view, as /router/v1/models.")
    recipes = RecipeSerializer(many=True, help_text="The master's split recipes.")


class BenchmarkLaneSerializer(serializers.Serializer):
    lane = serializers.ChoiceField(["text", "image"])
    model_id = serializers.CharField(help_text="The ID the analytics rows and the fit carry.")
    requests = serializers.IntegerField(help_text="Requests sent.")
    ok = serializers.IntegerField(help_text="Requests answered 200.")
    load_ms = serializers.FloatField(
        allow_null=True, help_text="The measured load (the first request loaded the model)."
    )
    fit = serializers.DictField(
        allow_null=True, help_text="The cost fit (as runtime-status `costs.models` shows it)."
    )


class BenchmarkResultSerializer(serializers.Serializer):
    model = serializers.CharField()
    started_at = serializers.CharField(required=False)
    finished_at = serializers.CharField(required=False)
    file = serializers.CharField(required=False, help_text="The result file on that node.")
    fitted = serializers.BooleanField(required=False)
    min_samples = serializers.IntegerField(required=False)
    lanes = BenchmarkLaneSerializer(many=True, required=False)
    error = serializers.CharField(required=False, help_text="Why the calibration failed.")


class BenchmarkStatusSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    running = serializers.BooleanField()
    current = serializers.CharField(allow_null=True, help_text="The model being calibrated.")
    pending = serializers.ListField(child=serializers.CharField())
    results = BenchmarkResultSerializer(
        many=True, help_text="The last result of each model, kept across restarts."
    )
