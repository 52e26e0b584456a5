"""The master's poll round: a poll answer never rolls back a snapshot taken in while it was out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.node import Node, build_node
from registry.nodeclient import AllowList, NodeClient
from registry.sync import ClusterSync
from routerproject.config import load_config

TOKEN = "cluster-secret-for-sync-tests"
SLAVE = "http://127.0.0.1:9"
WAIT_SECS = 5.0


def snapshot(*, disabled: bool) -> dict[str, Any]:
    model = {
        "local_id": "solo",
        "model_hash": "a" * 64,
        "config_hash": "b" * 64,
        "has_llm": True,
        "disabled": disabled,
    }
    return {"node_id": "s1", "node_url": SLAVE, "models": [model], "protocol_version": 2}


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Node]:
    (tmp_path / "kcpps").mkdir()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "server": {"bind": "127.0.0.1:18997"},
                "cluster": {
                    "role": "master",
                    "node_id": "master",
                    "token": TOKEN,
                    "public_url": "http://127.0.0.1:18997",
                    "slave_urls": [SLAVE],
                    "store_dir": str(tmp_path / "store"),
                },
                "models": {"config_dir": str(tmp_path / "kcpps")},
                "backend": {"mode": "sim"},
            }
        )
    )
    node = build_node(load_config(config_path, environ={}))
    yield node
    if node.client is not None:
        await node.client.aclose()


def disabled_flags(node: Node) -> list[bool]:
    return [bool(r.record.get("disabled")) for r in node.cluster.by_public_id["solo"]]


async def test_a_poll_sent_before_a_newer_snapshot_is_dropped_and_the_next_one_counts(
    master: Node,
) -> None:
    asked = asyncio.Event()
    release = asyncio.Event()

    async def slave(request: httpx.Request) -> httpx.Response:
        # The slave answers with its state from before the change the master is told about.
        asked.set()
        await release.wait()
        return httpx.Response(200, json=snapshot(disabled=False))

    master.client = NodeClient(
        token=TOKEN,
        allow=AllowList([SLAVE]),
        control_timeout=WAIT_SECS,
        transport=httpx.MockTransport(slave),
    )
    sync = ClusterSync(master)
    poll = asyncio.ensure_future(sync.poll_all())
    await asyncio.wait_for(asked.wait(), WAIT_SECS)
    # What an enable/disable answer does on the master while the poll is out.
    master.cluster.apply_poll(SLAVE, snapshot(disabled=True))
    release.set()
    await asyncio.wait_for(poll, WAIT_SECS)
    assert disabled_flags(master) == [True]

    await asyncio.wait_for(sync.poll_all(), WAIT_SECS)
    assert disabled_flags(master) == [False]
