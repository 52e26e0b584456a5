"""`backend.request_timeout` bounds a request to a backend of this node, against a real simulated
backend process that takes far longer to answer than the timeout allows, and a call to another
node, against a socket that never answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import yaml

from proxy.forwarding.deadlines import Deadline
from proxy.forwarding.local import Job, forward, shape_openai
from proxy.forwarding.remote import forward_remote
from proxy.node import Node
from proxy.request import Ctx
from proxy.tests.direct import Client, built_node
from registry.cluster import Replica
from routerproject.errors import RouterError

TIMEOUT_SECS = 0.4
# The backend answers after a minute: only the timeout (or the client leaving) ends a request.
SLOW_SIM = {"load_ms": 5, "base_ms": 60_000, "output_ms_per_token": 0}
WAIT_SECS = 20.0


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    kcpps, weights = tmp_path / "kcpps", tmp_path / "weights"
    kcpps.mkdir()
    weights.mkdir()
    (weights / "slow.sim.json").write_text(json.dumps(SLOW_SIM))
    raw = {"backend_mode": "sim", "model_param": "../weights/slow.sim.json", "contextsize": 512}
    (kcpps / "slow.kcpps").write_text(json.dumps(raw))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": {"node_id": "n1", "store_dir": str(tmp_path / "store")},
                "models": {"config_dir": str(kcpps)},
                "backend": {
                    "mode": "sim",
                    "load_timeout": "20s",
                    "request_timeout": f"{int(TIMEOUT_SECS * 1000)}ms",
                },
            }
        )
    )
    async with built_node(config_path) as built:
        yield built


def request(node: Node, client: Client) -> tuple[Ctx, Job]:
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    scope = {"type": "http", "headers": [], "query_string": b""}
    ctx = Ctx(scope, client.receive, client.send, "/v1/chat/completions", "POST")
    job = Job(
        cfg=node.catalog.configs["slow"],
        lane="text",
        model_id="slow",
        public_id="slow",
        backend_path="/v1/chat/completions",
        body=orjson.dumps(body),
    )
    return ctx, job


async def test_a_backend_slower_than_the_request_timeout_is_a_502_and_frees_its_slot(
    node: Node,
) -> None:
    client = Client()
    ctx, job = request(node, client)
    runtime = node.runtimes.runtime_for(job.cfg, "text")
    with pytest.raises(RouterError) as failed:
        await asyncio.wait_for(forward(ctx, node, job, shape_openai), WAIT_SECS)
    assert failed.value.status == 502
    assert "TimeoutError" in failed.value.message
    assert client.messages == []
    # At least the timeout went by: the answer did not come early, nor from elsewhere.
    assert ctx.upstream_secs >= TIMEOUT_SECS
    assert runtime.active == 0
    assert len(node.deadlines) == 0


async def test_a_client_that_leaves_before_the_timeout_is_not_told_it_timed_out(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client()
    ctx, job = request(node, client)
    runtime = node.runtimes.runtime_for(job.cfg, "text")
    held = asyncio.Event()
    hold = node.deadlines.hold

    def noted(secs: float) -> Deadline:
        held.set()
        return hold(secs)

    monkeypatch.setattr(node.deadlines, "hold", noted)
    task = asyncio.ensure_future(forward(ctx, node, job, shape_openai))
    # The client leaves once the request is on its way to the backend.
    await asyncio.wait_for(held.wait(), WAIT_SECS)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_SECS)
    assert runtime.active == 0


async def test_a_node_slower_than_the_request_timeout_is_a_502_and_the_call_is_let_go(
    tmp_path: Path,
) -> None:
    # A node that takes the call and never answers: a real socket, silent.
    taken: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        taken.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    silent_url = f"http://127.0.0.1:{port}"
    (tmp_path / "kcpps").mkdir()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": {
                    "role": "master",
                    "node_id": "m1",
                    "token": "t" * 32,
                    "public_url": "http://127.0.0.1:9",
                    "slave_urls": [silent_url],
                    "store_dir": str(tmp_path / "store"),
                },
                "models": {"config_dir": str(tmp_path / "kcpps")},
                "backend": {"mode": "sim", "request_timeout": f"{int(TIMEOUT_SECS * 1000)}ms"},
            }
        )
    )
    client = Client()
    scope = {"type": "http", "headers": [], "query_string": b""}
    ctx = Ctx(scope, client.receive, client.send, "/v1/chat/completions", "POST")
    replica = Replica("slow", "s1", "slow", silent_url, True, {}, None)
    try:
        async with built_node(config_path) as node:
            call = forward_remote(
                ctx,
                node,
                replica,
                lane="text",
                path="/v1/chat/completions",
                body=b'{"model": "slow"}',
                public_id="slow",
                served_id="slow",
            )
            with pytest.raises(RouterError) as failed:
                await asyncio.wait_for(call, WAIT_SECS)
            assert failed.value.status == 502
            assert "TimeoutError" in failed.value.message
            assert ctx.upstream_secs >= TIMEOUT_SECS
            assert len(node.deadlines) == 0 and node.busy[("s1", "slow", "text")] == 0
            assert len(taken) == 1
    finally:
        server.close()
        for writer in taken:
            writer.close()
