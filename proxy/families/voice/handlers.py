"""Voice path families: speech, translations, voices, Kobold TTS and transcription.

`ROUTES` is joined into the client table by `proxy.edge.routes`; the `/v1/realtime` WebSocket
is `proxy.edge.realtime` (its route here only answers a plain GET, which cannot upgrade).

Speech (TTS) runs on models whose config has a TTS model (`has_tts`), on the text-side
readiness lane, as the spec says of speech routes. Speech-to-text keeps what
`/v1/audio/transcriptions` does: the whisper lane, and with no model named, the selector-less
scheduling of `proxy.families.voice.stt` (reference-cluster §5.3).

A model is named, first found wins: the JSON body's `model` (the multipart field for audio
uploads), the query's `?model=`, the `X-Tensors-Model` header. Speech and voices that name none
go to the one model that speaks, when there is exactly one.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp
import orjson

from proxy import work
from proxy.families.voice import stt
from proxy.forwarding.local import Job, shape_openai
from proxy.node import Node
from proxy.request import JSON, SSE, Ctx, parse_json_body
from proxy.serving.core import GET, MODEL_HEADER, POST, Route, failover, serve_named, serve_on
from registry.cluster import Replica
from registry.routing import resolve
from routerproject.errors import RouterError

REALTIME_PATH = "/v1/realtime"


def named_model(ctx: Ctx, doc: dict[str, Any] | None = None) -> Any:
    """The model the request names (body, then query, then header); None when it names none."""
    if doc is not None and doc.get("model") not in (None, ""):
        return doc["model"]
    query = ctx.scope.get("query_string", b"").decode("latin-1")
    for key, value in parse_qsl(query):
        if key == "model" and value.strip():
            return value.strip()
    header = ctx.header(MODEL_HEADER)
    if header is not None and header.strip():
        return header.decode("latin-1").strip()
    return None


def _speakers(node: Node) -> list[str]:
    return sorted(
        public_id
        for public_id, replicas in node.cluster.by_public_id.items()
        if any(r.record.get("has_tts") and not r.record.get("disabled") for r in replicas)
    )


def speaker_for(ctx: Ctx, node: Node, doc: dict[str, Any] | None = None) -> str:
    """The speech model a request names, or the cluster's only one when it names none."""
    model = named_model(ctx, doc)
    if model is None:
        # KoboldCpp clients and the voices list rarely name a model: with one model that
        # speaks there is nothing to choose; with several the client must say which.
        speakers = _speakers(node)
        if len(speakers) != 1:
            raise RouterError(400, "model is required", param="model")
        model = speakers[0]
    if not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    return model


async def shape_speech(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
    """Audio passes through chunk by chunk as the backend makes it (a long text's first words
    play before its last are spoken); JSON and SSE answers are shaped as OpenAI answers."""
    ctype = resp.headers.get("Content-Type", "application/octet-stream").encode("latin-1")
    if ctype.startswith((JSON, SSE)):
        await shape_openai(ctx, job, resp)
        return
    headers = [(b"content-type", ctype)]
    length = resp.headers.get("Content-Length")
    if length is not None and length.isdigit():
        headers.append((b"content-length", length.encode()))
    await ctx.start(resp.status, headers)
    async for chunk in resp.content.iter_any():
        await ctx.chunk(chunk)
    await ctx.end()


async def handle_speech(ctx: Ctx, node: Node) -> None:
    """`POST /v1/audio/speech` and Kobold's `/api/extra/tts`: text in, audio bytes out.

    The audio passes through as the backend sent it (any content type, never rewritten); a
    JSON answer (an error) has its model ID rewritten like any text-lane answer.
    """
    doc = parse_json_body(ctx)
    text = doc.get("input")
    if not isinstance(text, str) or not text.strip():
        raise RouterError(400, "input is required: the text to speak", param="input")
    model = ctx.model = speaker_for(ctx, node, doc)
    body = ctx.body
    if doc.get("model") != model:
        # Named by query or header, or chosen here: the backend and a holder node read the
        # body, so the choice goes there.
        body = orjson.dumps({**doc, "model": model})
    # Speech rides the text lane but no text helper speaks: never lent.
    await serve_named(
        ctx, node, model, kind="speech", body=body, shape=shape_speech, lendable=False
    )


async def handle_transcriptions(ctx: Ctx, node: Node) -> None:
    ctype = ctx.header(b"content-type") or b"application/octet-stream"
    if not ctx.body:
        raise RouterError(400, "an audio file is required", param="file")
    audio = work.multipart_field(ctx.body, ctype.decode("latin-1"), "file")
    if not audio:
        raise RouterError(400, "an audio file is required", param="file")
    try:
        # Speech-to-text takes WAV only: refuse anything else here rather than load a
        # whisper model for a request it must refuse anyway.
        work.wav_duration_seconds(audio)
    except ValueError as exc:
        raise RouterError(400, "file must be a WAV (RIFF/WAVE) audio file", param="file") from exc
    model_field = work.multipart_field(ctx.body, ctype.decode("latin-1"), "model")
    model = model_field.decode("utf-8", "replace").strip() if model_field else ""
    if model:
        ctx.model = model
        replica = resolve(node, model, "voice", borrowed=ctx.borrowed)

        def serve(target: Replica) -> Awaitable[None]:
            body = ctx.body
            if target.local_id != model:
                body = work.replace_multipart_model(ctx.body, model, target.local_id)
            return serve_on(
                ctx,
                node,
                target,
                kind="voice",
                public_id=model,
                path=ctx.path,
                body=body,
                shape=shape_openai,
                content_type=ctype,
            )

        await failover(ctx, node, model, "voice", replica, serve)
        return
    async with stt.reserve(node) as replica:
        await serve_on(
            ctx,
            node,
            replica,
            kind="voice",
            public_id=replica.public_id,
            path=ctx.path,
            body=ctx.body,
            shape=shape_openai,
            content_type=ctype,
        )


def _kobold_audio(doc: dict[str, Any]) -> bytes:
    """The WAV bytes of Kobold's `audio_data` (base64, optionally as a data: URL)."""
    value = doc.get("audio_data")
    if not isinstance(value, str) or not value.strip():
        raise RouterError(400, "audio_data is required: a base64 WAV file", param="audio_data")
    if value.startswith("data:"):
        value = value.partition(",")[2]
    try:
        audio = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RouterError(400, "audio_data is not valid base64", param="audio_data") from exc
    try:
        work.wav_duration_seconds(audio)
    except ValueError as exc:
        raise RouterError(
            400, "audio_data must be a WAV (RIFF/WAVE) audio file", param="audio_data"
        ) from exc
    return audio


async def handle_kobold_transcribe(ctx: Ctx, node: Node) -> None:
    """`POST /api/extra/transcribe`: Kobold's JSON speech-to-text (base64 WAV in `audio_data`).

    With a model named it goes to that model's replica; with none, to the one the STT
    scheduler picks (§5.3), and the pick is written into the body so that the node holding it
    serves exactly that one.
    """
    doc = parse_json_body(ctx)
    _kobold_audio(doc)  # WAV only: refused before any whisper model loads for it
    model = named_model(ctx, doc)
    if model is not None:
        if not isinstance(model, str):
            raise RouterError(400, "model must be a string", param="model")
        ctx.model = model
        body = orjson.dumps({**doc, "model": model}) if doc.get("model") != model else ctx.body
        await serve_named(ctx, node, model, kind="voice", body=body, shape=shape_openai)
        return
    async with stt.reserve(node) as picked:
        ctx.model = picked.public_id
        await serve_on(
            ctx,
            node,
            picked,
            kind="voice",
            public_id=picked.public_id,
            path=ctx.path,
            body=orjson.dumps({**doc, "model": picked.public_id}),
            shape=shape_openai,
        )


async def handle_voices(ctx: Ctx, node: Node) -> None:
    """`GET /v1/audio/voices` and `/audio/voices`: the voices of the model named (or the only
    model that speaks), as its backend lists them."""
    model = ctx.model = speaker_for(ctx, node)
    replica = resolve(node, model, "speech", borrowed=ctx.borrowed)
    client_query = ctx.scope.get("query_string", b"").decode("latin-1")

    def serve(target: Replica) -> Awaitable[None]:
        # A GET names its model in the query: the backend, or the node holding the model,
        # gets the ID it knows the model by there.
        served = target.cfg.served_model if target.cfg is not None else target.local_id
        query = _with_query_model(client_query, served)
        ctx.scope = {**ctx.scope, "query_string": query.encode("latin-1")}
        return serve_on(
            ctx,
            node,
            target,
            kind="speech",
            public_id=model,
            path=ctx.path,
            body=b"",
            # Not JSON: a GET has no body whose model could be set.
            content_type=b"application/octet-stream",
            shape=shape_openai,
            query=query,
            lendable=False,
        )

    await failover(ctx, node, model, "speech", replica, serve)


def _with_query_model(query: str, model: str) -> str:
    rest = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "model"]
    return urlencode([("model", model), *rest])


async def handle_realtime_http(ctx: Ctx, node: Node) -> None:
    """A plain GET on the WebSocket path: it can only be used with an upgrade."""
    raise RouterError(
        426,
        f"{REALTIME_PATH} is a WebSocket: connect with an Upgrade: websocket request",
        code="upgrade_required",
    )


ROUTES: dict[str, Route] = {
    "/v1/audio/transcriptions": (POST, handle_transcriptions, True),
    "/v1/audio/speech": (POST, handle_speech, True),
    "/v1/audio/translations": (POST, handle_transcriptions, True),
    "/v1/audio/voices": (GET, handle_voices, True),
    "/audio/voices": (GET, handle_voices, True),
    "/api/extra/tts": (POST, handle_speech, True),
    "/api/extra/transcribe": (POST, handle_kobold_transcribe, True),
    REALTIME_PATH: (GET, handle_realtime_http, True),
}
