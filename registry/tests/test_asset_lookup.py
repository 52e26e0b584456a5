"""The master's asset lookup: one shared deadline, a 5 s cache, registered sources only.

The nodes are mocked at the HTTP seam (the node client's transport); the master is a real
node object with its real database index.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.node import Node, build_node
from registry.assets.service import LOOKUP_CACHE_SECS, AssetService
from registry.nodeclient import AllowList, NodeClient
from routerproject.config import load_config

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "cluster-secret-for-lookup-tests"
FAST = "http://127.0.0.1:9"
SLOW = "http://127.0.0.1:10"
MASTER = "http://127.0.0.1:18996"
DIGEST = "cd" * 32
HANG_GUARD_SECS = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Node]:
    (tmp_path / "kcpps").mkdir()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "server": {"bind": "127.0.0.1:18996"},
                "cluster": {
                    "role": "master",
                    "node_id": "master",
                    "token": TOKEN,
                    "public_url": MASTER,
                    "slave_urls": [FAST, SLOW],
                    "store_dir": str(tmp_path / "store"),
                },
                "models": {
                    "config_dir": str(tmp_path / "kcpps"),
                    "asset_lookup_timeout": "300ms",
                },
                "backend": {"mode": "sim"},
            }
        )
    )
    node = build_node(load_config(config_path, environ={}))
    for node_id, url in (("fast", FAST), ("slow", SLOW)):
        node.cluster.register(
            {"node_id": node_id, "node_url": url, "models": [], "protocol_version": 2}
        )
    yield node
    if node.client is not None:
        await node.client.aclose()


def wire(master: Node, answers: dict[str, list[dict[str, Any]]], asked: list[str]) -> None:
    never = asyncio.Event()

    async def nodes(request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        asked.append(base)
        if base == SLOW:
            await never.wait()  # a node that never answers
        return httpx.Response(200, json={"assets": answers.get(base, [])})

    master.client = NodeClient(
        token=TOKEN,
        allow=AllowList([FAST, SLOW, MASTER]),
        control_timeout=30,
        transport=httpx.MockTransport(nodes),
    )


def record(url: str) -> dict[str, Any]:
    return {"sha256": DIGEST, "filename": "m.gguf", "size": 10, "node_url": url}


async def test_a_node_that_never_answers_costs_the_lookup_only_its_shared_deadline(
    master: Node,
) -> None:
    asked: list[str] = []
    wire(master, {FAST: [record(FAST), record("http://127.0.0.1:11")]}, asked)
    found = await asyncio.wait_for(master.assets.lookup_cluster([DIGEST]), HANG_GUARD_SECS)
    # The slow node's silence drops only its own answer; a URL that is no registered node
    # is never named as a source.
    assert found == [record(FAST)]
    assert set(asked) == {FAST, SLOW}


async def test_answers_are_cached_per_hash_for_five_seconds(master: Node) -> None:
    clock = Clock()
    master.assets = AssetService(master, monotonic=clock)
    asked: list[str] = []
    wire(master, {FAST: [record(FAST)]}, asked)
    assert await asyncio.wait_for(master.assets.lookup_cluster([DIGEST]), HANG_GUARD_SECS)
    assert len(asked) == 2
    clock.now += LOOKUP_CACHE_SECS - 0.01
    assert await master.assets.lookup_cluster([DIGEST]) == [record(FAST)]
    assert len(asked) == 2  # answered from the cache
    clock.now += 0.02
    await asyncio.wait_for(master.assets.lookup_cluster([DIGEST]), HANG_GUARD_SECS)
    assert len(asked) == 4


async def test_the_master_never_names_itself_as_a_source(master: Node) -> None:
    asked: list[str] = []
    wire(master, {FAST: [record(MASTER), record(FAST)]}, asked)
    sources = await asyncio.wait_for(master.assets.peer_sources(DIGEST), HANG_GUARD_SECS)
    assert sources == [record(FAST)]
