"""The simulated backend's voice paths: just enough of each to test routing.

- Speech (`/v1/audio/speech`, Kobold's `/api/extra/tts`): a short valid WAV of silence; with
  `"stream_format": "audio"`, in two chunks base_ms apart.
- Voices (`/v1/audio/voices`, `/audio/voices`): a fixed list, under the model asked for.
- Translations: as transcriptions; Kobold's `/api/extra/transcribe`: base64 WAV in JSON.
- `/v1/realtime` WebSocket: each text frame comes back as `{"model", "echo"}`, each binary
  frame as it came; the socket closes with the code the client closed it with. Two control
  frames let tests drive the backend side: `{"type": "sim.stream", "count": N}` sends N
  frames in a row, `{"type": "sim.close", "code": C}` closes with code C, `{"type": "sim.drop"}`
  drops the connection without a close frame. `realtime_open` in
  `/sim/stats` counts the sockets open now, `realtime_opened` every one accepted, and
  `realtime_last_close_code` is the code of the last close the client sent.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import wave
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from proxy.sim import server
from proxy.work import wav_duration_seconds

SPEECH_RATE_HZ = 16000
SPEECH_SECONDS = 0.1
VOICES = ("alloy", "echo", "kobold")
OPEN = "realtime_open"
OPENED = "realtime_opened"
LAST_CLOSE = "realtime_last_close_code"


def speech_wav(seconds: float = SPEECH_SECONDS) -> bytes:
    """A mono 16-bit WAV of silence, `seconds` long."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SPEECH_RATE_HZ)
        out.writeframes(b"\x00\x00" * int(SPEECH_RATE_HZ * seconds))
    return buf.getvalue()


def _model(state: server.SimState, named: Any) -> str:
    if state.config.answer_as_alias or not isinstance(named, str) or not named:
        return state.config.alias
    return named


async def handle_speech(request: web.Request) -> web.StreamResponse:
    state = request.app[server.STATE_KEY]
    if not state.loaded:
        return server._error(503, "Loading model", "unavailable_error")
    _, body = await server._read_json(request)
    if isinstance(body, web.Response):
        return body
    if not isinstance(body.get("input"), str):
        return server._error(400, "input is required", "invalid_request_error")
    seen = {"model": body.get("model"), "voice": body.get("voice")}
    if body.get("stream_format") == "audio":
        return await _stream_speech(request, state, seen)
    async with state.slot(request.path, state.weights.base_ms, seen=seen):
        await asyncio.sleep(state.weights.base_ms / 1000.0)
    return web.Response(body=speech_wav(), content_type="audio/wav")


async def _stream_speech(
    request: web.Request, state: server.SimState, seen: dict[str, Any]
) -> web.StreamResponse:
    """The WAV in two chunks, the second base_ms after the first (audio made as it plays)."""
    audio = speech_wav()
    half = len(audio) // 2
    resp = web.StreamResponse(headers={"Content-Type": "audio/wav"})
    async with state.slot(request.path, state.weights.base_ms, seen=seen):
        await resp.prepare(request)
        await resp.write(audio[:half])
        await asyncio.sleep(state.weights.base_ms / 1000.0)
        await resp.write(audio[half:])
    await resp.write_eof()
    return resp


async def handle_voices(request: web.Request) -> web.Response:
    state = request.app[server.STATE_KEY]
    model = _model(state, request.query.get("model"))
    return server._json({"model": model, "voices": list(VOICES)})


async def handle_kobold_transcribe(request: web.Request) -> web.Response:
    state = request.app[server.STATE_KEY]
    if not state.loaded:
        return server._error(503, "Loading model", "unavailable_error")
    _, body = await server._read_json(request)
    if isinstance(body, web.Response):
        return body
    data = str(body.get("audio_data") or "").partition(",")[2] or str(body.get("audio_data"))
    try:
        seconds = wav_duration_seconds(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError) as exc:
        return server._error(400, f"audio_data: {exc}", "invalid_request_error")
    duration_ms = state.weights.base_ms + state.weights.transcribe_ms_per_audio_second * seconds
    async with state.slot(request.path, duration_ms, seen={"model": body.get("model")}):
        await asyncio.sleep(duration_ms / 1000.0)
    return server._json({"text": "simulated transcription"})


async def handle_realtime(request: web.Request) -> web.StreamResponse:
    state = request.app[server.STATE_KEY]
    model = _model(state, request.query.get("model"))
    # The close handshake is answered by hand, with the client's own code.
    ws = web.WebSocketResponse(autoclose=False, protocols=("realtime",))
    await ws.prepare(request)
    counters = state.counters
    counters[OPEN] = counters.get(OPEN, 0) + 1
    counters[OPENED] = counters.get(OPENED, 0) + 1
    try:
        while True:
            # Not `async for`: it ends at a close before the close's code can be read.
            msg = await ws.receive()
            if msg.type == WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
            elif msg.type == WSMsgType.TEXT:
                control = await _control(request, ws, model, msg.data)
                if control == "closed":
                    break
                if control is None:
                    await ws.send_str(orjson.dumps({"model": model, "echo": msg.data}).decode())
            elif msg.type == WSMsgType.CLOSE:
                counters[LAST_CLOSE] = int(msg.data or WSCloseCode.OK)
                reason = msg.extra if isinstance(msg.extra, str) else ""
                await ws.close(code=msg.data or WSCloseCode.OK, message=reason.encode())
                break
            else:  # closed or broken under us
                break
    finally:
        counters[OPEN] -= 1
    return ws


async def _control(
    request: web.Request, ws: web.WebSocketResponse, model: str, text: str
) -> str | None:
    """Act on a test's control frame: "done", "closed" (the socket is), or None (no control)."""
    if '"sim.' not in text[:40]:
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("type") == "sim.stream":
        for index in range(int(doc.get("count", 1))):
            await ws.send_str(orjson.dumps({"model": model, "seq": index}).decode())
        return "done"
    if doc.get("type") == "sim.drop":
        # Gone without a close frame, as a backend that crashed.
        transport = request.transport
        if transport is not None:
            transport.abort()
        return "closed"
    if doc.get("type") == "sim.close":
        await ws.close(code=int(doc["code"]), message=str(doc.get("reason", "")).encode())
        return "closed"
    return None


def register(app: web.Application) -> None:
    """Add this family's routes to the simulated backend."""
    app.router.add_post("/v1/audio/speech", handle_speech)
    app.router.add_post("/api/extra/tts", handle_speech)
    app.router.add_get("/v1/audio/voices", handle_voices)
    app.router.add_get("/audio/voices", handle_voices)
    app.router.add_post("/v1/audio/translations", server.handle_transcription)
    app.router.add_post("/api/extra/transcribe", handle_kobold_transcribe)
    app.router.add_get("/v1/realtime", handle_realtime)
