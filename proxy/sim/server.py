"""The simulated inference backend (contract §3).

A real HTTP server in its own process, started with llama-server's command line, whose
load time and per-request times follow the weights JSON exactly. The router's tests
and demos run against it so that every timing they see is known in advance.

Start-up must stay fast: stdlib, aiohttp, orjson and the two pure project modules only.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import itertools
import math
import os
import signal
import struct
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.sim.config import SimConfig, SimWeights, WeightsError, load_weights, parse_args
from proxy.work import (
    image_work,
    multipart_field,
    prompt_tokens_for_bytes,
    wav_duration_seconds,
)

STATS_HISTORY_LEN = 100
COMPLETED_MARK = "sim: completed"
# As llama-server, a request whose client hangs up stops there: it leaves this line instead
# of a completion (a soak tells work that was stopped from work that ran).
CANCELLED_MARK = "sim: cancelled"
# SIGTERM should end the process promptly; in-flight simulated work is worthless.
SHUTDOWN_TIMEOUT_SECS = 0.25
# Client uploads (audio, base64 images) can be large; llama-server has no small limit either.
MAX_REQUEST_BYTES = 512 * 1024 * 1024
EXIT_BAD_USAGE = 2
EXIT_CANNOT_BIND = 1

# Each word is one token, so a reply of N tokens is exactly N of these.
_WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "simulated",
    "tokens",
    "arrive",
    "on",
    "time",
)


def _png_1x1() -> bytes:
    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\x80\x80\x80")  # filter byte + one grey pixel
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


TINY_PNG_B64 = base64.b64encode(_png_1x1()).decode("ascii")


def _word(index: int) -> str:
    # One word at a time: a client may ask for a billion tokens, and the reply must not be
    # built up front (it would exhaust memory long before the time it simulates had passed).
    return _WORDS[index % len(_WORDS)]


def embedding_vector(text: str, dim: int) -> list[float]:
    """A unit vector of `dim` floats that depends only on `text`."""
    seed = text.encode("utf-8")
    raw = bytearray()
    block = 0
    while len(raw) < dim * 4:
        raw += hashlib.sha256(seed + block.to_bytes(4, "little")).digest()
        block += 1
    values = [(v / 0xFFFFFFFF) * 2.0 - 1.0 for v in struct.unpack_from(f"<{dim}I", raw)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _bad_request(message: str) -> web.Response:
    return _error(400, message, "invalid_request_error")


def _json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


def _loading() -> web.Response:
    return _error(503, "Loading model", "unavailable_error")


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    # Bisection on slice equality: C-speed compares instead of a Python loop per byte.
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def prompt_text(body: dict[str, Any]) -> bytes:
    """What a prompt cache compares: the messages one by one (chat), or the prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return b"".join(orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in messages)
    prompt = body.get("prompt")
    return prompt.encode() if isinstance(prompt, str) else b""


@dataclass
class SimState:
    config: SimConfig
    weights: SimWeights
    started_at: float
    created: int = field(default_factory=lambda: int(time.time()))
    completed: int = 0
    cancelled: int = 0
    logged: int = 0
    """Completion lines printed: each carries its process and number, so a reader of a rotated
    log sees a line lost between rotation's copy and truncation as a gap, and its wall-clock
    time in ms, so a soak can place a request that ran twice among its faults."""
    active: int = 0
    waiting: int = 0
    # asyncio.Lock wakes waiters in arrival order, which is the one-slot queue we want.
    slot_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    history: collections.deque[dict[str, Any]] = field(
        default_factory=lambda: collections.deque(maxlen=STATS_HISTORY_LEN)
    )
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    prompts: collections.deque[bytes] = field(default_factory=collections.deque)
    """The last prompts accepted, newest last (weights' prompt_cache_entries)."""
    counters: dict[str, int] = field(default_factory=dict)
    """Counters a path family's simulation keeps (open WebSockets...), shown in the stats."""

    def cached_tokens(self, prompt: bytes) -> int:
        """Prompt tokens already processed: the longest common prefix with a remembered
        prompt, in bytes/4 tokens; `prompt` is remembered in turn (oldest forgotten).

        As llama-server's prompt cache, a prompt takes the place of every remembered one it
        extends (turn N of a chat supersedes turn N-1), and a prompt a remembered one already
        extends adds nothing but is used again: one conversation holds one entry, so N
        entries keep the latest turns of N conversations.
        """
        size = self.weights.prompt_cache_entries
        if size <= 0:
            return 0
        best = max((_common_prefix(prompt, old) for old in self.prompts), default=0)
        holder = next((old for old in self.prompts if old.startswith(prompt)), None)
        if holder is not None:
            self.prompts.remove(holder)
            self.prompts.append(holder)
        else:
            kept = [old for old in self.prompts if not prompt.startswith(old)]
            self.prompts = collections.deque([*kept, prompt])
        while len(self.prompts) > size:
            self.prompts.popleft()
        return best // 4

    @property
    def vision(self) -> bool:
        # llama-server becomes multimodal when given a projector; the weights may say so too.
        return self.config.mmproj is not None or self.weights.vision

    @property
    def loaded(self) -> bool:
        return (time.monotonic() - self.started_at) * 1000.0 >= self.weights.load_ms

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-sim{next(self._ids)}"

    @contextlib.asynccontextmanager
    async def slot(
        self,
        path: str,
        duration_ms: float,
        user: Any = None,
        seen: dict[str, Any] | None = None,
    ) -> AsyncIterator[None]:
        """Hold the single slot; a disconnect (cancellation) at any point counts as cancelled.

        A request that names an OpenAI `user` leaves one log line when it completes, so a
        soak can tell from the backend logs whether any request ran twice. `seen` is what the
        request named its model by (body, header, checkpoint), which tests read in the stats.
        """
        self.waiting += 1
        try:
            await self.slot_lock.acquire()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.waiting -= 1
        self.active += 1
        try:
            yield
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            if isinstance(user, str) and user:
                at = int(time.time() * 1000)
                line = f"{CANCELLED_MARK} {path} pid={os.getpid()} at={at} user={user[:200]}"
                print(line, flush=True)
            raise
        else:
            self.completed += 1
            self.history.append({"path": path, "duration_ms": duration_ms, **(seen or {})})
            if isinstance(user, str) and user:
                self.logged += 1
                pid, at = os.getpid(), int(time.time() * 1000)
                line = (
                    f"{COMPLETED_MARK} {path} pid={pid} seq={self.logged} at={at} user={user[:200]}"
                )
                print(line, flush=True)
        finally:
            self.active -= 1
            self.slot_lock.release()

    def stats(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "cancelled": self.cancelled,
            "active": self.active,
            "waiting": self.waiting,
            "loaded": self.loaded,
            "requests": list(self.history),
            **self.counters,
        }


STATE_KEY = web.AppKey("sim_state", SimState)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _state(request: web.Request) -> SimState:
    return request.app[STATE_KEY]


async def _read_json(request: web.Request) -> tuple[bytes, dict[str, Any] | web.Response]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw, _bad_request("request body must be JSON")
    if not isinstance(body, dict):
        return raw, _bad_request("request body must be a JSON object")
    return raw, body


def _model_name(state: SimState, body: dict[str, Any]) -> str:
    model = body.get("model")
    if state.config.answer_as_alias:
        return state.config.alias
    return model if isinstance(model, str) and model else state.config.alias


def _wrong_model(state: SimState, body: dict[str, Any]) -> web.Response | None:
    """With --sim-strict-model, a 404 for a model name this server does not serve (as vLLM)."""
    model = body.get("model")
    if not state.config.strict_model or model == state.config.alias:
        return None
    return _error(404, f"The model `{model}` does not exist.", "NotFoundError")


def _seen(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    seen: dict[str, Any] = {"model": body.get("model")}
    override = body.get("override_settings")
    if isinstance(override, dict) and "sd_model_checkpoint" in override:
        seen["checkpoint"] = override["sd_model_checkpoint"]
    if "X-Tensors-Model" in request.headers:
        seen["header_model"] = request.headers["X-Tensors-Model"]
    return seen


# Readiness ---------------------------------------------------------------------------


async def handle_models(request: web.Request) -> web.Response:
    state = _state(request)
    if not state.loaded:
        return _loading()
    entry = {
        "id": state.config.alias,
        "object": "model",
        "created": state.created,
        "owned_by": "sim",
        # What it reads, as servers that say so list it (OpenRouter-style input modalities).
        "input_modalities": ["text", "image"] if state.vision else ["text"],
    }
    return _json({"object": "list", "data": [entry]})


async def handle_health(request: web.Request) -> web.Response:
    if not _state(request).loaded:
        return _loading()
    return _json({"status": "ok"})


async def handle_sd_models(request: web.Request) -> web.Response:
    state = _state(request)
    if not state.loaded:
        return _loading()
    alias = state.config.alias
    return _json([{"title": alias, "model_name": alias, "filename": state.config.weights_path}])


async def handle_stats(request: web.Request) -> web.Response:
    return _json(_state(request).stats())


# Embeddings --------------------------------------------------------------------------


def _embedding_inputs(value: Any) -> list[str] | None:
    """Texts to embed: a string, a list of strings, a token list or a list of token lists."""

    def is_tokens(item: Any) -> bool:
        return isinstance(item, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in item
        )

    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        return None
    if is_tokens(value):
        return [orjson.dumps(value).decode()]
    texts: list[str] = []
    for item in value:
        if isinstance(item, str):
            texts.append(item)
        elif is_tokens(item):
            texts.append(orjson.dumps(item).decode())
        else:
            return None
    return texts


async def handle_embeddings(request: web.Request) -> web.Response:
    state = _state(request)
    if not state.loaded:
        return _loading()
    raw, parsed = await _read_json(request)
    if isinstance(parsed, web.Response):
        return parsed
    wrong = _wrong_model(state, parsed)
    if wrong is not None:
        return wrong
    texts = _embedding_inputs(parsed.get("input", parsed.get("content")))
    if texts is None:
        return _bad_request("input must be a string, a list of strings or token lists")
    weights = state.weights
    n_prompt = prompt_tokens_for_bytes(len(raw))
    duration_ms = weights.base_ms + weights.prompt_ms_per_token * n_prompt
    async with state.slot(request.path, duration_ms, seen=_seen(request, parsed)):
        await asyncio.sleep(duration_ms / 1000.0)
    data = [
        {"object": "embedding", "index": i, "embedding": embedding_vector(t, weights.embedding_dim)}
        for i, t in enumerate(texts)
    ]
    return _json(
        {
            "object": "list",
            "data": data,
            "model": _model_name(state, parsed),
            "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt},
        }
    )


# Images ------------------------------------------------------------------------------


async def _generate_images(request: web.Request) -> tuple[int, web.Response | None]:
    """Run an image job; returns the image count, or an error response."""
    state = _state(request)
    if not state.loaded:
        return 0, _loading()
    _, parsed = await _read_json(request)
    if isinstance(parsed, web.Response):
        return 0, parsed
    try:
        work = image_work(parsed)
    except ValueError as exc:
        return 0, _bad_request(str(exc))
    weights = state.weights
    megapixel_steps = work.width * work.height / 1e6 * work.steps * work.n
    duration_ms = weights.base_ms + weights.image_ms_per_megapixel_step * megapixel_steps
    async with state.slot(request.path, duration_ms, seen=_seen(request, parsed)):
        await asyncio.sleep(duration_ms / 1000.0)
    return work.n, None


async def handle_image_generations(request: web.Request) -> web.Response:
    n, error = await _generate_images(request)
    if error is not None:
        return error
    return _json({"created": int(time.time()), "data": [{"b64_json": TINY_PNG_B64}] * n})


async def handle_txt2img(request: web.Request) -> web.Response:
    n, error = await _generate_images(request)
    if error is not None:
        return error
    return _json({"images": [TINY_PNG_B64] * n, "parameters": {}, "info": "{}"})


# Transcription -----------------------------------------------------------------------


async def handle_transcription(request: web.Request) -> web.Response:
    state = _state(request)
    if not state.loaded:
        return _loading()
    raw = await request.read()
    content_type = request.headers.get("Content-Type", "")
    audio = raw
    if content_type.lower().lstrip().startswith("multipart/"):
        field_value = multipart_field(raw, content_type, "file")
        if field_value is None:
            return _bad_request("multipart body has no file field")
        audio = field_value
    try:
        seconds = wav_duration_seconds(audio)
    except ValueError as exc:
        return _bad_request(str(exc))
    weights = state.weights
    duration_ms = weights.base_ms + weights.transcribe_ms_per_audio_second * seconds
    async with state.slot(request.path, duration_ms):
        await asyncio.sleep(duration_ms / 1000.0)
    # About two words a second of speech, at least one.
    return _json({"text": " ".join(_word(i) for i in range(max(1, math.ceil(seconds * 2))))})


# Application -------------------------------------------------------------------------


KEYLESS_PATHS = frozenset({"/health", "/sim/stats"})


@web.middleware
async def api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With --api-key, as llama-server: every endpoint but /health needs the Bearer key (and
    the sim's own /sim/stats, which tests read)."""
    key = request.app[STATE_KEY].config.api_key
    given = request.headers.get("Authorization", "")
    if key and request.path not in KEYLESS_PATHS and given != f"Bearer {key}":
        return _error(401, "Invalid API Key", "authentication_error")
    return await handler(request)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Routing failures answer in the same JSON envelope as everything else."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        message = f"no such endpoint: {request.method} {request.path}"
        return _error(404, message, "not_found_error")
    except web.HTTPMethodNotAllowed:
        message = f"method {request.method} is not allowed on {request.path}"
        return _error(405, message, "invalid_request_error")


def build_app(config: SimConfig, weights: SimWeights, started_at: float) -> web.Application:
    # The path families' simulations build on this module's helpers, hence the late import.
    from proxy.sim import chat, media, textfamily, voice

    app = web.Application(middlewares=[json_errors, api_key], client_max_size=MAX_REQUEST_BYTES)
    app[STATE_KEY] = SimState(config=config, weights=weights, started_at=started_at)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/sdapi/v1/sd-models", handle_sd_models)
    app.router.add_get("/sim/stats", handle_stats)
    app.router.add_post("/v1/chat/completions", chat.handle_chat)
    app.router.add_post("/v1/completions", chat.handle_completions)
    app.router.add_post("/v1/embeddings", handle_embeddings)
    app.router.add_post("/v1/images/generations", handle_image_generations)
    app.router.add_post("/sdapi/v1/txt2img", handle_txt2img)
    app.router.add_post("/v1/audio/transcriptions", handle_transcription)
    app.router.add_post("/inference", handle_transcription)
    textfamily.register(app)
    media.register(app)
    voice.register(app)
    return app


async def serve(config: SimConfig, weights: SimWeights, started_at: float) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code."""
    app = build_app(config, weights, started_at)
    # handler_cancellation: a client that hangs up cancels its handler, so the slot
    # frees at once instead of after the simulated work would have finished.
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_SECS
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        try:
            await site.start()
        except OSError as exc:
            print(f"sim: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
            return EXIT_CANNOT_BIND
        print(
            f"sim: listening on http://{config.host}:{config.port} "
            f"model={config.alias} load_ms={weights.load_ms:g}",
            file=sys.stderr,
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        return 0
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None, started_at: float | None = None) -> int:
    """Run the sim; `started_at` (time.monotonic()) is when loading began, default now."""
    if started_at is None:
        started_at = time.monotonic()
    config = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        weights = load_weights(config.weights_path)
    except WeightsError as exc:
        print(f"sim: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    return asyncio.run(serve(config, weights, started_at))
