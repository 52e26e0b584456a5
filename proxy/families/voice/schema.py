"""OpenAPI paths of the voice family, joined by `proxy.api.client_paths`."""

from __future__ import annotations

from typing import Any

from proxy.families.openapi import (
    _array,
    _bool,
    _client_errors,
    _client_op,
    _error,
    _json_body,
    _json_response,
    _obj,
    _ref,
    _str,
)

Schema = dict[str, Any]

TAG = "Client: voice"
AUDIO_TYPES = ("audio/wav", "audio/mpeg", "audio/ogg", "audio/flac", "application/octet-stream")
MODEL_SELECTOR = (
    "Public model ID. Without one (and without ?model= or X-Tensors-Model), the cluster's "
    "only model that speaks."
)


def _audio_response(description: str) -> Schema:
    binary = {"schema": _str(contentMediaType="application/octet-stream")}
    return {"description": description, "content": {kind: binary for kind in AUDIO_TYPES}}


def _speech_request(text_field: str) -> Schema:
    return _obj(
        {
            "model": _str(MODEL_SELECTOR, minLength=1),
            text_field: _str("The text to speak.", minLength=1),
            "voice": _str("A voice the backend knows (see /v1/audio/voices)."),
            "response_format": _str("The audio format, as the backend supports it."),
        },
        required=(text_field,),
    )


def _model_query() -> list[Schema]:
    return [
        {
            "name": "model",
            "in": "query",
            "required": False,
            "schema": _str(MODEL_SELECTOR),
        }
    ]


def _get_op(operation_id: str, summary: str, ok: Schema) -> Schema:
    op = _client_op(operation_id, summary, TAG, ok)
    # A GET names its model in the query; the model errors apply as to a body.
    op["responses"].update(_client_errors())
    op["responses"].pop("413", None)
    op["parameters"] = _model_query()
    return op


def _transcription_body() -> Schema:
    return {
        "required": True,
        "content": {"multipart/form-data": {"schema": _ref("TranscriptionRequest")}},
    }


def paths() -> dict[str, Schema]:
    """The family's client paths, keyed as in `proxy.edge.routes.ROUTES`."""
    text = _obj({"text": _str("What was said.")}, description="The backend's answer.")
    voices = _obj(
        {
            "model": _str("The public model ID."),
            "voices": _array(_str(), "The voices, as the backend names them."),
        },
        description="The backend's voice list, passed through with the public model ID.",
    )
    realtime = _client_op(
        "openaiRealtime",
        "Realtime session (WebSocket)",
        TAG,
        {"description": "Not answered: see 101."},
    )
    realtime["description"] = (
        "A WebSocket relayed to the backend serving `?model=`, pinned to one node for the "
        "session. Text and binary frames pass both ways; close codes pass both ways. The key "
        "is `Authorization: Bearer`, or the `openai-insecure-api-key.<key>` subprotocol. A "
        "session that cannot start gets one `error` event and close code 4000 + the HTTP "
        "status (4400 no model, 4404 unknown model, 4502/4503 backend or node unavailable)."
    )
    realtime["parameters"] = [
        {"name": "model", "in": "query", "required": True, "schema": _str("Public model ID.")}
    ]
    responses = realtime["responses"]
    responses.pop("200")
    responses["101"] = {"description": "Switching Protocols: the WebSocket session."}
    responses["426"] = _error("A GET without the WebSocket upgrade (code upgrade_required).")
    return {
        "/v1/audio/speech": {
            "post": _client_op(
                "openaiSpeech",
                "Text to speech",
                TAG,
                _audio_response("The audio, as the backend made it."),
                body=_json_body(_speech_request("input")),
            )
        },
        "/v1/audio/translations": {
            "post": _client_op(
                "openaiTranslation",
                "Speech to English text",
                TAG,
                _json_response("The translation.", text),
                body=_transcription_body(),
            )
        },
        "/v1/audio/voices": {
            "get": _get_op(
                "openaiVoices", "Voices of a speech model", _json_response("The voices.", voices)
            )
        },
        "/audio/voices": {
            "get": _get_op(
                "audioVoices",
                "Voices of a speech model (short path)",
                _json_response("The voices.", voices),
            )
        },
        "/api/extra/tts": {
            "post": _client_op(
                "koboldTts",
                "Kobold text to speech",
                TAG,
                _audio_response("The audio (WAV), as the backend made it."),
                body=_json_body(_speech_request("input")),
            )
        },
        "/api/extra/transcribe": {
            "post": _client_op(
                "koboldTranscribe",
                "Kobold speech to text",
                TAG,
                _json_response("The transcription.", text),
                body=_json_body(
                    _obj(
                        {
                            "model": _str(
                                "Public model ID; without one a voice model is chosen (§5.3)."
                            ),
                            "audio_data": _str(
                                "The audio: a base64 WAV file, or a data: URL of one.",
                                minLength=1,
                            ),
                            "prompt": _str(),
                            "suppress_non_speech": _bool(),
                            "langcode": _str(),
                        },
                        required=("audio_data",),
                    )
                ),
            )
        },
        "/v1/realtime": {"get": realtime},
    }
