"""The client paths of the OpenAPI document, keyed as in `proxy.edge.routes.ROUTES`: the
operator's probes and the core text, image and transcription paths here, then the rest of each
family's own (`proxy.families.<family>.schema`)."""

from __future__ import annotations

from proxy.families.media import schema as media_schema
from proxy.families.openapi import (
    NDJSON,
    SSE,
    Schema,
    _array,
    _client_errors,
    _client_op,
    _error,
    _json_body,
    _json_response,
    _map,
    _ref,
    _str,
    _streaming,
)
from proxy.families.text import schema as text_schema
from proxy.families.voice import schema as voice_schema


def client_paths() -> dict[str, Schema]:
    """The client paths, keyed as in `ROUTES`."""
    answer = _ref("BackendAnswer")
    openai_stream = "The answer; with stream: true, as text/event-stream."
    ollama_stream = "The answer; as NDJSON unless stream is false."
    families = {**text_schema.paths(), **media_schema.paths(), **voice_schema.paths()}
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
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness: the process serves",
                "tags": ["Operations"],
                "security": [],
                "responses": {"200": _json_response("The process serves.", _ref("Healthz"))},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: database, migrations, startup, registration",
                "tags": ["Operations"],
                "security": [],
                "responses": {
                    "200": _json_response("Ready for traffic.", _ref("Readyz")),
                    "503": _json_response("Not ready; `checks` says why.", _ref("Readyz")),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics of this node (and the cluster, on a master)",
                "tags": ["Operations"],
                "security": [{"adminKey": []}],
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format 0.0.4.",
                        "content": {"text/plain": {"schema": _str()}},
                    },
                    "401": _error("An admin key is set and none was given."),
                },
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
        "/v1/models/{model}": {
            "get": {
                **_client_op(
                    "openaiModel",
                    "One model (the OpenAI SDK's models.retrieve)",
                    "Client: OpenAI",
                    _json_response("The model.", _ref("OpenAIModel")),
                ),
                "parameters": [
                    {
                        "name": "model",
                        "in": "path",
                        "required": True,
                        "schema": _str("Public model ID."),
                    }
                ],
                "responses": {
                    "200": _json_response("The model.", _ref("OpenAIModel")),
                    **_client_errors(),
                    "404": _error("No such model (code model_not_found)."),
                },
            }
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
        "/api/v1/model": {
            "get": _client_op(
                "koboldModel",
                "The model a Kobold generate without a model runs",
                "Client: Kobold",
                _json_response("The model.", _ref("KoboldModel")),
            )
        },
        "/api/extra/version": {
            "get": _client_op(
                "koboldVersion",
                "What KoboldCpp clients check on connect: name, version, features",
                "Client: Kobold",
                _json_response("The server.", _ref("KoboldVersion")),
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
        **families,
    }
