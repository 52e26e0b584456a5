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
from registry.cluster import RemoteNode
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


def two_slave_master(tmp_path: Path, health_timeout: str) -> Node:
    (tmp_path / "kcpps").mkdir(exist_ok=True)
    config_path = tmp_path / "two.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "server": {"bind": "127.0.0.1:18996"},
                "cluster": {
                    "role": "master",
                    "node_id": "master",
                    "token": TOKEN,
                    "public_url": "http://127.0.0.1:18996",
                    "slave_urls": [FROZEN, SLAVE],
                    "store_dir": str(tmp_path / "store"),
                    "health_timeout": health_timeout,
                    "control_timeout": "5m",
                },
                "models": {"config_dir": str(tmp_path / "kcpps")},
                "backend": {"mode": "sim"},
            }
        )
    )
    return build_node(load_config(config_path, environ={}))


FROZEN = "http://127.0.0.1:10"


async def test_each_poll_is_applied_as_it_arrives_and_a_silent_node_turns_suspect_at_its_deadline(
    tmp_path: Path,
) -> None:
    master = two_slave_master(tmp_path, "300ms")
    frozen_asked = asyncio.Event()

    async def cluster(request: httpx.Request) -> httpx.Response:
        if str(request.url).startswith(FROZEN):
            frozen_asked.set()
            await asyncio.Event().wait()  # a stopped process: the connection stays silent
        return httpx.Response(200, json=snapshot(disabled=False))

    master.client = NodeClient(
        token=TOKEN,
        allow=AllowList([FROZEN, SLAVE]),
        control_timeout=300.0,
        transport=httpx.MockTransport(cluster),
    )
    # The frozen node is listed first: before, its answer held back the second one's.
    master.cluster.nodes["s0"] = RemoteNode("s0", FROZEN, [])
    sync = ClusterSync(master)
    assert not master.cluster.view_ready
    round_ = asyncio.ensure_future(sync.poll_all())
    await asyncio.wait_for(frozen_asked.wait(), WAIT_SECS)
    for _ in range(1000):
        if "s1" in master.cluster.nodes:
            break
        await asyncio.sleep(0.005)
    assert master.cluster.nodes["s1"].healthy
    assert not round_.done() and master.cluster.nodes["s0"].healthy
    await asyncio.wait_for(round_, WAIT_SECS)
    frozen = master.cluster.nodes["s0"]
    assert not frozen.healthy and frozen.suspect
    assert master.cluster.view_ready
    if master.client is not None:
        await master.client.aclose()


async def test_a_poll_answered_with_an_error_status_is_unhealthy_but_not_suspect(
    tmp_path: Path,
) -> None:
    master = two_slave_master(tmp_path, "5s")

    async def cluster(request: httpx.Request) -> httpx.Response:
        if str(request.url).startswith(FROZEN):
            return httpx.Response(401, text="unauthorized")
        return httpx.Response(200, json=snapshot(disabled=False))

    master.client = NodeClient(
        token=TOKEN,
        allow=AllowList([FROZEN, SLAVE]),
        control_timeout=WAIT_SECS,
        transport=httpx.MockTransport(cluster),
    )
    master.cluster.nodes["s0"] = RemoteNode("s0", FROZEN, [])
    await asyncio.wait_for(ClusterSync(master).poll_all(), WAIT_SECS)
    answered_wrongly = master.cluster.nodes["s0"]
    assert not answered_wrongly.healthy and not answered_wrongly.suspect
    if master.client is not None:
        await master.client.aclose()
