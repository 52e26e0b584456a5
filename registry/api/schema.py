"""The OpenAPI 3.1 document of the router's HTTP surface, served at `GET /router/v1/schema`.

The management views are plain async Django views and the client API is the proxy's own route
table, so no generator can read them: the document is written here by hand, and
`tests/test_openapi.py` keeps it in step with the URL patterns and `proxy.handlers.ROUTES`.
The node protocol (`/router/v1/node/…`) is left out on purpose: only nodes of one cluster
speak it, with the cluster token.

The document is public. It describes the surface, not anything behind it, and a client that
has no key yet needs it most; every operation it describes still checks its own keys.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from lending.decisions import FLOAT_FIELDS, INT_FIELDS, TEXT_FIELDS
from lending.links import LINK_FIELDS
from registry.services import UNLOAD_TARGETS
from routerproject.errors import error_envelope

__all__ = ["OPENAPI_CONTENT_TYPE", "openapi_bytes", "openapi_document", "schema"]

OPENAPI_CONTENT_TYPE = "application/vnd.oai.openapi+json;version=3.1"

Schema = dict[str, Any]

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"

SITE_NOTE = (
    "Site route: served by a master or a standalone node; a slave answers 404, as if the "
    "route did not exist. The document is the same on every role."
)


# -- small builders --------------------------------------------------------------------------


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _response_ref(name: str) -> Schema:
    return {"$ref": f"#/components/responses/{name}"}


def _obj(
    properties: dict[str, Schema],
    *,
    required: tuple[str, ...] = (),
    description: str | None = None,
    additional: bool = True,
) -> Schema:
    doc: Schema = {"type": "object", "properties": properties}
    if not additional:
        doc["additionalProperties"] = False
    if required:
        doc["required"] = list(required)
    if description:
        doc["description"] = description
    return doc


def _array(items: Schema, description: str | None = None) -> Schema:
    doc: Schema = {"type": "array", "items": items}
    if description:
        doc["description"] = description
    return doc


def _str(description: str | None = None, **extra: Any) -> Schema:
    doc: Schema = {"type": "string", **extra}
    if description:
        doc["description"] = description
    return doc


def _int(description: str | None = None, **extra: Any) -> Schema:
    doc: Schema = {"type": "integer", **extra}
    if description:
        doc["description"] = description
    return doc


def _num(description: str | None = None) -> Schema:
    doc: Schema = {"type": "number"}
    if description:
        doc["description"] = description
    return doc


def _bool(description: str | None = None, **extra: Any) -> Schema:
    doc: Schema = {"type": "boolean", **extra}
    if description:
        doc["description"] = description
    return doc


def _nullable(kind: str, description: str | None = None) -> Schema:
    doc: Schema = {"type": [kind, "null"]}
    if description:
        doc["description"] = description
    return doc


def _map(values: Schema, description: str | None = None) -> Schema:
    doc: Schema = {"type": "object", "additionalProperties": values}
    if description:
        doc["description"] = description
    return doc


def _json_response(description: str, schema: Schema) -> Schema:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _json_body(schema: Schema, *, required: bool = True) -> Schema:
    return {"required": required, "content": {JSON: {"schema": schema}}}


def _error(description: str, *, ollama: bool = False) -> Schema:
    return _json_response(description, _ref("OllamaError" if ollama else "Error"))


def _query(name: str, schema: Schema, description: str, *, required: bool = False) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    }


# -- components ------------------------------------------------------------------------------


def _error_schemas() -> dict[str, Schema]:
    return {
        "Error": _obj(
            {
                "error": _obj(
                    {
                        "message": _str("What went wrong, for a person to read."),
                        "type": _str(
                            "The kind of error: invalid_request_error, unauthorized, not_found, "
                            "backend_error, server_error, …"
                        ),
                        "param": _str("The request field at fault; absent when none is."),
                        "code": {
                            "type": ["string", "integer"],
                            "description": (
                                "A stable code for programs (model_not_found, "
                                "node_unavailable, different_weights, …); absent when there is "
                                "none. A backend's own error passes through as it sent it, "
                                "and llama-server puts the HTTP status here as a number."
                            ),
                        },
                    },
                    required=("message", "type"),
                )
            },
            required=("error",),
            description="The OpenAI error envelope every path except Ollama's answers with.",
        ),
        "OllamaError": _obj(
            {"error": _str("What went wrong.")},
            required=("error",),
            description="The error body on Ollama paths (/api/chat, /api/generate, /api/tags, "
            "/api/ps).",
        ),
        "NodeError": _obj(
            {"node_id": _str(), "error": _str("Why that node did not answer.")},
            required=("node_id", "error"),
            description="A node that failed while the master asked every node; the answer "
            "still carries what the other nodes said.",
        ),
    }


def _model_schemas() -> dict[str, Schema]:
    lanes = _str(enum=["text", "image", "whisper"])
    return {
        "ModelRecord": _obj(
            {
                "public_id": _str("The ID clients use; suffixed when two models share a name."),
                "local_id": _str("The ID on the node that serves it (the .kcpps file's stem)."),
                "image_id": _str("Image model ID, when the config has an image model."),
                "public_image_id": _str("The image ID clients use."),
                "filename": _str("The .kcpps file name."),
                "created": _int("Unix time of the config file."),
                "size": _int("Bytes of the model's weights."),
                "has_llm": _bool(),
                "has_image": _bool(),
                "has_embeddings": _bool(),
                "has_multimodal": _bool("A text model that reads images (has a projector)."),
                "has_voice": _bool(),
                "has_music": _bool(),
                "model_hash": _str("Hash of the weights: equal hashes mean the same model."),
                "config_hash": _str("Hash of the config's options."),
                "capabilities": _map(
                    {}, "Per capability (llm, image, embeddings, multimodal, voice, context)."
                ),
                "options": _map({}, "The config's options, secrets removed."),
                "backend_mode": _str("kobold, llama_sdcpp, vllm, sim or upstream."),
                "source": _str(
                    "local (standalone), master (the master's own) or slave (polled from a slave).",
                    enum=["local", "master", "slave"],
                ),
                "node_id": _str(),
                "node_url": _str(),
                "available": _bool("False while the node that serves it is unhealthy."),
                "loaded": _bool(),
                "disabled": _bool(
                    "Disabled on its node: requests for it get 404 and client model lists "
                    "leave it out (POST /router/v1/site/models/state)."
                ),
                "context_size": _nullable("integer"),
                "parallel": _nullable("integer"),
                "text_ineligible_reason": _nullable(
                    "string", "Why the model cannot be linked for text lending; null if it can."
                ),
                "unresolved_fields": _array(
                    _str(), "Path fields that wait for their files to be resolved."
                ),
            },
            required=(
                "public_id",
                "local_id",
                "filename",
                "has_llm",
                "has_image",
                "has_embeddings",
                "has_multimodal",
                "has_voice",
                "model_hash",
                "config_hash",
                "backend_mode",
                "source",
                "node_id",
                "node_url",
                "available",
                "loaded",
            ),
            description="One replica of a model in the cluster view.",
        ),
        "ModelList": _obj({"models": _array(_ref("ModelRecord"))}, required=("models",)),
        "ModelStateRequest": _obj(
            {
                "node_id": _str("The node that serves the model.", minLength=1),
                "local_id": _str("The model's local ID on that node.", minLength=1),
                "enabled": _bool("false disables the model; true enables it again."),
            },
            required=("node_id", "local_id", "enabled"),
        ),
        "NodeSnapshot": _obj(
            {
                "node_id": _str(),
                "node_url": _str("The node's public URL (empty on a standalone node)."),
                "role": _str(enum=["standalone", "master", "slave"]),
                "models": _array(
                    _ref("ModelRecord"), "The node's own records, before public-ID suffixing."
                ),
                "protocol_version": _int(),
                "minimum_protocol_version": _int(),
                "build_version": _str(),
                "settings_fingerprint": _str("Fingerprint of the lending settings it runs."),
            },
            required=(
                "node_id",
                "node_url",
                "role",
                "models",
                "protocol_version",
                "minimum_protocol_version",
                "build_version",
                "settings_fingerprint",
            ),
            description="What a node reports about itself to its master.",
        ),
        "Version": _obj(
            {
                "version": _str("The router's build version."),
                "protocol_version": _int("The cluster protocol this build speaks."),
                "minimum_protocol_version": _int("The oldest cluster protocol it accepts."),
            },
            required=("version", "protocol_version", "minimum_protocol_version"),
        ),
        "LoadRequest": _obj(
            {"model": _str("Public model ID (or image ID).", minLength=1)},
            required=("model",),
        ),
        "LoadResult": _obj(
            {
                "ok": _bool(),
                "node_id": _str("The node that loaded it."),
                "model": _str("Its local ID there."),
                "lanes": _array(lanes, "The runtimes the model was loaded into."),
                "duration_ms": _num(),
            },
            required=("ok", "node_id", "model", "lanes", "duration_ms"),
        ),
        "UnloadRequest": _obj(
            {
                "model": _str("Public model ID: unload it wherever it is loaded."),
                "target": _str(
                    "Without a model: which runtimes of this node to empty (default all).",
                    enum=list(UNLOAD_TARGETS),
                ),
            }
        ),
        "UnloadResult": _obj(
            {
                "ok": _bool(),
                "node_id": _str(),
                "unloaded": _array(lanes, "The runtimes that held a model and now do not."),
            },
            required=("ok", "node_id", "unloaded"),
        ),
    }


def _state_schemas() -> dict[str, Schema]:
    return {
        "LoadedModel": _obj(
            {
                "model_id": _str(),
                "lane": _str(),
                "runtime_id": _str("The lane, or upstream-N for an upstream server's runtime."),
                "generation": _int(
                    "Counts the runtime's loads: what a generation-checked unload names."
                ),
                "borrowed": _bool(
                    "Borrowed (lent-to-this-node) requests are waiting for or running on the "
                    "runtime."
                ),
                "active": _int("Requests running on the runtime now."),
            },
            required=("model_id", "lane", "runtime_id", "generation", "borrowed", "active"),
        ),
        "RuntimeUnloadRequest": _obj(
            {
                "node_id": _str("The node whose runtime to unload.", minLength=1),
                "backend_id": _str("The backend's `id` in the node state.", minLength=1),
                "runtime_id": _str("The loaded model's `runtime_id` there.", minLength=1),
                "expected_generation": _int(
                    "The `generation` the caller saw: the runtime is unloaded only while it "
                    "still holds that load.",
                    minimum=0,
                ),
            },
            required=("node_id", "backend_id", "runtime_id", "expected_generation"),
        ),
        "Backend": _obj(
            {
                "id": _str(),
                "display_name": _str(),
                "mode": _str("The node's backend mode."),
                "lifecycle_state": _str(enum=["empty", "loading", "ready", "failed", "stopping"]),
                "loaded_models": _array(_ref("LoadedModel")),
                "active": _int("Requests running now."),
                "waiting": _int("Requests waiting for this runtime."),
                "loading": _nullable("string", "The model being loaded, if any."),
                "last_error": _str(),
                "pid": _nullable("integer"),
                "base_url": _nullable("string"),
            },
            required=(
                "id",
                "display_name",
                "mode",
                "lifecycle_state",
                "loaded_models",
                "active",
                "waiting",
                "loading",
                "last_error",
                "pid",
                "base_url",
            ),
            description="One runtime of the node (text, image or whisper).",
        ),
        "NodeSummary": _obj(
            {
                "node_id": _str(),
                "node_url": _str(),
                "healthy": _bool(),
                "error": _str("The last poll's error; empty while healthy."),
                "build_version": _str(),
                "models": _int("How many model records the node has."),
                "updated_at": _num("Unix time of the last successful poll."),
            },
            required=("node_id", "node_url", "healthy", "error", "build_version", "models"),
        ),
        "ClusterState": _obj(
            {
                "node_id": _str(),
                "role": _str(enum=["standalone", "master", "slave"]),
                "revision": _int("Counts changes of the cluster view."),
                "nodes": _array(_ref("NodeSummary"), "Every registered node (empty standalone)."),
            },
            required=("node_id", "role", "revision", "nodes"),
        ),
        "NodeState": _obj(
            {
                "node_id": _str(),
                "role": _str(enum=["standalone", "master", "slave"]),
                "backends": _array(_ref("Backend")),
                "active_requests": _array(
                    _str(), "The local model ID once per request running on it."
                ),
                "held_requests": _array(_ref("HeldRequest")),
                "analytics_buffered": _int("Analytics rows not yet written."),
                "cluster": _ref("ClusterState"),
            },
            required=(
                "node_id",
                "role",
                "backends",
                "active_requests",
                "held_requests",
                "analytics_buffered",
            ),
            description="`cluster` is present only for the answering node itself (no node_id).",
        ),
        "AnalyticsRows": _obj(
            {
                "kind": _str(enum=["requests", "loads"]),
                "records": _array(
                    {"anyOf": [_ref("RequestRow"), _ref("LoadRow")]}, "Newest first."
                ),
            },
            required=("kind", "records"),
        ),
        "RequestRow": _obj(
            {
                "id": _int(),
                "node_id": _str(),
                "model_id": _str("Local model ID (image ID for images)."),
                "config_filename": _str(),
                "lane": _str(),
                "path": _str(),
                "status": _int("The HTTP status the client got."),
                "success": _bool(),
                "borrowed": _bool(),
                "stream": _bool(),
                "prompt_bytes": _int(),
                "prompt_tokens": _int(),
                "output_tokens": _int(),
                "image_width": _int(),
                "image_height": _int(),
                "image_steps": _int(),
                "image_count": _int(),
                "duration_ms": _num(),
                "started_at": _str(format="date-time"),
                "finished_at": _str(format="date-time"),
            },
            required=(
                "id",
                "node_id",
                "model_id",
                "lane",
                "status",
                "success",
                "duration_ms",
                "started_at",
                "finished_at",
            ),
            description="A row of analytics_requests.",
        ),
        "LoadRow": _obj(
            {
                "id": _int(),
                "node_id": _str(),
                "model_id": _str(),
                "config_filename": _str(),
                "lane": _str(),
                "reason": _str(),
                "success": _bool(),
                "error": _str(),
                "duration_ms": _num(),
                "finished_at": _str(format="date-time"),
            },
            required=("id", "node_id", "model_id", "lane", "success", "duration_ms", "finished_at"),
            description="A row of analytics_loads.",
        ),
    }


def _inventory_schemas() -> dict[str, Schema]:
    def nullable(name: str, description: str) -> Schema:
        return {"anyOf": [_ref(name), {"type": "null"}], "description": description}

    return {
        "Memory": _obj(
            {
                "kind": _str(
                    "vram (summed over the GPUs nvidia-smi reports) or ram.", enum=["vram", "ram"]
                ),
                "total_bytes": _int(minimum=0),
                "used_bytes": _int(
                    "In use now; for RAM, what MemAvailable says cannot be had.", minimum=0
                ),
            },
            required=("kind", "total_bytes", "used_bytes"),
        ),
        "Hardware": _obj(
            {
                "memory": nullable("Memory", "Null when the node could not read it."),
                "cpu_count": _nullable("integer"),
                "note": _str("Why something could not be read; empty when all went well."),
            },
            required=("memory", "cpu_count", "note"),
        ),
        "FileRoot": _obj(
            {
                "path": _str("A `models.file_roots` entry."),
                "note": _str(
                    "Why it was not listed (missing, not a directory, inside another root, the "
                    "listing already full) or what could not be read; empty when all went well."
                ),
            },
            required=("path", "note"),
        ),
        "FileEntry": _obj(
            {
                "root": _str("The root it lies below."),
                "path": _str("Relative to the root, with / separators."),
                "size": _int(minimum=0),
                "mtime": _num("Unix time of the last change."),
            },
            required=("root", "path", "size", "mtime"),
        ),
        "FileListing": _obj(
            {
                "roots": _array(_ref("FileRoot")),
                "entries": _array(
                    _ref("FileEntry"), "Regular files, root by root, depth first in name order."
                ),
                "truncated": _bool("The listing stopped at its cap (10 000 files per node)."),
            },
            required=("roots", "entries", "truncated"),
        ),
        "InventoryNode": _obj(
            {
                "node_id": _str(),
                "node_url": _str("Empty for a standalone node."),
                "source": _str(enum=["local", "master", "slave"]),
                "role": _str(enum=["standalone", "master", "slave"]),
                "backend_mode": _str("Empty when the node did not answer."),
                "available": _bool("False when the node is unhealthy or did not answer."),
                "hardware": nullable("Hardware", "Null when the node did not answer."),
                "models": _array(
                    _ref("ModelRecord"),
                    "The node's own records (local IDs); the last poll's when it did not answer.",
                ),
                "files": nullable(
                    "FileListing", "Only with include_files=true and when the node answered."
                ),
                "error": _str("Why the node did not answer; empty when it did."),
                "build_version": _str(),
            },
            required=(
                "node_id",
                "node_url",
                "source",
                "role",
                "backend_mode",
                "available",
                "hardware",
                "models",
                "files",
                "error",
                "build_version",
            ),
        ),
        "RecipeComponent": _obj(
            {
                "kind": _str(enum=["text", "image", "embeddings", "voice", "music"]),
                "node_id": _str(),
                "model_id": _str(),
                "image_id": _str(),
                "config_filename": _str(),
            },
            required=("kind", "node_id", "model_id", "image_id", "config_filename"),
        ),
        "Recipe": _obj(
            {
                "id": _str(),
                "public_id": _str(),
                "public_image_id": _str("Empty when the recipe has no image component."),
                "components": _array(_ref("RecipeComponent")),
            },
            required=("id", "public_id", "public_image_id", "components"),
            description="A split recipe: one public model made of components on several nodes.",
        ),
        "Inventory": _obj(
            {
                "role": _str(enum=["standalone", "master"]),
                "node_id": _str(),
                "node_url": _str(),
                "nodes": _array(
                    _ref("InventoryNode"), "This node first, then every registered node."
                ),
                "models": _array(_ref("ModelRecord"), "The cluster view, as /router/v1/models."),
                "recipes": _array(_ref("Recipe"), "The master's split recipes."),
            },
            required=("role", "node_id", "node_url", "nodes", "models", "recipes"),
        ),
    }


def _link_schemas() -> dict[str, Schema]:
    selection = _obj(
        {
            "selected": _bool("Whether this link exists."),
            "load_if_unloaded": _bool(),
            "restore_after_borrow": _bool(),
        },
        required=("selected", "load_if_unloaded", "restore_after_borrow"),
    )
    node_errors = _array(_ref("NodeError"), "Slaves the new link set could not be pushed to.")
    return {
        "Link": _obj(
            {
                "owner_node_id": _str(),
                "owner_model_id": _str(),
                "helper_node_id": _str(),
                "helper_model_id": _str(),
                "load_if_unloaded": _bool("The helper may load the model to take lent work."),
                "restore_after_borrow": _bool(
                    "The helper reloads the model it held before, once quiet."
                ),
            },
            required=LINK_FIELDS,
            description="A one-way link: the owner may lend held requests to the helper.",
        ),
        "LinkList": _obj({"links": _array(_ref("Link"))}, required=("links",)),
        "Endpoint": _obj(
            {"node_id": _str(minLength=1), "model_id": _str(minLength=1)},
            required=("node_id", "model_id"),
            description="A model on a node: local model ID (text lane) or image ID (image lane).",
        ),
        "LinkTarget": _obj(
            {
                "node_id": _str(minLength=1),
                "model_id": _str(minLength=1),
                "load_if_unloaded": _bool(default=True),
                "restore_after_borrow": _bool(default=False),
            },
            required=("node_id", "model_id"),
        ),
        "LinkSetRequest": _obj(
            {
                "anchor": _ref("Endpoint"),
                "lends_to": _array(_ref("LinkTarget"), "Helpers the anchor may lend to."),
                "borrows_from": _array(_ref("LinkTarget"), "Owners the anchor may borrow from."),
                "acknowledge_different_weights": _bool(
                    "Required to create a first link between models whose weights differ.",
                    default=False,
                ),
            },
            required=("anchor",),
            description="Replaces every link touching the anchor with the ones listed.",
        ),
        "LinkSelection": selection,
        "LinkCandidate": _obj(
            {
                "node_id": _str(),
                "model_id": _str(),
                "public_id": _nullable("string"),
                "weights_match": _bool(),
                "lends_to": _ref("LinkSelection"),
                "borrows_from": _ref("LinkSelection"),
                "context_size": _nullable("integer", "Text lane only."),
                "eligible": _bool("Text lane only."),
                "ineligible_reason": _nullable("string", "Text lane only."),
            },
            required=(
                "node_id",
                "model_id",
                "public_id",
                "weights_match",
                "lends_to",
                "borrows_from",
            ),
            description="A model on another node that the anchor could be linked with.",
        ),
        "AnchorLinks": _obj(
            {
                "anchor": _ref("Endpoint"),
                "links": _array(_ref("Link")),
                "candidates": _array(_ref("LinkCandidate")),
            },
            required=("anchor", "links", "candidates"),
        ),
        "LinkSetResult": _obj(
            {"anchor": _ref("Endpoint"), "links": _array(_ref("Link")), "node_errors": node_errors},
            required=("anchor", "links"),
        ),
        "LinkDeleteResult": _obj(
            {"deleted": _int("How many links were removed."), "node_errors": node_errors},
            required=("deleted",),
        ),
    }


def _lending_schemas() -> dict[str, Schema]:
    # The columns come from the decision log's own field lists, so the two cannot drift.
    decision: dict[str, Schema] = {"id": _int()}
    decision.update({name: _str() for name in TEXT_FIELDS})
    decision.update({name: _int() for name in INT_FIELDS})
    decision.update({name: _num() for name in FLOAT_FIELDS})
    decision["recorded_at"] = _int("Unix time in milliseconds.")
    return {
        "SettingEntry": _obj(
            {
                "key": _str(),
                "kind": _str(enum=["duration", "integer", "boolean"]),
                "description": _str(),
                "default": _str(),
                "config": _str("The value in the config file, if it sets one."),
                "override": _str("The database override, if one is stored (valid or not)."),
                "effective": _str("The value the cluster runs."),
                "source": _str(enum=["default", "config", "db"]),
            },
            required=("key", "kind", "description", "default", "effective", "source"),
            description="One lending setting with its layers; values are canonical strings.",
        ),
        "Settings": _obj(
            {
                "entries": _array(_ref("SettingEntry")),
                "fingerprint": _str("Equal on two nodes exactly when they run the same values."),
                "editable": _bool(),
            },
            required=("entries", "fingerprint", "editable"),
        ),
        "SettingsUpdate": _obj(
            {
                "values": _map(
                    {"type": ["string", "number", "boolean"]},
                    "Setting name → value; all are stored or, if one is refused, none.",
                )
            },
            required=("values",),
        ),
        "DecisionRow": _obj(
            decision,
            required=("id", "recorded_at", "node_id", "kind", "router_version"),
            description="A row of offload_decisions; fields that are empty or 0 are left out.",
        ),
        "Decisions": _obj(
            {
                "records": _array(_ref("DecisionRow"), "Newest first, from every node asked."),
                "node_errors": _array(_ref("NodeError")),
            },
            required=("records",),
        ),
        "HeldRequest": _obj(
            {
                "lane": _str(),
                "model_id": _str(),
                "state": _str(enum=["queued", "held", "lent"]),
                "waiting_ms": _int(),
                "arrived_at": _num("The node's monotonic clock, in seconds."),
                "pinned": _bool(),
                "returned": _bool("Handed back by a helper."),
                "helper_node_id": _str("Lent requests only."),
                "helper_model_id": _str("Lent requests only."),
            },
            required=("lane", "model_id", "state", "waiting_ms", "arrived_at", "pinned"),
        ),
        "Lease": _obj(
            {
                "lane": _str(enum=["image", "text"]),
                "owner_node_id": _str(),
                "owner_model_id": _str(),
                "helper_node_id": _str(),
                "helper_model_id": _str(),
                "load_helper_model": _bool(),
                "restore_helper_model": _bool(),
                "helper_slots": _int(),
                "ttl_ms": _int(),
                "probe": _bool(),
                "owner_job_ms": _num(),
                "helper_switch_ms": _num(),
                "helper_service_ms": _num(),
                "expires_in_ms": _int(),
            },
            required=(
                "lane",
                "owner_node_id",
                "owner_model_id",
                "helper_node_id",
                "helper_model_id",
                "helper_slots",
                "ttl_ms",
                "expires_in_ms",
            ),
            description="A live lease of the master's plan.",
        ),
        "NodeLending": _obj(
            {
                "node_id": _str(),
                "build_version": _str(),
                "settings_fingerprint": _str(),
                "settings_source": _str("Where the node's settings came from (local, master)."),
                "held_requests": _array(_ref("HeldRequest")),
            },
            required=("node_id", "build_version", "settings_fingerprint", "held_requests"),
        ),
        "OffloadSummary": _obj(
            {
                "master_fingerprint": _str(),
                "nodes": _array(_ref("NodeLending"), "This node first, then every other."),
                "leases": _array(_ref("Lease"), "Empty unless this node is the master."),
                "node_errors": _array(_ref("NodeError")),
            },
            required=("master_fingerprint", "nodes", "leases"),
        ),
    }


def _guardian_schemas() -> dict[str, Schema]:
    guardian = "Public ID of a multimodal text model."
    setting = {"type": ["string", "null"], "description": guardian + " null clears the entry."}
    return {
        "Guardians": _obj(
            {
                "cluster": _nullable("string", "The cluster-wide guardian. " + guardian),
                "nodes": _map(_str(guardian), "Node ID → guardian."),
                "models": _map(_str(guardian), "Public model ID → guardian."),
                "effective": _map(
                    _str(guardian),
                    "Text model's public ID → the guardian that answers its image requests "
                    "(model, then node, then cluster scope).",
                ),
                "candidates": _array(_str(), "The models that may be set as a guardian."),
                "node_errors": _array(
                    _ref("NodeError"), "Slaves the change could not be pushed to."
                ),
            },
            required=("cluster", "nodes", "models", "effective"),
        ),
        "GuardiansUpdate": _obj(
            {
                "cluster": setting,
                "nodes": _map(setting, "Node ID → guardian."),
                "models": _map(setting, "Text model's public ID → guardian."),
            },
            description="Any of the three scopes (at least one); entries not named stay as "
            "they are. Validated whole: a bad entry changes nothing.",
            additional=False,
        ),
    }


def _client_schemas() -> dict[str, Schema]:
    model = _str("Public model ID.", minLength=1)
    return {
        "ChatRequest": _obj(
            {
                "model": model,
                "messages": _array(_map({})),
                "stream": _bool("Answer as text/event-stream.", default=False),
                "max_tokens": _int(),
            },
            required=("model",),
            description="An OpenAI chat request; fields besides the model go to the backend "
            "unchanged.",
        ),
        "CompletionRequest": _obj(
            {
                "model": model,
                "prompt": {"type": ["string", "array"]},
                "stream": _bool("Answer as text/event-stream.", default=False),
                "max_tokens": _int(),
            },
            required=("model",),
        ),
        "EmbeddingsRequest": _obj(
            {
                "model": _str(
                    "Public model ID; without one, a model whose embeddings are loaded answers."
                ),
                "input": {"type": ["string", "array"]},
            },
            required=("input",),
        ),
        "ImageRequest": _obj(
            {
                "model": _str("Public image ID (or the config's model ID).", minLength=1),
                "prompt": _str(),
                "n": _int(minimum=1),
                "size": _str("WIDTHxHEIGHT or auto."),
                "steps": _int(minimum=1),
            },
            required=("model",),
        ),
        "TranscriptionRequest": _obj(
            {
                "file": _str("The audio (WAV).", contentMediaType="audio/wav"),
                "model": _str("Public model ID; without one a free voice model is chosen."),
            },
            required=("file",),
        ),
        "OllamaChatRequest": _obj(
            {
                "model": model,
                "messages": _array(_map({})),
                "stream": _bool("Answer as NDJSON (the default).", default=True),
                "options": _map({}),
                "format": {"type": ["string", "object"]},
            },
            required=("model",),
        ),
        "OllamaGenerateRequest": _obj(
            {
                "model": model,
                "prompt": _str(),
                "system": _str(),
                "images": _array(_str(contentEncoding="base64")),
                "stream": _bool("Answer as NDJSON (the default).", default=True),
                "options": _map({}),
                "format": {"type": ["string", "object"]},
            },
            required=("model",),
        ),
        "OllamaEmbedRequest": _obj(
            {
                "model": model,
                "input": {"anyOf": [_str(), _array(_str(), "At least one text.")]},
            },
            required=("model", "input"),
        ),
        "OllamaEmbeddingsRequest": _obj(
            {"model": model, "prompt": _str()},
            required=("model", "prompt"),
            description="The older single-text form.",
        ),
        "OllamaEmbedAnswer": _obj(
            {
                "model": _str(),
                "embeddings": _array(_array(_num())),
                "total_duration": _int(),
                "load_duration": _int(),
                "prompt_eval_count": _int(),
            },
            required=("model", "embeddings"),
        ),
        "OllamaEmbeddingsAnswer": _obj({"embedding": _array(_num())}, required=("embedding",)),
        "OllamaShowRequest": _obj(
            {"model": _str("Public model ID."), "name": _str("The older name for model.")}
        ),
        "OllamaShowAnswer": _obj(
            {
                "modelfile": _str(),
                "parameters": _str(),
                "template": _str(),
                "details": _map({}),
                "model_info": _map({}, "general.architecture and <family>.context_length."),
                "capabilities": _array(_str(), "completion, vision, embedding."),
                "modified_at": _str(format="date-time"),
            },
            required=("details", "model_info", "capabilities"),
        ),
        "OllamaVersion": _obj({"version": _str()}, required=("version",)),
        "SdModel": _obj(
            {
                "title": _str(),
                "model_name": _str(),
                "filename": _str(),
                "config": _str(),
                "hash": _str(),
                "sha256": _str(),
            },
            required=("title", "model_name"),
        ),
        "Txt2ImgRequest": _obj(
            {
                "prompt": _str(),
                "width": _int(minimum=1),
                "height": _int(minimum=1),
                "steps": _int(minimum=1),
                "batch_size": _int(minimum=1),
                "sd_model_checkpoint": _str("The image model; or in override_settings."),
                "override_settings": _map({}),
            }
        ),
        "KoboldGenerateRequest": _obj(
            {
                "model": _str("Public model ID; without one, the loaded text model."),
                "prompt": _str(),
                "max_length": _int(minimum=1, default=100),
                "sampler_seed": _int(),
                "stop_sequence": {"anyOf": [_str(), _array(_str())]},
            }
        ),
        "BackendAnswer": _obj(
            {"model": _str("The model ID the client asked for.")},
            description="The backend's OpenAI answer, passed through with the client's model ID.",
        ),
        "OpenAIModelList": _obj(
            {
                "object": _str(const="list"),
                "data": _array(
                    _obj(
                        {
                            "id": _str(),
                            "object": _str(const="model"),
                            "created": _int(),
                            "owned_by": _str(),
                        },
                        required=("id", "object", "created", "owned_by"),
                    )
                ),
            },
            required=("object", "data"),
        ),
        "OllamaModel": _obj(
            {
                "name": _str(),
                "model": _str(),
                "modified_at": _str(format="date-time"),
                "size": _int(),
                "digest": _str(),
                "details": _obj({"format": _str(), "family": _str()}),
                "expires_at": _str("/api/ps only."),
                "size_vram": _int("/api/ps only."),
            },
            required=("name", "model", "modified_at", "size", "digest", "details"),
        ),
        "OllamaModelList": _obj({"models": _array(_ref("OllamaModel"))}, required=("models",)),
        "KoboldAnswer": _obj(
            {
                "results": _array(
                    _obj({"text": _str(), "finish_reason": _str()}, required=("text",))
                )
            },
            required=("results",),
        ),
        "Ping": _obj({"status": _str(const="healthy")}, required=("status",)),
    }


def _components() -> Schema:
    schemas: dict[str, Schema] = {}
    for part in (
        _error_schemas(),
        _model_schemas(),
        _state_schemas(),
        _inventory_schemas(),
        _link_schemas(),
        _lending_schemas(),
        _guardian_schemas(),
        _client_schemas(),
    ):
        schemas.update(part)
    return {
        "schemas": schemas,
        "responses": {
            "AdminUnauthorized": _error(
                "`auth.admin_keys` is set and the request carries none of them."
            ),
            "SiteNotFound": _error("On a slave, where site routes do not exist."),
            "BadRequest": _error("The request is invalid; `param` names the field at fault."),
        },
        "securitySchemes": {
            "adminKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "One of `auth.admin_keys`. Checked only when that list is set.",
            },
            "inferenceKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "One of `auth.inference_keys`. Checked only when that list is set.",
            },
        },
    }


# -- management paths ------------------------------------------------------------------------


def _admin_op(
    operation_id: str,
    summary: str,
    ok: Schema,
    *,
    tag: str,
    site: bool = False,
    errors: dict[str, Schema] | None = None,
    parameters: list[Schema] | None = None,
    body: Schema | None = None,
    description: str | None = None,
) -> Schema:
    responses: dict[str, Schema] = {"200": ok}
    if errors:
        responses.update(errors)
    responses["401"] = _response_ref("AdminUnauthorized")
    if site:
        # A site route's own 404s (an unknown node, …) share the status with the slave's.
        responses.setdefault("404", _response_ref("SiteNotFound"))
    op: Schema = {
        "operationId": operation_id,
        "summary": summary,
        "tags": [tag],
        "security": [{"adminKey": []}],
        "responses": responses,
    }
    notes = [text for text in (description, SITE_NOTE if site else None) if text]
    if notes:
        op["description"] = "\n\n".join(notes)
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = body
    return op


def _links_path(lane: str, prefix: str) -> Schema:
    anchor_params = [
        _query("node_id", _str(), "The anchor's node (with model_id)."),
        _query("model_id", _str(), f"The anchor's {lane} model (with node_id)."),
    ]
    delete_params = [
        _query("node_id", _str(), "The anchor's node.", required=True),
        _query("model_id", _str(), f"The anchor's {lane} model.", required=True),
    ]
    return {
        "get": _admin_op(
            f"{prefix}List",
            f"The {lane} links: all of them, or one anchor's with its candidates",
            _json_response(
                "Without a query every link; with node_id and model_id the anchor's links "
                "and every model it could be linked with.",
                {"anyOf": [_ref("LinkList"), _ref("AnchorLinks")]},
            ),
            tag="Site",
            site=True,
            parameters=anchor_params,
            errors={"400": _response_ref("BadRequest")},
        ),
        "post": _admin_op(
            f"{prefix}Set",
            f"Replace the {lane} links of one anchor",
            _json_response("The anchor's links as saved.", _ref("LinkSetResult")),
            tag="Site",
            site=True,
            body=_json_body(_ref("LinkSetRequest")),
            errors={
                "400": _error(
                    "Invalid body, unknown or ineligible model, or different weights without "
                    "acknowledge_different_weights (code different_weights). Nothing is saved."
                )
            },
            description="Takes effect at once: the master runs the new set and pushes it to "
            "every slave.",
        ),
        "delete": _admin_op(
            f"{prefix}Delete",
            f"Remove every {lane} link touching one model",
            _json_response("How many links were removed.", _ref("LinkDeleteResult")),
            tag="Site",
            site=True,
            parameters=delete_params,
            errors={"400": _response_ref("BadRequest")},
        ),
    }


def _management_paths() -> dict[str, Schema]:
    bad = {"400": _response_ref("BadRequest")}
    model_errors = {
        "400": _response_ref("BadRequest"),
        "404": _error("The model is not known (code model_not_found)."),
        "502": _error("The backend or the owning node failed."),
        "503": _error("The owning node is not healthy (code node_unavailable)."),
    }
    settings_doc = _json_response("Every lending setting.", _ref("Settings"))
    decision_params = [
        _query("lane", _str(enum=["image", "text"]), "Only this lane."),
        _query("outcome", _str(), "Only this outcome."),
        _query("kind", _str(), "Only this kind (plan, dispatch, helper, …)."),
        {
            **_query(
                "node_id", _array(_str()), "Only these nodes (repeat the parameter); default all."
            ),
            "style": "form",
            "explode": True,
        },
        _query("limit", _int(minimum=1, default=500), "At most this many rows (capped at 5000)."),
        _query("since_ms", _int(minimum=0), "Only rows recorded at or after this Unix ms."),
    ]
    guardian_errors = {
        "400": _error(
            "A guardian that is not a multimodal text model (code invalid_guardian), an unknown "
            "node or text model, a model set to guard itself, or an unknown field. Nothing is "
            "saved."
        )
    }
    return {
        "/router/v1/schema": {
            "get": {
                "operationId": "schemaGet",
                "summary": "This OpenAPI document",
                "tags": ["Schema"],
                "security": [],
                "responses": {
                    "200": {
                        "description": "The OpenAPI 3.1 document (public, on every role).",
                        "content": {
                            OPENAPI_CONTENT_TYPE: {"schema": {"type": "object"}},
                        },
                    }
                },
            }
        },
        "/router/v1/models": {
            "get": _admin_op(
                "modelsList",
                "Every model record of the cluster view",
                _json_response("The records.", _ref("ModelList")),
                tag="Management",
                description="A slave or standalone node lists its own models.",
            )
        },
        "/router/v1/version": {
            "get": _admin_op(
                "versionGet",
                "Build and cluster protocol versions",
                _json_response("The versions.", _ref("Version")),
                tag="Management",
            )
        },
        "/router/v1/load": {
            "post": _admin_op(
                "modelLoad",
                "Load a model on the node that owns it",
                _json_response("The model is loaded.", _ref("LoadResult")),
                tag="Management",
                body=_json_body(_ref("LoadRequest")),
                errors=model_errors,
            )
        },
        "/router/v1/unload": {
            "post": _admin_op(
                "modelUnload",
                "Unload a model, or empty this node's runtimes",
                _json_response("What was unloaded.", _ref("UnloadResult")),
                tag="Management",
                body=_json_body(_ref("UnloadRequest"), required=False),
                errors=model_errors,
            )
        },
        "/router/v1/site/nodes/state": {
            "get": _admin_op(
                "nodesState",
                "Backends, loaded models, active and held requests of a node",
                _json_response("The node's state.", _ref("NodeState")),
                tag="Site",
                site=True,
                parameters=[_query("node_id", _str(), "Another node to ask; default this node.")],
                errors={
                    "404": _error("The node is not known, or this node is a slave."),
                    "502": _error("The node did not answer."),
                },
            )
        },
        "/router/v1/site/nodes/unload": {
            "post": _admin_op(
                "nodesUnload",
                "Unload one runtime of a node if it still holds the load the caller saw",
                _json_response(
                    "The runtime is unloaded; the answer is that node's fresh state (without "
                    "`cluster`).",
                    _ref("NodeState"),
                ),
                tag="Site",
                site=True,
                body=_json_body(_ref("RuntimeUnloadRequest")),
                errors={
                    "400": _error(
                        "A missing or mistyped field, or a backend or runtime the node does not "
                        "have; `param` names the field."
                    ),
                    "404": _error("The node is not known, or this node is a slave."),
                    "409": _error(
                        "The runtime holds another load now, or nothing (code "
                        "stale_generation): the message says what is loaded; nothing changed."
                    ),
                    "502": _error("The node did not answer."),
                },
                description="Waits for the requests on that runtime to finish, borrowed "
                "(lent-to-this-node) ones included, then stops it. The generation is checked "
                "again after that wait, so a model switched in meanwhile is not unloaded. "
                "Another node's runtime is unloaded by that node, through the master.",
            )
        },
        "/router/v1/site/models/state": {
            "post": _admin_op(
                "modelStateSet",
                "Enable or disable a model on one node",
                _json_response("The node's snapshot after the change.", _ref("NodeSnapshot")),
                tag="Site",
                site=True,
                body=_json_body(_ref("ModelStateRequest")),
                errors={
                    "400": _error("A field is missing or of the wrong type (`param` names it)."),
                    "404": _error(
                        "The node is not known, the model is not a config on it (code "
                        "model_not_found), or this node is a slave."
                    ),
                    "502": _error("The node did not answer."),
                },
                description="Kept in that node's own database, so it survives restarts. A "
                "disabled model that is loaded stays loaded until it is unloaded or replaced; "
                "new requests for it get 404 at once, on the master too.",
            )
        },
        "/router/v1/site/inventory": {
            "get": _admin_op(
                "siteInventory",
                "Every node with its hardware, models and (on request) model files",
                _json_response("The inventory.", _ref("Inventory")),
                tag="Site",
                site=True,
                parameters=[
                    _query(
                        "include_files",
                        _str(enum=["true", "false", "1", "0"], default="false"),
                        "List the files below each node's models.file_roots (capped); "
                        "without it no file is looked at.",
                    )
                ],
                errors={"400": _response_ref("BadRequest")},
                description="The master asks every healthy node at once; a node that fails "
                "has `available: false` and `error` set, and the rest still answers. Memory is "
                "VRAM when nvidia-smi answers, else RAM (Linux), else null with a note.",
            )
        },
        "/router/v1/site/analytics": {
            "get": _admin_op(
                "analyticsList",
                "Recent request or load rows of this node",
                _json_response("Rows, newest first.", _ref("AnalyticsRows")),
                tag="Site",
                site=True,
                parameters=[
                    _query(
                        "kind", _str(enum=["requests", "loads"], default="requests"), "Which rows."
                    ),
                    _query("limit", _int(minimum=1, maximum=5000, default=200), "How many."),
                ],
                errors=bad,
            )
        },
        "/router/v1/site/routing-groups": _links_path("image", "imageLinks"),
        "/router/v1/site/text-routing-groups": _links_path("text", "textLinks"),
        "/router/v1/site/offload/settings": {
            "get": _admin_op(
                "offloadSettingsGet",
                "The lending settings with their layers",
                settings_doc,
                tag="Site",
                site=True,
            ),
            "post": _admin_op(
                "offloadSettingsSet",
                "Store overrides",
                settings_doc,
                tag="Site",
                site=True,
                body=_json_body(_ref("SettingsUpdate")),
                errors={
                    "400": _error("Invalid body, or an unknown key or value (`param` names it).")
                },
                description="Applied at once and pushed to every slave.",
            ),
            "delete": _admin_op(
                "offloadSettingsReset",
                "Remove one override, or all",
                settings_doc,
                tag="Site",
                site=True,
                parameters=[_query("key", _str(), "The setting to reset; default all.")],
                errors={"400": _error("An unknown key.")},
            ),
        },
        "/router/v1/site/offload/decisions": {
            "get": _admin_op(
                "offloadDecisionsList",
                "Lending decisions of every node",
                _json_response("Rows, newest first.", _ref("Decisions")),
                tag="Site",
                site=True,
                parameters=decision_params,
                errors=bad,
            )
        },
        "/router/v1/site/offload/summary": {
            "get": _admin_op(
                "offloadSummaryGet",
                "Each node's build, settings fingerprint and held requests; the live leases",
                _json_response("The summary.", _ref("OffloadSummary")),
                tag="Site",
                site=True,
            )
        },
        "/router/v1/site/guardians": {
            "get": _admin_op(
                "guardiansGet",
                "Guardian models per scope and in effect",
                _json_response("The guardians and the models that may be one.", _ref("Guardians")),
                tag="Site",
                site=True,
            ),
            "post": _admin_op(
                "guardiansSet",
                "Set guardians for any of the three scopes",
                _json_response("The guardians after the change.", _ref("Guardians")),
                tag="Site",
                site=True,
                body=_json_body(_ref("GuardiansUpdate")),
                errors=guardian_errors,
            ),
            "delete": _admin_op(
                "guardiansClear",
                "Clear the guardian of one scope",
                _json_response("The guardians after the change.", _ref("Guardians")),
                tag="Site",
                site=True,
                parameters=[
                    _query(
                        "scope", _str(enum=["cluster", "node", "model"]), "Which.", required=True
                    ),
                    _query("key", _str(), "The node ID or public model ID (node and model)."),
                ],
                errors={"400": _error("An unknown scope, or no key for node or model.")},
            ),
        },
    }


# -- client paths ----------------------------------------------------------------------------


def _client_errors(*, ollama: bool = False, model: bool = True) -> dict[str, Schema]:
    errors = {
        "401": _error("`auth.inference_keys` is set and the request carries none.", ollama=ollama)
    }
    if not model:
        return errors
    errors.update(
        {
            "400": _error(
                "Invalid JSON, no model, or a field the router checks is wrong.", ollama=ollama
            ),
            "404": _error("The model is not known (code model_not_found).", ollama=ollama),
            "413": _error("The body is larger than `server.max_body_bytes`.", ollama=ollama),
            "502": _error("No replica can serve it, or the backend failed.", ollama=ollama),
            "503": _error(
                "The model's node is not healthy (code node_unavailable).", ollama=ollama
            ),
        }
    )
    return errors


def _client_op(
    operation_id: str,
    summary: str,
    tag: str,
    ok: Schema,
    *,
    body: Schema | None = None,
    ollama: bool = False,
) -> Schema:
    op: Schema = {
        "operationId": operation_id,
        "summary": summary,
        "tags": [tag],
        "security": [{"inferenceKey": []}],
        "responses": {"200": ok, **_client_errors(ollama=ollama, model=body is not None)},
    }
    if body is not None:
        op["requestBody"] = body
    return op


def _stream_item(stream_type: str) -> Schema:
    if stream_type == SSE:
        # One server-sent event, as SSE-aware tools parse the stream; `data` holds the
        # backend's JSON chunk (or the final `[DONE]`) with the model ID rewritten.
        return {
            "type": "object",
            "description": "One event of the stream, as the backend sent it.",
            "properties": {
                "data": _str("A JSON chunk, or [DONE] at the end."),
                "event": _str(),
                "id": _str(),
            },
        }
    return _str("The stream, one JSON record per line, as the backend sent it.")


def _streaming(description: str, json_schema: Schema, stream_type: str) -> Schema:
    return {
        "description": description,
        "content": {
            JSON: {"schema": json_schema},
            stream_type: {"schema": _stream_item(stream_type)},
        },
    }


def _client_paths() -> dict[str, Schema]:
    answer = _ref("BackendAnswer")
    openai_stream = "The answer; with stream: true, as text/event-stream."
    ollama_stream = "The answer; as NDJSON unless stream is false."
    return {
        "/ping": {
            "get": {
                "operationId": "ping",
                "summary": "Health check",
                "tags": ["Client"],
                "security": [],
                "responses": {"200": _json_response("The router is up.", _ref("Ping"))},
            }
        },
        "/v1/models": {
            "get": _client_op(
                "openaiModels",
                "Text and embeddings models",
                "Client: OpenAI",
                _json_response("The models.", _ref("OpenAIModelList")),
            )
        },
        "/v1/chat/completions": {
            "post": _client_op(
                "openaiChat",
                "Chat completion",
                "Client: OpenAI",
                _streaming(openai_stream, answer, SSE),
                body=_json_body(_ref("ChatRequest")),
            )
        },
        "/v1/completions": {
            "post": _client_op(
                "openaiCompletion",
                "Text completion",
                "Client: OpenAI",
                _streaming(openai_stream, answer, SSE),
                body=_json_body(_ref("CompletionRequest")),
            )
        },
        "/v1/embeddings": {
            "post": _client_op(
                "openaiEmbeddings",
                "Embeddings",
                "Client: OpenAI",
                _json_response("The embeddings.", answer),
                body=_json_body(_ref("EmbeddingsRequest")),
            )
        },
        "/v1/images/generations": {
            "post": _client_op(
                "openaiImages",
                "Image generation",
                "Client: OpenAI",
                _json_response("The images.", answer),
                body=_json_body(_ref("ImageRequest")),
            )
        },
        "/v1/audio/transcriptions": {
            "post": _client_op(
                "openaiTranscription",
                "Speech to text",
                "Client: OpenAI",
                _json_response("The transcription.", answer),
                body={
                    "required": True,
                    "content": {"multipart/form-data": {"schema": _ref("TranscriptionRequest")}},
                },
            )
        },
        "/api/chat": {
            "post": _client_op(
                "ollamaChat",
                "Ollama chat",
                "Client: Ollama",
                _streaming(ollama_stream, _map({}), NDJSON),
                body=_json_body(_ref("OllamaChatRequest")),
                ollama=True,
            )
        },
        "/api/generate": {
            "post": _client_op(
                "ollamaGenerate",
                "Ollama generate",
                "Client: Ollama",
                _streaming(ollama_stream, _map({}), NDJSON),
                body=_json_body(_ref("OllamaGenerateRequest")),
                ollama=True,
            )
        },
        "/api/tags": {
            "get": _client_op(
                "ollamaTags",
                "Ollama model list",
                "Client: Ollama",
                _json_response("The models.", _ref("OllamaModelList")),
                ollama=True,
            )
        },
        "/api/ps": {
            "get": _client_op(
                "ollamaPs",
                "Ollama loaded models",
                "Client: Ollama",
                _json_response("The loaded models.", _ref("OllamaModelList")),
                ollama=True,
            )
        },
        "/api/embed": {
            "post": _client_op(
                "ollamaEmbed",
                "Ollama embeddings",
                "Client: Ollama",
                _json_response("The embeddings.", _ref("OllamaEmbedAnswer")),
                body=_json_body(_ref("OllamaEmbedRequest")),
                ollama=True,
            )
        },
        "/api/embeddings": {
            "post": _client_op(
                "ollamaEmbeddings",
                "Ollama embeddings, the older single-text form",
                "Client: Ollama",
                _json_response("The embedding.", _ref("OllamaEmbeddingsAnswer")),
                body=_json_body(_ref("OllamaEmbeddingsRequest")),
                ollama=True,
            )
        },
        "/api/show": {
            "post": _client_op(
                "ollamaShow",
                "Ollama model details (context length, capabilities), from the records",
                "Client: Ollama",
                _json_response("The details.", _ref("OllamaShowAnswer")),
                body=_json_body(_ref("OllamaShowRequest")),
                ollama=True,
            )
        },
        "/api/version": {
            "get": _client_op(
                "ollamaVersion",
                "The router's version, as Ollama reports its own",
                "Client: Ollama",
                _json_response("The version.", _ref("OllamaVersion")),
            )
        },
        "/sdapi/v1/sd-models": {
            "get": _client_op(
                "sdModels",
                "Image models, as the AUTOMATIC1111 API lists them",
                "Client: images",
                _json_response("The image models.", _array(_ref("SdModel"))),
            )
        },
        "/sdapi/v1/txt2img": {
            "post": _client_op(
                "sdTxt2Img",
                "Image generation, AUTOMATIC1111 style",
                "Client: images",
                _json_response("The images.", _ref("BackendAnswer")),
                body=_json_body(_ref("Txt2ImgRequest")),
            )
        },
        "/api/v1/generate": {
            "post": _client_op(
                "koboldGenerate",
                "Kobold generate",
                "Client: Kobold",
                _json_response("The text.", _ref("KoboldAnswer")),
                body=_json_body(_ref("KoboldGenerateRequest")),
            )
        },
    }


# -- the document ----------------------------------------------------------------------------


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document (callers may change it)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Cluster router",
            "version": settings.ROUTER_VERSION,
            "description": (
                "The client inference API (OpenAI, Ollama and Kobold paths, answered with the "
                "model ID the client asked for) and the management API under /router/v1/. "
                "The node protocol under /router/v1/node/ is internal to a cluster and not "
                "described."
            ),
        },
        "tags": [
            {"name": "Client", "description": "Health."},
            {"name": "Client: OpenAI", "description": "OpenAI-compatible inference."},
            {"name": "Client: images", "description": "AUTOMATIC1111-style image paths."},
            {
                "name": "Client: Ollama",
                "description": 'Ollama paths; errors are {"error": "…"}.',
            },
            {"name": "Client: Kobold", "description": "KoboldCpp's generate API."},
            {"name": "Management", "description": "This node's models (admin keys)."},
            {"name": "Site", "description": SITE_NOTE},
            {"name": "Schema", "description": "This document."},
        ],
        "paths": {**_client_paths(), **_management_paths()},
        "components": _components(),
    }


@cache
def openapi_bytes() -> bytes:
    """The serialized document, built once per process (it depends only on the build)."""
    return orjson.dumps(openapi_document())


@csrf_exempt
async def schema(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        # The same answer as every other management route gives a method it does not serve.
        return JsonResponse(error_envelope("endpoint not found", type="not_found"), status=404)
    return HttpResponse(openapi_bytes(), content_type=OPENAPI_CONTENT_TYPE)
