"""A helper's own request to a model with no link waits behind borrowed work on its runtime:
the wait is logged (spec: "Each time a node's own request waits behind borrowed work, the wait
is written to the decision log"), against real simulated backend processes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from lending.flow import Takeback, borrowed_acquire
from lending.runtime import Lending
from proxy.forwarding.local import Job, _backend_headers, forward, shape_openai
from proxy.node import Node
from proxy.request import Ctx
from proxy.tests.direct import Client, built_node
from routerproject.errors import RouterError

WAIT_SECS = 20.0
SIM_WEIGHTS = {"load_ms": 5, "base_ms": 1, "output_ms_per_token": 0}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(0.0)


@pytest.fixture
async def node(tmp_path: Path, clock: Clock) -> AsyncIterator[Node]:
    """A helper with three text models on one runtime; none of them is linked."""
    kcpps, weights = tmp_path / "kcpps", tmp_path / "weights"
    kcpps.mkdir()
    weights.mkdir()
    for name in ("mine", "lent", "queued"):
        (weights / f"{name}.sim.json").write_text(json.dumps(SIM_WEIGHTS))
        raw = {"backend_mode": "sim", "model_param": f"../weights/{name}.sim.json"}
        (kcpps / f"{name}.kcpps").write_text(json.dumps(raw | {"contextsize": 512}))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": {"node_id": "helper", "store_dir": str(tmp_path / "store")},
                "models": {"config_dir": str(kcpps)},
                "backend": {"mode": "sim", "load_timeout": "20s"},
            }
        )
    )
    async with built_node(config_path) as built:
        built.lending = Lending(node_id="helper", file_values={}, clock=clock)
        yield built


@pytest.fixture
def rows(node: Node, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    recorded: list[dict[str, Any]] = []
    monkeypatch.setattr(node.decisions, "record", lambda **fields: recorded.append(fields))
    return recorded


def job(node: Node, model: str) -> Job:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return Job(
        cfg=node.catalog.configs[model],
        lane="text",
        model_id=model,
        public_id=model,
        backend_path="/v1/chat/completions",
        body=orjson.dumps(body),
    )


def own_request(client: Client) -> Ctx:
    scope = {"type": "http", "headers": [], "query_string": b""}
    return Ctx(
        scope, client.receive, client.send, "/v1/chat/completions", "POST", request_id="own-1"
    )


async def test_an_unlinked_models_wait_behind_running_borrowed_work_is_logged(
    node: Node, clock: Clock, rows: list[dict[str, Any]]
) -> None:
    runtime = node.runtimes.runtime_for(node.catalog.configs["mine"], "text")
    # One borrowed request holds the runtime (generating); a second waits for it to switch.
    running, waiting = job(node, "lent"), job(node, "queued")
    node.restore.borrowed_started(running, False)
    await runtime.acquire(running.cfg, reason="borrowed")
    node.restore.borrowed_started(waiting, False)
    queued = asyncio.ensure_future(
        borrowed_acquire(node, waiting, runtime.acquire(waiting.cfg, reason="borrowed"))
    )
    await asyncio.sleep(0)  # its first step registers what takes it back
    assert [type(t) for t in node.lending.borrowed_waiting["text"]] == [Takeback]

    clock.now = 100.0
    client = Client()
    own = asyncio.ensure_future(forward(own_request(client), node, job(node, "mine"), shape_openai))
    # The own request hands the waiting borrowed request back to its owner at once...
    with pytest.raises(RouterError) as returned:
        await asyncio.wait_for(queued, WAIT_SECS)
    assert returned.value.status == 409
    node.restore.borrowed_finished(waiting)
    # ...and waits for the running one, which finishes 250 ms after the own request arrived.
    clock.now = 100.25
    runtime.release()
    node.restore.borrowed_finished(running)
    await asyncio.wait_for(own, WAIT_SECS)

    assert client.messages[0]["status"] == 200
    waited = [r for r in rows if r["outcome"] == "native_waited_behind_borrowed"]
    assert waited == [
        {
            "kind": "helper",
            "lane": "text",
            "owner_node_id": "helper",
            "owner_model_id": "mine",
            "outcome": "native_waited_behind_borrowed",
            "borrowed_ahead": 1,
            "wait_ms": 250,
            "request_id": "own-1",
            "key_name": None,
        }
    ]


async def test_an_unlinked_model_with_no_borrowed_work_ahead_logs_nothing(
    node: Node, clock: Clock, rows: list[dict[str, Any]]
) -> None:
    client = Client()
    await asyncio.wait_for(
        forward(own_request(client), node, job(node, "mine"), shape_openai), WAIT_SECS
    )
    assert client.messages[0]["status"] == 200
    assert rows == []


@pytest.mark.parametrize(("stream", "connection"), [(True, "close"), (False, None)])
async def test_a_stream_asks_its_backend_for_a_connection_of_its_own(
    node: Node, stream: bool, connection: str | None
) -> None:
    # llama-server drops the connection after a stream although its answer says keep-alive:
    # pooled, it would fail the next request sent on it.
    streamed = dataclasses.replace(job(node, "mine"), stream=stream)
    assert _backend_headers(streamed).get("Connection") == connection
