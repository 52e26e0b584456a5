"""The simulated backend, run as a real process on a loopback port.

Timing checks are lower bounds only: a loaded machine may be slow, never fast.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import subprocess
import sys
import time
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.sim.config import SimWeights, WeightsError, load_weights
from proxy.sim.server import main as sim_main
from tests.harness import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_DEADLINE_SECS = 20.0
POLL_INTERVAL_SECS = 0.02
EXIT_DEADLINE_SECS = 10.0

SHARED_WEIGHTS = {
    "load_ms": 0,
    "base_ms": 200,
    "prompt_ms_per_token": 0.5,
    "output_ms_per_token": 10,
    "image_ms_per_megapixel_step": 5,
    "embedding_dim": 12,
}
SHARED_ALIAS = "shared-alias"
# Flags a router passes to the real llama-server; the sim must ignore the ones it does
# not know, including `-mg`, which a naive parser would read as `-m g`.
LLAMA_SERVER_NOISE = ["-ngl", "99", "-mg", "0", "-cb", "--ctx-size", "4096", "-np", "4"]


@dataclass
class Sim:
    process: subprocess.Popen[bytes]
    port: int
    weights_path: Path
    stderr_path: Path
    spawned_at: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/sim/stats").json()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                return self.process.wait(timeout=EXIT_DEADLINE_SECS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def write_weights(directory: Path, name: str, weights: dict[str, Any]) -> Path:
    path = directory / f"{name}.sim.json"
    path.write_bytes(orjson.dumps(weights))
    return path


def launch(directory: Path, name: str, weights: dict[str, Any], *args: str) -> Sim:
    weights_path = write_weights(directory, name, weights)
    port = free_port()
    stderr_path = directory / f"{name}.stderr"
    with stderr_path.open("wb") as stderr:
        spawned_at = time.monotonic()
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "proxy.sim",
                "-m",
                str(weights_path),
                "--port",
                str(port),
                *args,
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    return Sim(process, port, weights_path, stderr_path, spawned_at)


def poll_health(sim: Sim) -> list[int]:
    """Statuses of /health until it answers 200 (connection refused is skipped)."""
    seen: list[int] = []
    deadline = time.monotonic() + READY_DEADLINE_SECS
    while time.monotonic() < deadline:
        if sim.process.poll() is not None:
            pytest.fail(f"sim exited early: {sim.stderr_path.read_text()}")
        try:
            status = httpx.get(f"{sim.url}/health", timeout=2.0).status_code
        except httpx.TransportError:
            status = None
        if status is not None:
            seen.append(status)
            if status == 200:
                return seen
        time.sleep(POLL_INTERVAL_SECS)
    pytest.fail(f"sim not ready within {READY_DEADLINE_SECS}s: {sim.stderr_path.read_text()}")


async def wait_for_stats(sim: Sim, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + READY_DEADLINE_SECS
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            stats = (await client.get(f"{sim.url}/sim/stats")).json()
            if condition(stats):
                return stats
            await asyncio.sleep(POLL_INTERVAL_SECS)
    pytest.fail(f"stats never matched; last: {stats}")


def make_wav(seconds: float, rate: int = 8000) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(b"\x00\x00" * int(seconds * rate))
    return buffer.getvalue()


async def post_raw(port: int, path: str, body: dict[str, Any]) -> asyncio.StreamWriter:
    """Send a request on a bare socket, so the test decides exactly when to hang up."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    await writer.drain()
    return writer


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


@pytest.fixture(scope="module")
def shared_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    directory = tmp_path_factory.mktemp("shared-sim")
    sim = launch(directory, "shared", SHARED_WEIGHTS, "-a", SHARED_ALIAS, *LLAMA_SERVER_NOISE)
    poll_health(sim)
    yield sim
    sim.stop()


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    started: list[Sim] = []

    def start(name: str, weights: dict[str, Any], *args: str, wait: bool = True) -> Sim:
        sim = launch(tmp_path, name, weights, *args)
        started.append(sim)
        if wait:
            poll_health(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


def text_ms(weights: dict[str, Any], body_bytes: bytes, n_output: int) -> float:
    prompt_tokens = math.ceil(len(body_bytes) / 4)
    return (
        weights["base_ms"]
        + weights["prompt_ms_per_token"] * prompt_tokens
        + weights["output_ms_per_token"] * n_output
    )


# Loading and readiness ------------------------------------------------------------------


def test_it_answers_503_while_loading_then_200(start_sim: Callable[..., Sim]) -> None:
    # The 503 itself is pinned by the 60 s load below: here the window may close before a busy
    # machine gets its first poll in, so only what holds at any speed is asserted.
    load_ms = 1500
    sim = start_sim("loading", {"load_ms": load_ms}, wait=False)
    seen = poll_health(sim)
    assert set(seen[:-1]) <= {503}
    assert seen[-1] == 200
    assert time.monotonic() - sim.spawned_at >= load_ms / 1000
    line = f"sim: listening on http://127.0.0.1:{sim.port} model=loading load_ms=1500"
    assert line in sim.stderr_path.read_text()


def test_every_endpoint_refuses_with_loading_model_until_loaded(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim("slow-load", {"load_ms": 60_000}, wait=False)
    deadline = time.monotonic() + READY_DEADLINE_SECS
    while True:
        try:
            response = httpx.get(f"{sim.url}/v1/models")
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, sim.stderr_path.read_text()
            time.sleep(POLL_INTERVAL_SECS)
    assert response.status_code == 503
    assert httpx.get(f"{sim.url}/sdapi/v1/sd-models").status_code == 503
    chat = httpx.post(f"{sim.url}/v1/chat/completions", json={"messages": []})
    assert chat.status_code == 503
    assert chat.json() == {
        "error": {"message": "Loading model", "type": "unavailable_error", "code": 503}
    }
    stats = sim.stats()
    assert stats["loaded"] is False
    assert stats["completed"] == 0


def test_models_lists_the_alias_and_sd_models_the_weights(shared_sim: Sim) -> None:
    models = httpx.get(f"{shared_sim.url}/v1/models").json()
    assert models["object"] == "list"
    [entry] = models["data"]
    assert entry["id"] == SHARED_ALIAS
    assert entry["object"] == "model"
    assert entry["owned_by"] == "sim"
    assert isinstance(entry["created"], int)
    sd_models = httpx.get(f"{shared_sim.url}/sdapi/v1/sd-models").json()
    assert sd_models == [
        {
            "title": SHARED_ALIAS,
            "model_name": SHARED_ALIAS,
            "filename": str(shared_sim.weights_path),
        }
    ]
    assert httpx.get(f"{shared_sim.url}/health").json() == {"status": "ok"}


def test_the_alias_defaults_to_the_weights_file_stem(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("my-model", {})
    assert httpx.get(f"{sim.url}/v1/models").json()["data"][0]["id"] == "my-model"


def test_an_unknown_path_is_a_json_404(shared_sim: Sim) -> None:
    response = httpx.get(f"{shared_sim.url}/v2/nothing")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == 404


def test_sigterm_stops_it_with_exit_code_zero(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("stopping", {})
    assert sim.stop() == 0


# Text -----------------------------------------------------------------------------------


async def test_chat_completion_has_the_openai_shape_and_exact_usage(shared_sim: Sim) -> None:
    body = {
        "model": "client-model",
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 4,
    }
    raw = orjson.dumps(body)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/v1/chat/completions",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 200
    data = response.json()
    prompt_tokens = math.ceil(len(raw) / 4)
    assert data["object"] == "chat.completion"
    assert data["model"] == "client-model"
    assert isinstance(data["id"], str)
    assert isinstance(data["created"], int)
    [choice] = data["choices"]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 4
    assert choice["finish_reason"] == "length"
    assert data["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 4,
        "total_tokens": prompt_tokens + 4,
    }
    last = shared_sim.stats()["requests"][-1]
    # The stats also say what the request named its model (tests of the router read it).
    assert last == {
        "path": "/v1/chat/completions",
        "duration_ms": pytest.approx(text_ms(SHARED_WEIGHTS, raw, 4)),
        "model": body["model"],
    }


async def test_without_max_tokens_it_writes_the_default_and_stops(shared_sim: Sim) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/v1/completions", json={"prompt": "Once upon a time"}
        )
    data = response.json()
    assert data["object"] == "text_completion"
    assert data["model"] == SHARED_ALIAS
    [choice] = data["choices"]
    assert len(choice["text"].split()) == 16
    assert choice["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] == 16


async def test_the_reply_text_is_deterministic(shared_sim: Sim) -> None:
    body = {"prompt": "x", "max_tokens": 3}
    async with httpx.AsyncClient() as client:
        first = await client.post(f"{shared_sim.url}/v1/completions", json=body)
        second = await client.post(f"{shared_sim.url}/v1/completions", json=body)
    assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]


async def test_a_request_takes_at_least_its_simulated_time(shared_sim: Sim) -> None:
    raw = orjson.dumps({"prompt": "hi", "max_tokens": 1})
    started = time.monotonic()
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/v1/completions",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 200
    assert time.monotonic() - started >= text_ms(SHARED_WEIGHTS, raw, 1) / 1000


async def test_concurrent_requests_are_served_one_after_the_other(shared_sim: Sim) -> None:
    raw = orjson.dumps({"prompt": "hi", "max_tokens": 2})
    job_secs = text_ms(SHARED_WEIGHTS, raw, 2) / 1000
    before = shared_sim.stats()["completed"]

    async def timed(client: httpx.AsyncClient) -> float:
        response = await client.post(
            f"{shared_sim.url}/v1/completions",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 200
        return time.monotonic()

    started = time.monotonic()
    async with httpx.AsyncClient() as client:
        finished = sorted(await asyncio.gather(timed(client), timed(client)))
    assert finished[0] - started >= job_secs
    assert finished[1] - started >= 2 * job_secs
    assert shared_sim.stats()["completed"] == before + 2


async def _stream_events(sim: Sim, path: str, body: dict[str, Any]) -> list[str]:
    events: list[str] = []
    async with (
        httpx.AsyncClient() as client,
        client.stream(
            "POST",
            f"{sim.url}{path}",
            content=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line.removeprefix("data: "))
    return events


async def test_streaming_sends_one_chunk_per_token_then_usage_then_done(shared_sim: Sim) -> None:
    body = {"messages": [{"role": "user", "content": "stream please"}], "max_tokens": 5}
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    raw = orjson.dumps(streamed)
    started = time.monotonic()
    events = await _stream_events(shared_sim, "/v1/chat/completions", streamed)
    assert time.monotonic() - started >= text_ms(SHARED_WEIGHTS, raw, 5) / 1000
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    content_chunks, final, usage = chunks[:-2], chunks[-2], chunks[-1]
    assert len(content_chunks) == 5
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert content_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["finish_reason"] is None for c in content_chunks)
    text = "".join(c["choices"][0]["delta"]["content"] for c in content_chunks)
    assert final["choices"][0]["finish_reason"] == "length" and "usage" not in final
    prompt_tokens = math.ceil(len(raw) / 4)
    # As llama-server: the usage comes in a chunk of its own, with no choices.
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": prompt_tokens + 5,
    }
    async with httpx.AsyncClient() as client:
        whole = await client.post(f"{shared_sim.url}/v1/chat/completions", json=body)
    assert text == whole.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}])
async def test_a_stream_carries_no_usage_unless_the_request_asks(
    shared_sim: Sim, options: dict[str, Any] | None
) -> None:
    body: dict[str, Any] = {"prompt": "count", "max_tokens": 3, "stream": True}
    if options is not None:
        body["stream_options"] = options
    events = await _stream_events(shared_sim, "/v1/completions", body)
    assert events[-1] == "[DONE]" and len(events) == 5
    assert all("usage" not in orjson.loads(e) for e in events[:-1])


async def test_completions_stream_text_chunks(shared_sim: Sim) -> None:
    body = {
        "prompt": "go",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{shared_sim.url}/v1/completions", json=body)
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert [c["object"] for c in chunks] == ["text_completion"] * 5
    assert len("".join(c["choices"][0]["text"] for c in chunks[:-1]).split()) == 3
    assert chunks[-1]["usage"]["completion_tokens"] == 3


# Cancellation ---------------------------------------------------------------------------


async def test_a_client_that_hangs_up_mid_request_frees_the_slot_at_once(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim("cancel-running", {"output_ms_per_token": 10})
    long_secs = 5.0  # 500 tokens at 10 ms
    started = time.monotonic()
    writer = await post_raw(sim.port, "/v1/completions", {"prompt": "x", "max_tokens": 500})
    await wait_for_stats(sim, lambda s: s["active"] == 1)
    await hang_up(writer)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{sim.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}
        )
    assert response.status_code == 200
    # Had the cancelled job kept the slot, this answer could not come before it ended.
    assert time.monotonic() - started < long_secs
    stats = sim.stats()
    assert stats["cancelled"] == 1
    assert stats["completed"] == 1
    assert stats["active"] == 0


async def test_a_client_that_hangs_up_while_waiting_leaves_the_queue(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim("cancel-waiting", {"output_ms_per_token": 10})
    running = await post_raw(sim.port, "/v1/completions", {"prompt": "x", "max_tokens": 500})
    await wait_for_stats(sim, lambda s: s["active"] == 1)
    waiting = await post_raw(sim.port, "/v1/completions", {"prompt": "y", "max_tokens": 500})
    await wait_for_stats(sim, lambda s: s["waiting"] == 1)
    await hang_up(waiting)
    stats = await wait_for_stats(sim, lambda s: s["waiting"] == 0)
    assert stats["cancelled"] == 1
    assert stats["active"] == 1
    await hang_up(running)
    stats = await wait_for_stats(sim, lambda s: s["active"] == 0)
    assert stats["cancelled"] == 2
    assert stats["completed"] == 0


async def test_a_client_that_hangs_up_mid_stream_is_counted_cancelled(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim("cancel-stream", {"output_ms_per_token": 10})
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 500, "stream": True}
    writer = await post_raw(sim.port, "/v1/chat/completions", body)
    await wait_for_stats(sim, lambda s: s["active"] == 1)
    await hang_up(writer)
    stats = await wait_for_stats(sim, lambda s: s["active"] == 0)
    assert stats["cancelled"] == 1
    assert stats["completed"] == 0


# Vision ---------------------------------------------------------------------------------

IMAGE_CHAT = {
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        }
    ],
    "max_tokens": 2,
}


async def test_an_image_to_a_non_vision_model_is_refused_without_taking_the_slot(
    shared_sim: Sim,
) -> None:
    before = shared_sim.stats()
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{shared_sim.url}/v1/chat/completions", json=IMAGE_CHAT)
    assert response.status_code == 400
    error = response.json()["error"]
    assert "not supported" in error["message"]
    assert error["type"] == "invalid_request_error"
    after = shared_sim.stats()
    assert after["completed"] == before["completed"]


async def test_text_that_mentions_image_url_is_not_refused(shared_sim: Sim) -> None:
    body = {"messages": [{"role": "user", "content": '{"type": "image_url"}'}], "max_tokens": 1}
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{shared_sim.url}/v1/chat/completions", json=body)
    assert response.status_code == 200


async def test_an_mmproj_makes_the_model_accept_images(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("vision", {}, "--mmproj", "/nonexistent/mmproj.gguf")
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{sim.url}/v1/chat/completions", json=IMAGE_CHAT)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 2


# Embeddings -----------------------------------------------------------------------------


async def test_embeddings_are_deterministic_vectors_of_the_configured_size(
    shared_sim: Sim,
) -> None:
    body = {"model": "emb", "input": ["alpha", "beta", "alpha"]}
    raw = orjson.dumps(body)
    started = time.monotonic()
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/v1/embeddings",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
        single = await client.post(f"{shared_sim.url}/v1/embeddings", json={"input": "beta"})
    assert time.monotonic() - started >= 2 * SHARED_WEIGHTS["base_ms"] / 1000
    data = response.json()
    assert data["object"] == "list"
    assert data["model"] == "emb"
    vectors = [item["embedding"] for item in data["data"]]
    assert [item["index"] for item in data["data"]] == [0, 1, 2]
    assert all(len(v) == SHARED_WEIGHTS["embedding_dim"] for v in vectors)
    assert vectors[0] == vectors[2]
    assert vectors[0] != vectors[1]
    assert single.json()["data"][0]["embedding"] == vectors[1]
    prompt_tokens = math.ceil(len(raw) / 4)
    assert data["usage"] == {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}


async def test_embeddings_without_input_are_a_400(shared_sim: Sim) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{shared_sim.url}/v1/embeddings", json={"input": 5})
    assert response.status_code == 400


# Images ---------------------------------------------------------------------------------


async def test_image_generation_returns_n_pngs_and_times_by_pixel_steps(shared_sim: Sim) -> None:
    body = {"prompt": "a cat", "size": "256x256", "steps": 4, "n": 2}
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{shared_sim.url}/v1/images/generations", json=body)
    assert response.status_code == 200
    data = response.json()
    assert isinstance(data["created"], int)
    assert len(data["data"]) == 2
    for item in data["data"]:
        assert base64.b64decode(item["b64_json"]).startswith(b"\x89PNG\r\n\x1a\n")
    expected_ms = SHARED_WEIGHTS["base_ms"] + SHARED_WEIGHTS["image_ms_per_megapixel_step"] * (
        256 * 256 / 1e6 * 4 * 2
    )
    last = shared_sim.stats()["requests"][-1]
    assert last == {
        "path": "/v1/images/generations",
        "duration_ms": pytest.approx(expected_ms),
        "model": None,
    }


async def test_sdapi_txt2img_returns_batch_size_images(shared_sim: Sim) -> None:
    body = {"prompt": "a dog", "width": 128, "height": 64, "steps": 3, "batch_size": 3}
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{shared_sim.url}/sdapi/v1/txt2img", json=body)
    data = response.json()
    assert len(data["images"]) == 3
    assert base64.b64decode(data["images"][0]).startswith(b"\x89PNG")
    assert data["parameters"] == {}
    assert data["info"] == "{}"
    expected_ms = SHARED_WEIGHTS["base_ms"] + SHARED_WEIGHTS["image_ms_per_megapixel_step"] * (
        128 * 64 / 1e6 * 3 * 3
    )
    assert shared_sim.stats()["requests"][-1]["duration_ms"] == pytest.approx(expected_ms)


async def test_an_invalid_image_size_is_a_400_naming_the_field(shared_sim: Sim) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/v1/images/generations", json={"prompt": "x", "size": "huge"}
        )
    assert response.status_code == 400
    assert "size" in response.json()["error"]["message"]


# Transcription --------------------------------------------------------------------------


async def test_a_multipart_wav_upload_is_transcribed_in_its_audio_time(shared_sim: Sim) -> None:
    wav = make_wav(2.0)
    started = time.monotonic()
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/v1/audio/transcriptions",
            files={"file": ("speech.wav", wav, "audio/wav")},
            data={"model": "whisper"},
        )
    assert response.status_code == 200
    assert response.json()["text"].strip()
    expected_ms = SHARED_WEIGHTS["base_ms"] + 50 * 2.0
    assert time.monotonic() - started >= expected_ms / 1000
    last = shared_sim.stats()["requests"][-1]
    assert last == {"path": "/v1/audio/transcriptions", "duration_ms": pytest.approx(expected_ms)}


async def test_a_raw_wav_body_to_the_whisper_path_is_transcribed(shared_sim: Sim) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/inference",
            content=make_wav(1.0),
            headers={"Content-Type": "audio/wav"},
        )
    assert response.status_code == 200
    assert response.json()["text"].strip()


async def test_audio_that_is_not_wav_is_a_400(shared_sim: Sim) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/v1/audio/transcriptions",
            files={"file": ("speech.mp3", b"ID3\x04\x00" + b"\x00" * 64, "audio/mpeg")},
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "WAV" in error["message"]


async def test_a_multipart_upload_without_a_file_is_a_400(shared_sim: Sim) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{shared_sim.url}/v1/audio/transcriptions",
            files={"audio": ("speech.wav", make_wav(0.1), "audio/wav")},
        )
    assert response.status_code == 400


# Bad weights ----------------------------------------------------------------------------


def test_a_missing_weights_file_makes_the_process_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "absent.sim.json"
    result = subprocess.run(
        [sys.executable, "-m", "proxy.sim", "-m", str(missing), "--port", str(free_port())],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=EXIT_DEADLINE_SECS * 3,
    )
    assert result.returncode == 2
    assert "cannot read weights file" in result.stderr.decode()


# The remaining start-up failures run main() in-process: it returns before serving.


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"base_ms": -1}', "base_ms"),
        (b'{"load_ms": "fast"}', "load_ms"),
        (b'{"output_ms_per_token": true}', "output_ms_per_token"),
        (b'{"embedding_dim": 0}', "embedding_dim"),
        (b'{"vision": "yes"}', "vision"),
    ],
)
def test_invalid_weights_exit_2_with_a_message_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    path = tmp_path / "bad.sim.json"
    path.write_bytes(content)
    assert sim_main(["-m", str(path), "--port", str(free_port())]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_port_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_weights(tmp_path, "ok", {})
    with pytest.raises(SystemExit) as exited:
        sim_main(["-m", str(path)])
    assert exited.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_unknown_keys_in_weights_are_ignored(tmp_path: Path) -> None:
    path = write_weights(tmp_path, "extra", {"base_ms": 5, "comment": "hello"})
    assert load_weights(str(path)) == SimWeights(base_ms=5.0)


async def test_generation_stops_when_the_context_is_full_and_a_prompt_too_long_is_refused(
    start_sim: Callable[..., Sim],
) -> None:
    weights = {"load_ms": 0, "base_ms": 0, "prompt_ms_per_token": 0, "output_ms_per_token": 0}
    sim = start_sim("small-ctx", weights, "-c", "64")
    async with httpx.AsyncClient() as client:
        # A billion tokens asked for: the answer stops at the context, built word by word.
        body = {"prompt": "x", "max_tokens": 1_000_000_000}
        data = (await client.post(f"{sim.url}/v1/completions", json=body)).json()
        prompt_tokens = data["usage"]["prompt_tokens"]
        assert data["usage"]["completion_tokens"] == 64 - prompt_tokens
        assert len(data["choices"][0]["text"].split()) == 64 - prompt_tokens
        assert data["choices"][0]["finish_reason"] == "length"
        resp = await client.post(f"{sim.url}/v1/completions", json={"prompt": "x" * 400})
        assert resp.status_code == 400
        assert resp.json()["error"]["type"] == "exceed_context_size_error"


async def test_each_of_n_slots_gets_an_equal_share_of_the_context(
    start_sim: Callable[..., Sim],
) -> None:
    weights = {"load_ms": 0, "base_ms": 0, "prompt_ms_per_token": 0, "output_ms_per_token": 0}
    sim = start_sim("slots", weights, "-c", "128", "-np", "2")
    async with httpx.AsyncClient() as client:
        body = {"prompt": "x", "max_tokens": 1_000_000_000}
        data = (await client.post(f"{sim.url}/v1/completions", json=body)).json()
        assert data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"] == 64
        # 80 prompt tokens fit the whole window but not one slot's 64.
        raw = orjson.dumps({"prompt": "x" * (320 - 14)})
        resp = await client.post(
            f"{sim.url}/v1/completions", content=raw, headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 400
        assert resp.json()["error"]["type"] == "exceed_context_size_error"


# Upstream behaviours the router's tests switch on ------------------------------------------


def test_a_strict_keyed_upstream_refuses_other_names_and_missing_keys(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim(
        "strict", {"load_ms": 0}, "-a", "org/served", "--sim-strict-model", "--api-key", "k1"
    )
    chat = {"model": "org/served", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{sim.url}/v1/chat/completions"
    assert httpx.post(url, json=chat).status_code == 401
    assert httpx.post(url, json=chat, headers={"Authorization": "Bearer k2"}).status_code == 401
    auth = {"Authorization": "Bearer k1"}
    wrong = httpx.post(url, json={**chat, "model": "served"}, headers=auth)
    assert wrong.status_code == 404 and "served" in wrong.json()["error"]["message"]
    right = httpx.post(url, json=chat, headers=auth)
    assert right.status_code == 200 and right.json()["model"] == "org/served"
    # Its health stays open, as llama-server's does.
    assert httpx.get(f"{sim.url}/health").status_code == 200


def test_an_own_name_upstream_answers_under_its_alias(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("own", {"load_ms": 0}, "-a", "mine", "--sim-answer-as-alias")
    chat = {"model": "asked", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=chat).json()["model"] == "mine"


def test_offered_tools_are_called_and_a_tool_result_is_answered_in_words(
    shared_sim: Sim,
) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}, "n": {"type": "number"}},
                "required": ["q", "n"],
            },
        },
    }
    url = f"{shared_sim.url}/v1/chat/completions"
    ask = [{"role": "user", "content": "find it"}]
    called = httpx.post(url, json={"messages": ask, "tools": [tool]}).json()
    choice = called["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "lookup", "arguments": '{"q":"sim","n":1.5}'}
    history = [
        *ask,
        choice["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": "x"},
    ]
    answered = httpx.post(url, json={"messages": history, "tools": [tool]}).json()
    assert answered["choices"][0]["message"]["content"]
    orphan = [*ask, {"role": "tool", "tool_call_id": "nope", "content": "x"}]
    refused = httpx.post(url, json={"messages": orphan, "tools": [tool]})
    assert refused.status_code == 400 and "messages[1]" in refused.json()["error"]["message"]
    none = httpx.post(url, json={"messages": ask, "tools": [tool], "tool_choice": "none"}).json()
    assert none["choices"][0]["finish_reason"] != "tool_calls"


# Prompt cache ----------------------------------------------------------------------------

CACHE_WEIGHTS = {"base_ms": 1, "prompt_ms_per_token": 0.5, "output_ms_per_token": 0}


async def _chat(client: httpx.AsyncClient, sim: Sim, messages: list[dict[str, str]]) -> Any:
    response = await client.post(
        f"{sim.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
    )
    assert response.status_code == 200, response.text
    return response.json()["usage"]


async def test_the_prompt_cache_makes_the_longest_common_prefix_free(
    start_sim: Callable[..., Sim],
) -> None:
    from proxy.sim.server import prompt_text

    sim = start_sim("cached", {**CACHE_WEIGHTS, "prompt_cache_entries": 1})
    turn1 = [{"role": "system", "content": "s" * 400}, {"role": "user", "content": "q1"}]
    turn2 = [*turn1, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    other = [{"role": "user", "content": "x" * 300}]
    async with httpx.AsyncClient() as client:
        first = await _chat(client, sim, turn1)
        second = await _chat(client, sim, turn2)
        # One entry: the unrelated prompt evicts turn 2, so turn 2 again costs in full.
        await _chat(client, sim, other)
        third = await _chat(client, sim, turn2)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    # Turn 1's whole prompt text is a prefix of turn 2's: bytes/4 of it are free.
    shared = len(prompt_text({"messages": turn1}))
    assert second["prompt_tokens_details"]["cached_tokens"] == shared // 4
    # Only what the unrelated prompt shares (the JSON around the first message) stays free.
    common = b'{"content":"'
    assert prompt_text({"messages": other}).startswith(common)
    assert prompt_text({"messages": turn2}).startswith(common)
    assert third["prompt_tokens_details"]["cached_tokens"] == len(common) // 4
    stats = sim.stats()
    durations = [r["duration_ms"] for r in stats["requests"]]
    full = CACHE_WEIGHTS["base_ms"] + CACHE_WEIGHTS["prompt_ms_per_token"] * second["prompt_tokens"]
    assert durations[1] == pytest.approx(
        full - CACHE_WEIGHTS["prompt_ms_per_token"] * (shared // 4)
    )
    assert durations[3] == pytest.approx(
        full - CACHE_WEIGHTS["prompt_ms_per_token"] * (len(common) // 4)
    )


def _turns(tag: str, count: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": f"{tag} " * 100}]
    for i in range(count):
        if i:
            messages.append({"role": "assistant", "content": f"{tag} answer {i} " * 20})
        messages.append({"role": "user", "content": f"{tag} question {i} " * 20})
    return messages


async def test_a_prompt_takes_the_place_of_the_remembered_prompts_it_extends(
    start_sim: Callable[..., Sim],
) -> None:
    from proxy.sim.server import prompt_text

    sim = start_sim("slots", {**CACHE_WEIGHTS, "prompt_cache_entries": 2})
    a1, a2, a3 = (_turns("a", n) for n in (1, 2, 3))
    b1, b2 = (_turns("b", n) for n in (1, 2))
    async with httpx.AsyncClient() as client:
        for messages in (a1, b1, a2, a3):
            await _chat(client, sim, messages)
        # Turns 2 and 3 of "a" each replaced the turn they extend, so two entries still hold
        # "b" beside "a": its second turn reuses its first.
        b_second = await _chat(client, sim, b2)
    reused = b_second["prompt_tokens_details"]["cached_tokens"]
    assert reused == len(prompt_text({"messages": b1})) // 4


async def test_a_prompt_a_remembered_one_extends_refreshes_it_instead_of_taking_an_entry(
    start_sim: Callable[..., Sim],
) -> None:
    from proxy.sim.server import prompt_text

    sim = start_sim("refresh", {**CACHE_WEIGHTS, "prompt_cache_entries": 2})
    a1, a2 = _turns("a", 1), _turns("a", 2)
    async with httpx.AsyncClient() as client:
        for messages in (a2, _turns("b", 1), a1, _turns("c", 1)):
            await _chat(client, sim, messages)
        # Asking for "a"'s first turn again used the entry holding its second: "b", not "a",
        # was the oldest when "c" came.
        again = await _chat(client, sim, a2)
    reused = again["prompt_tokens_details"]["cached_tokens"]
    assert reused == len(prompt_text({"messages": a2})) // 4


async def test_without_a_prompt_cache_usage_and_timing_are_unchanged(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim("uncached", CACHE_WEIGHTS)
    turn = [{"role": "user", "content": "q" * 200}]
    async with httpx.AsyncClient() as client:
        await _chat(client, sim, turn)
        again = await _chat(client, sim, turn)
    assert "prompt_tokens_details" not in again
    durations = [r["duration_ms"] for r in sim.stats()["requests"]]
    assert (
        durations[0]
        == durations[1]
        == pytest.approx(
            CACHE_WEIGHTS["base_ms"] + CACHE_WEIGHTS["prompt_ms_per_token"] * again["prompt_tokens"]
        )
    )


def test_a_negative_prompt_cache_size_is_refused(tmp_path: Path) -> None:
    path = write_weights(tmp_path, "bad", {"prompt_cache_entries": -1})
    with pytest.raises(WeightsError, match="prompt_cache_entries must be an integer >= 0"):
        load_weights(str(path))
