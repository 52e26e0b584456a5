"""The OpenAPI vocabulary of the client paths: the part no generator can read.

The proxy serves the client paths itself, ahead of Django (`proxy.edge.routes.ROUTES`), so they
are described by hand: each family's `schema` module describes its own paths with the helpers
here, over the shared components (`client_components`); `proxy.api.client_paths` joins them and
`proxy.api.schema` merges them into the document drf-spectacular generates from the management
views. `tests/test_openapi.py` keeps it in step with `ROUTES` and with real answers.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"

TAGS: list[Schema] = [
    {"name": "Client", "description": "Health."},
    {"name": "Client: OpenAI", "description": "OpenAI-compatible inference."},
    {"name": "Client: images", "description": "AUTOMATIC1111-style image paths."},
    {"name": "Client: Ollama", "description": 'Ollama paths; errors are {"error": "…"}.'},
    {"name": "Client: Kobold", "description": "KoboldCpp's generate API."},
]
INFERENCE_KEY: Schema = {
    "type": "http",
    "scheme": "bearer",
    "description": "One of `auth.inference_keys`, or a stored key (`rk-…`, any role). Checked "
    "only when either exists.",
}

# -- small builders --------------------------------------------------------------------------


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


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
                "messages": _array(
                    _map({}),
                    "Empty or absent: only load the model (unload it with keep_alive 0). "
                    "Assistant messages may carry tool_calls, and a tool message names its "
                    "tool by tool_name.",
                ),
                "tools": _array(_map({}), "Functions the model may call (OpenAI's schema)."),
                "think": {
                    "anyOf": [_bool(), _str(enum=["low", "medium", "high"])],
                    "description": "Ask a thinking model to think (or not).",
                },
                "keep_alive": {
                    "type": ["string", "number"],
                    "description": "0 unloads the model once answered.",
                },
                "stream": _bool("Answer as NDJSON (the default).", default=True),
                "options": _map({}),
                "format": {"type": ["string", "object"]},
            },
            required=("model",),
        ),
        "OllamaGenerateRequest": _obj(
            {
                "model": model,
                "prompt": _str("Empty or absent: only load the model."),
                "system": _str(),
                "images": _array(_str(contentEncoding="base64")),
                "think": {"anyOf": [_bool(), _str(enum=["low", "medium", "high"])]},
                "keep_alive": {
                    "type": ["string", "number"],
                    "description": "0 unloads the model once answered.",
                },
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
        "OpenAIModel": _obj(
            {
                "id": _str(),
                "object": _str(const="model"),
                "created": _int(),
                "owned_by": _str(),
            },
            required=("id", "object", "created", "owned_by"),
        ),
        "KoboldModel": _obj(
            {"result": _str("`koboldcpp/<model>`, or `ReadOnly` when no one model is meant.")},
            required=("result",),
        ),
        "KoboldVersion": _obj(
            {
                "result": _str(const="KoboldCpp"),
                "version": _str(),
                "protected": _bool("Whether an inference key is needed."),
                "txt2img": _bool(),
                "vision": _bool(),
                "transcribe": _bool(),
                "embeddings": _bool(),
                "multiplayer": _bool(),
                "websearch": _bool(),
                "tts": _bool(),
            },
            required=("result", "version"),
        ),
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
        "Healthz": _obj(
            {"status": _str(const="ok"), "node_id": _str()}, required=("status", "node_id")
        ),
        "Readyz": _obj(
            {
                "status": _str(enum=["ready", "not_ready"]),
                "node_id": _str(),
                "role": _str(enum=["standalone", "master", "slave"]),
                "checks": _map(
                    _str(),
                    "Each check (database, registry, and on a slave registered): `ok` or why "
                    "it failed.",
                ),
            },
            required=("status", "node_id", "role", "checks"),
        ),
    }


# -- paths -----------------------------------------------------------------------------------


def _client_errors(*, ollama: bool = False, model: bool = True) -> dict[str, Schema]:
    errors = {
        "401": _error(
            "Keys are required (`auth.inference_keys` or stored keys exist) and the request "
            "carries no valid one (unknown, revoked or expired).",
            ollama=ollama,
        ),
        "403": _error(
            "The client is outside `server.allowed_cidrs` (address_not_allowed), or the "
            "request's key may not use the model it names (model_not_allowed).",
            ollama=ollama,
        ),
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
            "429": _error(
                "The request's stored key is over its `rpm` or `tpm` (rate_limited) or its "
                "`max_concurrent` (too_many_concurrent), counted across the cluster; with "
                "`Retry-After` and the `x-ratelimit-*` headers (README, Limits).",
                ollama=ollama,
            ),
            "502": _error("No replica can serve it, or the backend failed.", ollama=ollama),
            "503": _error(
                "The model's node is not healthy (code node_unavailable).", ollama=ollama
            ),
        }
    )
    return errors


def anthropic_errors(op: Schema) -> Schema:
    """`op` with its error answers in Anthropic's envelope (its paths answer errors so)."""
    for status, answer in op["responses"].items():
        if status[0] in "45":
            answer["content"][JSON]["schema"] = _ref("AnthropicError")
    return op


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


# -- the part ----------------------------------------------------------------------------------


def client_components() -> dict[str, Schema]:
    """The schemas the client paths refer to, and the envelope Ollama's paths answer with."""
    return {
        "OllamaError": _obj(
            {"error": _str("What went wrong.")},
            required=("error",),
            description="The error body on Ollama paths (/api/chat, /api/generate, /api/tags, "
            "/api/ps).",
        ),
        "AnthropicError": _obj(
            {
                "type": _str("Always `error`."),
                "error": _obj(
                    {
                        "type": _str("Anthropic's error type for the status (not_found_error…)."),
                        "message": _str("What went wrong."),
                        "details": _obj(
                            {
                                "error_code": _str("The router's stable code (model_not_found…)."),
                                "param": _str("The field at fault."),
                            }
                        ),
                    },
                    required=("type", "message"),
                ),
            },
            required=("type", "error"),
            description="The error body on Anthropic's paths (/v1/messages and its token count).",
        ),
        **_client_schemas(),
    }
