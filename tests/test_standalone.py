"""A standalone node end to end: `runrouter` as a real process with simulated backends."""

from __future__ import annotations

import io
import os
import signal
import struct
import threading
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import ModelSpec, RouterNode, sim_weights, start_node, text_model, wait_for

pytestmark = pytest.mark.integration


def _models() -> list[ModelSpec]:
    return [
        text_model("alpha", load_ms=150, base_ms=5, output_ms_per_token=1),
        text_model("beta", load_ms=100, base_ms=5, output_ms_per_token=1),
        text_model("slow", load_ms=50, base_ms=5, output_ms_per_token=100),
        ModelSpec(
            "seer",
            {"contextsize": 4096, "parallel": 1},
            {"model_param": sim_weights(vision=True), "mmproj": sim_weights(vision=True)},
        ),
        ModelSpec(
            "painter", {}, {"sdmodel": sim_weights(base_ms=5, image_ms_per_megapixel_step=1)}
        ),
        ModelSpec("ears", {}, {"whispermodel": sim_weights(base_ms=5)}),
        ModelSpec("broken", {"contextsize": 4096}, {"model_param": {"load_ms": -1}}),
    ]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    root = tmp_path_factory.mktemp("standalone")
    n = start_node(root, _models(), server={"max_body_bytes": 200_000})
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def client(node: RouterNode) -> Iterator[httpx.Client]:
    with node.client() as c:
        yield c


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def _text_backend(client: httpx.Client) -> dict[str, Any]:
    state = client.get("/router/v1/site/nodes/state").json()
    return next(b for b in state["backends"] if b["id"] == "text-runtime")


def _analytics(client: httpx.Client, kind: str) -> list[dict[str, Any]]:
    return client.get("/router/v1/site/analytics", params={"kind": kind}).json()["records"]


def test_it_answers_ping_and_lists_models(client: httpx.Client) -> None:
    assert client.get("/ping").json() == {"status": "healthy"}
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert {"alpha", "beta", "seer"} <= set(ids)
    assert "painter" not in ids
    tags = [m["name"] for m in client.get("/api/tags").json()["models"]]
    assert tags == sorted(tags) and "alpha" in tags


def test_it_loads_on_demand_and_records_the_request_and_the_load(client: httpx.Client) -> None:
    body = chat("alpha", max_tokens=7)
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["model"] == "alpha"
    assert doc["usage"]["completion_tokens"] == 7
    loads = [r for r in _analytics(client, "loads") if r["model_id"] == "alpha"]
    assert loads and loads[0]["success"] and loads[0]["duration_ms"] >= 150
    rows = [r for r in _analytics(client, "requests") if r["model_id"] == "alpha"]
    row = rows[0]
    assert row["success"] and row["lane"] == "text" and row["node_id"] == "node-a"
    assert row["output_tokens"] == 7
    assert row["prompt_tokens"] == doc["usage"]["prompt_tokens"] > 0
    assert row["prompt_bytes"] > 0 and row["duration_ms"] > 0


def test_it_switches_models_and_requests_during_a_load_wait_for_it(client: httpx.Client) -> None:
    results: list[int] = []

    def call(model: str) -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as c:
            results.append(c.post("/v1/chat/completions", json=chat(model)).status_code)

    threads = [threading.Thread(target=call, args=(m,)) for m in ["beta"] * 4 + ["alpha"] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 6
    ps = client.get("/api/ps").json()["models"]
    assert len(ps) == 1 and ps[0]["name"] in ("alpha", "beta")


def test_it_streams_chunks_as_they_arrive(client: httpx.Client) -> None:
    with client.stream(
        "POST", "/v1/chat/completions", json=chat("alpha", stream=True, max_tokens=5)
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = [c for c in r.iter_lines() if c.startswith("data: ")]
    assert chunks[-1] == "data: [DONE]"
    assert len(chunks) >= 6
    rows = _analytics(client, "requests")
    assert rows[0]["stream"] and rows[0]["output_tokens"] == 5


def test_a_client_that_disconnects_frees_the_backend_at_once(client: httpx.Client) -> None:
    client.post("/v1/chat/completions", json=chat("slow", max_tokens=1)).raise_for_status()
    backend = _text_backend(client)
    stats_url = backend["base_url"] + "/sim/stats"
    before = httpx.get(stats_url).json()["cancelled"]
    # 200 tokens at 100 ms each: 20 s of work that the client abandons after its first chunk.
    with client.stream(
        "POST", "/v1/chat/completions", json=chat("slow", stream=True, max_tokens=200)
    ) as r:
        next(r.iter_raw())
    wait_for(lambda: httpx.get(stats_url).json()["cancelled"] > before)
    stats = httpx.get(stats_url).json()
    assert stats["active"] == 0 and stats["waiting"] == 0
    wait_for(lambda: _text_backend(client)["active"] == 0)
    resp = client.post("/v1/chat/completions", json=chat("slow", max_tokens=1))
    assert resp.status_code == 200
    closed = [r for r in _analytics(client, "requests") if r["status"] == 499]
    assert closed and not closed[0]["success"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b'{"model": "nope", "messages": []}', 404, "model"),
        (b'{"messages": []}', 400, "model"),
        (b'{"model": 5}', 400, "model"),
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
    ],
)
def test_bad_requests_get_an_openai_error(
    client: httpx.Client, body: bytes, status: int, param: str | None
) -> None:
    resp = client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert resp.status_code == status
    err = resp.json()["error"]
    assert err["message"] and err["type"]
    assert err.get("param") == param


def test_an_unknown_model_message_names_it(client: httpx.Client) -> None:
    resp = client.post("/v1/chat/completions", json=chat("nope"))
    # And lists the models that exist, as Ollama's answer does.
    assert resp.json()["error"]["message"] == (
        'model "nope" was not found; the models here are: alpha, beta, broken, seer, slow'
    )


def test_a_body_over_the_limit_is_refused_with_413(client: httpx.Client) -> None:
    resp = client.post("/v1/chat/completions", json=chat("alpha", pad="x" * 300_000))
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "body_too_large"


def test_ollama_paths_answer_errors_in_ollama_shape(client: httpx.Client) -> None:
    resp = client.post("/api/chat", json={"model": "nope", "messages": []})
    assert resp.status_code == 404
    listed = "alpha, beta, broken, seer, slow"
    assert resp.json() == {"error": f'model "nope" was not found; the models here are: {listed}'}
    resp = client.get("/api/chat")
    assert resp.status_code == 405 and "POST" in resp.headers["allow"]


def test_a_backend_that_cannot_start_is_a_502_with_the_reason_and_the_node_keeps_serving(
    client: httpx.Client,
) -> None:
    resp = client.post("/v1/chat/completions", json=chat("broken"))
    assert resp.status_code == 502
    err = resp.json()["error"]
    assert err["type"] == "backend_error" and "exited with code" in err["message"]
    assert client.post("/v1/chat/completions", json=chat("beta")).status_code == 200
    loads = [r for r in _analytics(client, "loads") if r["model_id"] == "broken"]
    assert loads and not loads[0]["success"]


def test_a_backend_that_dies_is_restarted_by_the_next_request(client: httpx.Client) -> None:
    assert client.post("/v1/chat/completions", json=chat("beta")).status_code == 200
    pid = _text_backend(client)["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _text_backend(client)["lifecycle_state"] == "failed")
    resp = client.post("/v1/chat/completions", json=chat("beta"))
    assert resp.status_code == 200
    assert _text_backend(client)["pid"] != pid


def test_ollama_chat_and_generate_are_translated(client: httpx.Client) -> None:
    resp = client.post(
        "/api/chat",
        json={"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "stream": False},
    )
    doc = resp.json()
    assert resp.status_code == 200 and doc["done"] is True and doc["model"] == "alpha"
    assert doc["message"]["role"] == "assistant" and doc["message"]["content"]
    with client.stream("POST", "/api/generate", json={"model": "alpha", "prompt": "hi"}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        records = [httpx.Response(200, content=line).json() for line in r.iter_lines() if line]
    assert records[-1]["done"] is True and all(not rec["done"] for rec in records[:-1])
    assert "".join(rec.get("response", "") for rec in records[:-1])


def test_kobold_generate_is_translated(client: httpx.Client) -> None:
    resp = client.post("/api/v1/generate", json={"model": "alpha", "prompt": "hi", "max_length": 4})
    assert resp.status_code == 200
    assert resp.json()["results"][0]["text"]


def test_an_image_to_a_text_only_model_is_refused_before_any_backend(client: httpx.Client) -> None:
    content = [
        {"type": "text", "text": "what"},
        {"type": "image_url", "image_url": {"url": "data:x"}},
    ]
    resp = client.post(
        "/v1/chat/completions",
        json={"model": "alpha", "messages": [{"role": "user", "content": content}]},
    )
    assert resp.status_code == 400 and "not supported" in resp.json()["error"]["message"]
    resp = client.post(
        "/v1/chat/completions",
        json={"model": "seer", "messages": [{"role": "user", "content": content}]},
    )
    assert resp.status_code == 200


def test_a_bad_image_size_is_refused_naming_the_field(client: httpx.Client) -> None:
    for body, param in (
        ({"model": "painter", "prompt": "x", "size": "big"}, "size"),
        ({"model": "painter", "prompt": "x", "steps": -1}, "steps"),
    ):
        resp = client.post("/v1/images/generations", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, body


def test_images_are_generated_and_their_work_recorded(client: httpx.Client) -> None:
    resp = client.post(
        "/v1/images/generations",
        json={"model": "painter", "prompt": "cat", "size": "256x128", "n": 2, "steps": 3},
    )
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["data"]) == 2
    row = next(r for r in _analytics(client, "requests") if r["lane"] == "image")
    assert (row["image_width"], row["image_height"], row["image_steps"], row["image_count"]) == (
        256,
        128,
        3,
        2,
    )


def _wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(struct.pack("<h", 0) * int(8000 * seconds))
    return buf.getvalue()


def test_transcription_with_and_without_a_model(client: httpx.Client) -> None:
    files = {"file": ("a.wav", _wav(0.2), "audio/wav")}
    resp = client.post("/v1/audio/transcriptions", files=files, data={"model": "ears"})
    assert resp.status_code == 200 and "text" in resp.json()
    resp = client.post("/v1/audio/transcriptions", files=files)
    assert resp.status_code == 200
    resp = client.post("/v1/audio/transcriptions", files=files, data={"model": "nope"})
    assert resp.status_code == 404
    # Anything but WAV is refused before a whisper model is loaded for it.
    mp3 = {"file": ("a.mp3", b"ID3\x04" + bytes(64), "audio/mpeg")}
    resp = client.post("/v1/audio/transcriptions", files=mp3, data={"model": "ears"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "file"
    resp = client.post("/v1/audio/transcriptions", data={"model": "ears"}, files={"x": b"1"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "file"


def test_embeddings(client: httpx.Client) -> None:
    resp = client.post("/v1/embeddings", json={"model": "alpha", "input": ["a", "b"]})
    assert resp.status_code == 200 and len(resp.json()["data"]) == 2


def test_ollama_embed_and_legacy_embeddings_are_translated(client: httpx.Client) -> None:
    resp = client.post("/api/embed", json={"model": "alpha", "input": ["a", "bb"]})
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["model"] == "alpha" and len(doc["embeddings"]) == 2
    assert all(isinstance(x, float) for x in doc["embeddings"][0])
    assert doc["embeddings"][0] != doc["embeddings"][1]
    single = client.post("/api/embed", json={"model": "alpha", "input": "a"}).json()
    assert single["embeddings"] == [doc["embeddings"][0]]
    legacy = client.post("/api/embeddings", json={"model": "alpha", "prompt": "a"})
    assert legacy.status_code == 200 and legacy.json() == {"embedding": doc["embeddings"][0]}
    for body in (
        {"model": "alpha", "input": []},
        {"model": "alpha", "input": [1]},
        {"model": "alpha"},
    ):
        resp = client.post("/api/embed", json=body)
        assert resp.status_code == 400 and "input" in resp.json()["error"], body
    resp = client.post("/api/embeddings", json={"model": "alpha", "prompt": 3})
    assert resp.status_code == 400 and "prompt" in resp.json()["error"]


def test_ollama_show_answers_from_the_records(client: httpx.Client) -> None:
    resp = client.post("/api/show", json={"model": "seer"})
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["capabilities"][:3] == ["completion", "tools", "vision"]
    assert doc["model_info"]["sim.context_length"] == 4096
    assert client.post("/api/show", json={"name": "alpha"}).json()["capabilities"][0] == (
        "completion"
    )
    resp = client.post("/api/show", json={"model": "nobody"})
    listed = "alpha, beta, broken, seer, slow"
    assert resp.status_code == 404
    assert resp.json() == {"error": f"model 'nobody' not found; the models here are: {listed}"}


def test_explicit_load_and_unload(client: httpx.Client) -> None:
    resp = client.post("/router/v1/load", json={"model": "beta"})
    assert resp.status_code == 200 and resp.json()["lanes"] == ["text"]
    records = {r["local_id"]: r for r in client.get("/router/v1/models").json()["models"]}
    assert records["beta"]["loaded"] is True and records["beta"]["config_hash"]
    resp = client.post("/router/v1/unload", json={"model": "beta"})
    assert resp.json()["unloaded"] == ["text"]
    assert client.get("/api/ps").json()["models"] == []
    assert client.post("/router/v1/load", json={}).status_code == 400
    assert client.post("/router/v1/load", json={"model": "nope"}).status_code == 404


def test_sigterm_stops_the_node_and_its_backends(tmp_path: Path) -> None:
    node = start_node(tmp_path, [text_model("solo")], workers=True)
    try:
        with node.client() as c:
            assert c.post("/v1/chat/completions", json=chat("solo")).status_code == 200
            pid = _text_backend(c)["pid"]
        assert node.stop(timeout=30) == 0
        assert "router stopped" in node.output()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        node.cleanup()


def test_an_invalid_config_exits_non_zero_naming_the_key(tmp_path: Path) -> None:
    node = start_node(tmp_path, [text_model("solo")], wait=False, cluster={"role": "boss"})
    try:
        code = node.proc.wait(60)
        assert code != 0
        wait_for(lambda: "cluster.role" in node.output(), timeout=10)
    finally:
        node.cleanup()
