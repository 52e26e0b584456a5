"""What a node records and tells clients about its backends, on a real node with simulated ones.

Streams always bring their token counts back for analytics, but only a client that asked sees
them; a stream cut by a dying backend and a backend that cannot load are recorded as the
failures they are; a config's own backend arguments reach its backend; a model with several
slots reports one slot's context.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.harness import ModelSpec, RouterNode, sim_weights, start_node, wait_for

pytestmark = pytest.mark.integration


def _models() -> list[ModelSpec]:
    return [
        ModelSpec(
            "pair",
            {"contextsize": 4096, "parallel": 2, "extra_args": ["--pooling", "mean", "-t", 2]},
            {"model_param": sim_weights(base_ms=5, output_ms_per_token=1)},
        ),
        ModelSpec(
            "slow",
            {"contextsize": 4096, "parallel": 1},
            {"model_param": sim_weights(base_ms=5, output_ms_per_token=100)},
        ),
        ModelSpec("broken", {"contextsize": 4096}, {"model_param": {"load_ms": -1}}),
    ]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    n = start_node(tmp_path_factory.mktemp("outcomes"), _models())
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


def stream_events(client: httpx.Client, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        lines = [line.removeprefix("data: ") for line in resp.iter_lines() if line]
    assert lines[-1] == "[DONE]", lines
    return [orjson.loads(line) for line in lines[:-1]]


def request_rows(client: httpx.Client, model: str) -> list[dict[str, Any]]:
    doc = client.get("/router/v1/site/analytics", params={"kind": "requests", "limit": 500}).json()
    return [r for r in doc["records"] if r["model_id"] == model]


def new_row(client: httpx.Client, model: str, seen: int) -> dict[str, Any]:
    """The analytics row of the next request for `model` after `seen` rows (flushed each second)."""
    rows = wait_for(lambda: (r := request_rows(client, model)) and len(r) > seen and r)
    assert len(rows) == seen + 1, rows
    row: dict[str, Any] = max(rows, key=lambda r: r["finished_at"])
    return row


def text_backend(client: httpx.Client) -> dict[str, Any]:
    state = client.get("/router/v1/site/nodes/state").json()
    backend: dict[str, Any] = next(b for b in state["backends"] if b["id"] == "text-runtime")
    return backend


def test_a_stream_that_did_not_ask_for_usage_shows_none_but_is_recorded_with_its_tokens(
    client: httpx.Client,
) -> None:
    seen = len(request_rows(client, "pair"))
    chunks = stream_events(client, chat("pair", stream=True, max_tokens=6))
    assert all("usage" not in c for c in chunks)
    assert all(c["choices"] for c in chunks) and all(c["model"] == "pair" for c in chunks)
    row = new_row(client, "pair", seen)
    assert row["stream"] and row["success"] and row["status"] == 200
    assert row["output_tokens"] == 6 and row["prompt_tokens"] > 0


def test_a_stream_that_asked_for_usage_gets_the_usage_chunk(client: httpx.Client) -> None:
    seen = len(request_rows(client, "pair"))
    body = chat("pair", stream=True, max_tokens=4, stream_options={"include_usage": True})
    chunks = stream_events(client, body)
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert all("usage" not in c for c in chunks[:-1])
    row = new_row(client, "pair", seen)
    assert row["output_tokens"] == 4
    assert row["prompt_tokens"] == usage["usage"]["prompt_tokens"]


def test_a_stream_cut_by_a_dead_backend_is_recorded_as_a_502_failure(
    client: httpx.Client,
) -> None:
    seen = len(request_rows(client, "slow"))
    events: list[str] = []
    with client.stream(
        "POST", "/v1/chat/completions", json=chat("slow", stream=True, max_tokens=300)
    ) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for line in lines:
            if line:
                events.append(line)
                break
        os.kill(text_backend(client)["pid"], signal.SIGKILL)
        events += [line for line in lines if line]
    # The head was out already: the client gets the error as the stream's last event.
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert last["error"]["type"] == "backend_error"
    row = new_row(client, "slow", seen)
    assert (row["status"], row["success"]) == (502, False)
    assert row["output_tokens"] == 0


def test_a_backend_that_cannot_load_is_recorded_as_the_502_the_client_got(
    client: httpx.Client,
) -> None:
    seen = len(request_rows(client, "broken"))
    resp = client.post("/v1/chat/completions", json=chat("broken"))
    assert resp.status_code == 502 and resp.json()["error"]["type"] == "backend_error"
    row = new_row(client, "broken", seen)
    assert (row["status"], row["success"]) == (502, False)


def test_a_model_with_two_slots_reports_one_slots_context(client: httpx.Client) -> None:
    doc = client.post("/api/show", json={"model": "pair"}).json()
    assert doc["model_info"]["sim.context_length"] == 2048
    records = client.get("/router/v1/models").json()["models"]
    record = next(r for r in records if r["local_id"] == "pair")
    assert record["context_size"] == 2048 and record["parallel"] == 2


def test_a_configs_own_extra_args_reach_its_backend(node: RouterNode, client: httpx.Client) -> None:
    assert client.post("/router/v1/load", json={"model": "pair"}).status_code == 200
    log = (node.store / "logs" / "text-backend.log").read_text()
    launches = [line for line in log.splitlines() if line.startswith("--- ")]
    assert launches[-1].endswith("-a pair -c 4096 -np 2 --pooling mean -t 2"), launches[-1]
