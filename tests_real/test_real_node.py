"""A standalone node in front of real llama-server processes (Gemma 3 270M, a base model).

The answers' words are not checked (a base model says what it likes); their shape, token
counts, model IDs and what the node records are.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.harness import RouterNode, wait_for
from tests_real.realnode import analytics, backend_props, start_real_node, text_backend

pytestmark = pytest.mark.integration

NARROW = "gemma"
WIDE = "gemma-wide"
EMBED = "gemma-embed"


def configs(gguf: Path) -> dict[str, dict[str, Any]]:
    weights = str(gguf)
    return {
        NARROW: {"model_param": weights, "contextsize": 1024, "parallel": 1},
        # The same GGUF with a bigger window split over two slots.
        WIDE: {"model_param": weights, "contextsize": 4096, "parallel": 2},
        EMBED: {
            "model_param": weights,
            "contextsize": 1024,
            "parallel": 1,
            "embeddings": True,
            "extra_args": ["--pooling", "mean"],
        },
    }


class Real:
    def __init__(self, node: RouterNode, startup_backend: dict[str, Any]) -> None:
        self.node = node
        self.startup_backend = startup_backend


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, llama_server: str, gguf: Path) -> Iterator[Real]:
    node = start_real_node(tmp_path_factory.mktemp("real"), llama_server, configs(gguf))
    try:
        with node.client() as client:
            startup = text_backend(client)
        yield Real(node, startup)
    finally:
        node.cleanup()


@pytest.fixture
def client(real: Real) -> Iterator[httpx.Client]:
    with real.node.client(timeout=300) as c:
        yield c


def chat(model: str, content: str = "The capital of France is", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_a_model_starts_lazily_on_its_first_request(
    real: Real, client: httpx.Client, llama_server: str, gguf: Path
) -> None:
    # Nothing ran before the first request: the node started no backend of its own accord.
    assert real.startup_backend["pid"] is None
    resp = client.post("/v1/chat/completions", json=chat(NARROW, max_tokens=8))
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["model"] == NARROW and doc["object"] == "chat.completion"
    assert doc["choices"][0]["message"]["role"] == "assistant"
    usage = doc["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    backend = text_backend(client)
    assert backend["lifecycle_state"] == "ready"
    argv = cmdline(backend["pid"])
    assert argv[0] == llama_server and argv[argv.index("-m") + 1] == str(gguf)
    assert argv[argv.index("--alias") + 1] in (NARROW, WIDE, EMBED)
    loads = wait_for(lambda: analytics(client, "loads", NARROW))
    assert loads[0]["success"] and loads[0]["duration_ms"] > 0


def test_two_configs_of_one_gguf_switch_with_their_own_context(client: httpx.Client) -> None:
    for model, slot_context in ((NARROW, 1024), (WIDE, 2048), (NARROW, 1024)):
        resp = client.post("/v1/chat/completions", json=chat(model, max_tokens=4))
        assert resp.status_code == 200 and resp.json()["model"] == model, resp.text
        backend = text_backend(client)
        assert [m["model_id"] for m in backend["loaded_models"]] == [model]
        argv = cmdline(backend["pid"])
        assert argv[argv.index("--alias") + 1] == model
        # llama-server's own view of one slot's window is what the router reports.
        props = backend_props(client)
        assert props["default_generation_settings"]["n_ctx"] == slot_context
        show = client.post("/api/show", json={"model": model}).json()
        assert show["model_info"]["llama_sdcpp.context_length"] == slot_context


def stream(client: httpx.Client, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line.removeprefix("data: ") for line in resp.iter_lines() if line]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [orjson.loads(line) for line in lines[:-1]]


def test_streams_bring_their_usage_to_analytics_and_to_clients_that_ask(
    client: httpx.Client,
) -> None:
    before = len(analytics(client, "requests", NARROW))
    chunks = stream(client, chat(NARROW, max_tokens=6, stream=True))
    assert chunks and all("usage" not in c or c["usage"] is None for c in chunks)
    assert all(c["model"] == NARROW and c["object"] == "chat.completion.chunk" for c in chunks)
    asked = stream(
        client, chat(NARROW, max_tokens=6, stream=True, stream_options={"include_usage": True})
    )
    usage = asked[-1]["usage"]
    assert asked[-1]["choices"] == [] and 0 < usage["completion_tokens"] <= 6
    rows = wait_for(lambda: len(r := analytics(client, "requests", NARROW)) >= before + 2 and r)
    streamed = [r for r in rows if r["stream"]][:2]
    assert len(streamed) == 2
    for row in streamed:
        assert row["success"] and row["prompt_tokens"] > 0 and 0 < row["output_tokens"] <= 6
    assert usage["prompt_tokens"] in {r["prompt_tokens"] for r in streamed}


def test_a_prompt_over_the_context_gets_llama_servers_own_error(client: httpx.Client) -> None:
    long_prompt = " ".join(["word"] * 3000)
    resp = client.post("/v1/chat/completions", json=chat(NARROW, long_prompt, max_tokens=4))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["n_ctx"] == 1024 and error["n_prompt_tokens"] > 1024


def test_embeddings_come_from_the_config_that_enables_them(client: httpx.Client) -> None:
    resp = client.post("/v1/embeddings", json={"model": EMBED, "input": ["one", "two words"]})
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["model"] == EMBED and [d["index"] for d in doc["data"]] == [0, 1]
    dims = {len(d["embedding"]) for d in doc["data"]}
    assert dims == {640}  # Gemma 3 270M's hidden size
    assert doc["usage"]["prompt_tokens"] > 0
    records = {r["local_id"]: r for r in client.get("/router/v1/models").json()["models"]}
    assert records[EMBED]["has_embeddings"] and not records[NARROW]["has_embeddings"]
    refused = client.post("/v1/embeddings", json={"model": NARROW, "input": "one"})
    assert refused.status_code in (400, 404) and "error" in refused.json()


def test_a_dead_backend_is_logged_by_name_and_restarted_by_the_next_request(
    real: Real, client: httpx.Client
) -> None:
    assert client.post("/v1/chat/completions", json=chat(NARROW, max_tokens=2)).status_code == 200
    pid = text_backend(client)["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: text_backend(client)["lifecycle_state"] == "failed")
    line = wait_for(lambda: next((x for x in real.node.lines if "exited with code" in x), None))
    assert NARROW in line and f"{NARROW}.kcpps" in line and "ModelConfig(" not in line
    resp = client.post("/v1/chat/completions", json=chat(NARROW, max_tokens=2))
    assert resp.status_code == 200 and text_backend(client)["pid"] != pid


def test_short_prompts_give_a_bytes_per_token_estimate_near_what_llama_server_counts(
    real: Real, client: httpx.Client
) -> None:
    import numpy as np

    from analytics.fitting import token_profile
    from tests_real.realnode import node_rows

    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", chat(NARROW, "Hi", max_tokens=2)),
        ("/v1/chat/completions", chat(NARROW, "Tell me about the moon.", max_tokens=2)),
        ("/v1/completions", {"model": NARROW, "prompt": "Hi", "max_tokens": 2}),
        ("/v1/completions", {"model": NARROW, "prompt": "One two three four", "max_tokens": 2}),
        ("/v1/chat/completions", chat(NARROW, "A story. " * 40, max_tokens=2)),
        ("/v1/completions", {"model": NARROW, "prompt": "The sea, " * 30, "max_tokens": 2}),
    ]
    # By request ID: a row of an earlier test may still be on its way to the database.
    ids = [f"bytes-per-token-{uuid.uuid4().hex}-{i}" for i in range(len(bodies))]
    for request_id, (path, body) in zip(ids, bodies, strict=True):
        answer = client.post(path, json=body, headers={"x-request-id": request_id})
        assert answer.status_code == 200

    def ours() -> list[dict[str, Any]]:
        by_id = {r["request_id"]: r for r in node_rows(real.node, "requests", NARROW)}
        return [by_id[i] for i in ids] if all(i in by_id for i in ids) else []

    rows = wait_for(ours)
    b = np.array([r["prompt_bytes"] for r in rows])
    t = np.array([r["prompt_tokens"] for r in rows])
    profile = token_profile(b, t, np.array([r["output_tokens"] for r in rows]), min_samples=3)
    assert profile is not None
    estimates = [profile.prompt_tokens(int(x)) for x in b]
    print(f"\nbytes {b.tolist()} tokens {t.tolist()} estimated {estimates}; {profile}")
    assert profile.conservative_bytes_per_token > 1.0  # not the 0.5 floor
    for actual, estimate in zip(t.tolist(), estimates, strict=True):
        # A few tokens over on the shortest prompts, never a multiple of a long one.
        assert estimate <= 1.5 * actual + 30
