"""A question to every node has one deadline: the nodes that miss it are named, not waited for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from lending.gather import gather_remote
from proxy.node import Node, build_node
from registry.nodeclient import AllowList, NodeClient
from routerproject.config import load_config

TOKEN = "cluster-secret-for-gather-tests"
SLAVES = {
    "quick": "http://127.0.0.1:9",
    "silent": "http://127.0.0.2:9",
    "down": "http://127.0.0.3:9",
}
HANG_GUARD_SECS = 30.0


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Node]:
    (tmp_path / "kcpps").mkdir()
    config = {
        "server": {"bind": "127.0.0.1:18994"},
        "cluster": {
            "role": "master",
            "node_id": "master",
            "token": TOKEN,
            "public_url": "http://127.0.0.1:18994",
            "slave_urls": list(SLAVES.values()),
            "store_dir": str(tmp_path / "store"),
            "control_timeout": "1h",
        },
        "models": {"config_dir": str(tmp_path / "kcpps")},
        "backend": {"mode": "sim"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    node = build_node(load_config(tmp_path / "config.yaml", environ={}))
    for node_id, url in SLAVES.items():
        node.cluster.apply_poll(url, {"node_id": node_id, "node_url": url, "protocol_version": 2})
    node.cluster.mark_unhealthy(SLAVES["down"], "refused")
    never = asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "127.0.0.2":
            await never.wait()  # a node that takes the call and never answers
        return httpx.Response(200, json={"rows": [request.url.host]})

    node.client = NodeClient(
        token=TOKEN,
        allow=AllowList(list(SLAVES.values())),
        control_timeout=3600.0,
        transport=httpx.MockTransport(answer),
    )
    yield node
    await node.client.aclose()


async def test_a_node_that_misses_the_deadline_is_named_and_the_others_answer(
    master: Node,
) -> None:
    answers, errors = await asyncio.wait_for(
        gather_remote(master, "/router/v1/node/audit", deadline=2.0), HANG_GUARD_SECS
    )
    assert answers == {"quick": {"rows": ["127.0.0.1"]}}
    assert errors == [
        {"node_id": "down", "error": "node is not healthy"},
        {"node_id": "silent", "error": "no answer within 2 s"},
    ]


async def test_without_a_deadline_of_its_own_the_question_takes_the_control_timeout(
    master: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = master.config.cluster.model_copy(update={"control_timeout": 0.2})
    monkeypatch.setattr(master, "config", master.config.model_copy(update={"cluster": cluster}))
    _, errors = await asyncio.wait_for(
        gather_remote(master, "/router/v1/node/audit", node_ids={"silent"}), HANG_GUARD_SECS
    )
    assert errors == [{"node_id": "silent", "error": "no answer within 0.2 s"}]
