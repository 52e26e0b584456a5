"""OpenAPI paths of the text family, joined by `proxy.api.client_paths`."""

from __future__ import annotations

from typing import Any

from proxy.families.openapi import (
    JSON,
    SSE,
    _client_errors,
    _client_op,
    _error,
    _int,
    _json_body,
    _json_response,
    _obj,
    _ref,
    _str,
    _streaming,
    anthropic_errors,
)

Schema = dict[str, Any]

TEXT_TAG = "Client: OpenAI"
KOBOLD_TAG = "Client: Kobold"
EMBED_TAG = "Client: embeddings"
MUSIC_TAG = "Client: music"


def _model_body(description: str) -> Schema:
    """A JSON body the router reads only the model of; the rest goes to the backend as is."""
    return _json_body(
        {
            **_obj({"model": _str(description, minLength=1)}, required=("model",)),
            "additionalProperties": True,
        }
    )


def _path_param(name: str, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": _str(description)}


def _text_op(operation_id: str, summary: str, *, stream: bool = True) -> Schema:
    answer = _ref("BackendAnswer")
    ok = (
        _streaming("The backend's answer; with stream: true, as text/event-stream.", answer, SSE)
        if stream
        else _json_response("The backend's answer.", answer)
    )
    return _client_op(
        operation_id,
        summary,
        TEXT_TAG,
        ok,
        body=_model_body("Public model ID of a text model."),
    )


def _embeddings_op(operation_id: str, summary: str) -> Schema:
    body = _json_body(
        {
            **_obj(
                {
                    "model": _str(
                        "Public model ID; without one, the loaded embedding models take turns."
                    )
                }
            ),
            "additionalProperties": True,
        }
    )
    return _client_op(
        operation_id,
        summary,
        EMBED_TAG,
        _json_response("The backend's answer.", _ref("BackendAnswer")),
        body=body,
    )


def _followup(operation_id: str, summary: str) -> Schema:
    op = _client_op(
        operation_id,
        summary,
        TEXT_TAG,
        _json_response("The stored response, as its backend answers.", _ref("BackendAnswer")),
    )
    op["parameters"] = [_path_param("response_id", "A response ID the router handed out.")]
    op["responses"]["404"] = _error(
        "No response with this ID was created through this router (code response_not_found)."
    )
    op["responses"]["502"] = _error("The node or backend holding the response is not available.")
    return op


def _music_op(operation_id: str, summary: str, *, templated: bool) -> Schema:
    op: Schema = {
        "operationId": operation_id,
        "summary": summary,
        "description": "Served by the model named by `?model=` or `X-Tensors-Model` (or a JSON "
        "body's `model`), else by the loaded text model, as a Kobold generate without a model.",
        "tags": [MUSIC_TAG],
        "security": [{"inferenceKey": []}],
        "responses": {
            "200": {
                "description": "The backend's answer, copied as it is.",
                "content": {"text/html": {"schema": _str()}, JSON: {"schema": {}}},
            },
            **_client_errors(),
        },
    }
    if templated:
        op["parameters"] = [_path_param("path", "The rest of the backend's music path.")]
    return op


def paths() -> dict[str, Schema]:
    """The family's client paths, keyed as in `proxy.edge.routes.ROUTES`."""
    catch_all_post = _text_op("textOther", "Any other /v1 text path, sent to the model's backend")
    catch_all_post["parameters"] = [_path_param("path", "The rest of the path.")]
    catch_all_get = {
        "operationId": "textOtherGet",
        "summary": "A GET on a /v1 path no family serves",
        "tags": [TEXT_TAG],
        "security": [{"inferenceKey": []}],
        "parameters": [_path_param("path", "The rest of the path.")],
        "responses": {
            "404": _error("Endpoint not found (type not_found)."),
            **_client_errors(model=False),
        },
    }
    kobold_body = _json_body(_ref("KoboldGenerateRequest"))
    genkey_body = _json_body(_obj({"genkey": _str("The genkey the generate carried.")}))
    out: dict[str, Schema] = {
        "/v1/{path}": {"get": catch_all_get, "post": catch_all_post},
        "/v1/responses": {"post": _text_op("responsesCreate", "Create a response (Responses API)")},
        "/v1/responses/input_tokens": {
            "post": _text_op(
                "responsesInputTokens", "Count a response's input tokens", stream=False
            )
        },
        "/v1/responses/{response_id}": {
            "get": _followup("responsesGet", "A stored response, from the node that created it"),
            "delete": _followup("responsesDelete", "Delete a stored response"),
        },
        "/v1/responses/{response_id}/cancel": {
            "post": _followup("responsesCancel", "Cancel a background response"),
        },
        "/v1/messages": {
            "post": anthropic_errors(_text_op("anthropicMessages", "Anthropic-style messages"))
        },
        "/v1/messages/count_tokens": {
            "post": anthropic_errors(
                _text_op("anthropicCountTokens", "Count a message's tokens", stream=False)
            )
        },
        "/v1/rerank": {
            "post": _embeddings_op(
                "rerankV1",
                "Rerank: by the embeddings backend for a model that only embeds (or when no "
                "model is named), by the text backend otherwise",
            )
        },
        "/v1/reranking": {"post": _text_op("reranking", "Rerank (text backend)", stream=False)},
        "/api/extra/generate/stream": {
            "post": _client_op(
                "koboldGenerateStream",
                "Kobold generate, streamed as token events",
                KOBOLD_TAG,
                {
                    "description": "Token events: `event: message`, data `{token, finish_reason}`.",
                    "content": {SSE: {"schema": _str()}},
                },
                body=kobold_body,
            )
        },
        "/api/extra/tokencount": {
            "post": _client_op(
                "koboldTokenCount",
                "Kobold token count",
                KOBOLD_TAG,
                _json_response(
                    "The count and the token IDs.",
                    _obj({"value": _int(), "ids": {"type": "array", "items": _int()}}),
                ),
                body=_json_body(
                    _obj({"prompt": _str(), "model": _str("Public model ID (optional).")})
                ),
            )
        },
        "/api/extra/generate/check": {
            method: _client_op(
                f"koboldGenerateCheck{method.capitalize()}",
                "The text so far of the Kobold generation a genkey names",
                KOBOLD_TAG,
                _json_response(
                    "`results[0].text`: empty when no generation of this key runs under it.",
                    _obj({"results": {"type": "array", "items": _obj({"text": _str()})}}),
                ),
                body=genkey_body if method == "post" else None,
            )
            for method in ("get", "post")
        },
        "/api/extra/abort": {
            "post": _client_op(
                "koboldAbort",
                "Stop the Kobold generation a genkey names (its generate answers the text so far)",
                KOBOLD_TAG,
                _json_response(
                    '`success` "true" when one of this key\'s generations ran under it.',
                    _obj({"success": _str(), "done": _str()}),
                ),
                body=genkey_body,
            )
        },
        "/musicui": {"get": _music_op("musicUi", "The music UI", templated=False)},
        "/musicui/{path}": {
            "get": _music_op("musicUiPath", "The music UI's files", templated=True)
        },
        "/api/extra/music/{path}": {
            "get": _music_op("musicApiGet", "The music API", templated=True),
            "post": _music_op("musicApiPost", "The music API", templated=True),
        },
    }
    summaries = {
        "/v2/embed": ("embedV2", "Embed (Cohere-style)"),
        "/api/extra/embeddings": ("koboldEmbeddings", "Kobold embeddings"),
        "/rerank": ("rerank", "Rerank"),
        "/v2/rerank": ("rerankV2", "Rerank (v2)"),
        "/classify": ("classify", "Classify"),
        "/score": ("score", "Score"),
        "/v1/score": ("scoreV1", "Score (v1)"),
        "/pooling": ("pooling", "Pooling"),
    }
    for path, (operation_id, summary) in summaries.items():
        out[path] = {"post": _embeddings_op(operation_id, summary)}
    return out
