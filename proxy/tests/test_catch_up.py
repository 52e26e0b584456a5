"""A master tells a slave that runs other lending settings its links, settings and guardians.

The registry's poll only hands the slave's snapshot to the hooks the node container gave it;
lending and guardians each push their own part, and the container runs them in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from access.keys import current_table
from lending import propagate
from proxy.node import Node, build_node, catch_up_if_stale
from registry.keysync import KEYS_PATH
from registry.nodeclient import AllowList, NodeClient
from registry.sync import ClusterSync
from routerproject.config import load_config

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "cluster-secret-for-catch-up-tests"
SLAVE = "http://127.0.0.1:9"
WAIT_SECS = 5.0
PUSHES = [
    "/router/v1/node/routing-links",
    "/router/v1/node/offload/settings",
    "/router/v1/node/guardians",
]


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
                    "public_url": "http://127.0.0.1:18996",
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


class Slave:
    """Answers polls with a snapshot carrying `fingerprint` (and `keys`, the key table's: the
    master's own unless given); records every push it gets."""

    def __init__(self, fingerprint: str, keys: str | None = None) -> None:
        self.fingerprint = fingerprint
        self.keys = current_table().fingerprint if keys is None else keys
        self.pushed: list[str] = []
        self.all_pushed = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(
                200,
                json={
                    "node_id": "s1",
                    "node_url": SLAVE,
                    "models": [],
                    "protocol_version": 2,
                    "settings_fingerprint": self.fingerprint,
                    "api_keys_fingerprint": self.keys,
                },
            )
        self.pushed.append(request.url.path)
        if len(self.pushed) == len(PUSHES) or request.url.path == KEYS_PATH:
            self.all_pushed.set()
        return httpx.Response(204)


def connect(master: Node, slave: Slave) -> ClusterSync:
    master.client = NodeClient(
        token=TOKEN,
        allow=AllowList([SLAVE]),
        control_timeout=WAIT_SECS,
        transport=httpx.MockTransport(slave),
    )

    def snapshot_seen(node_id: str, snapshot: Mapping[str, Any]) -> None:
        catch_up_if_stale(master, node_id, snapshot)

    # What runrouter hands the registry's poll loop.
    return ClusterSync(master, on_snapshot=[snapshot_seen])


async def test_a_polled_slave_with_other_settings_gets_links_settings_and_guardians_in_order(
    master: Node,
) -> None:
    slave = Slave("not-the-masters")
    await asyncio.wait_for(connect(master, slave).poll_all(), WAIT_SECS)
    await asyncio.wait_for(slave.all_pushed.wait(), WAIT_SECS)
    assert slave.pushed == PUSHES


async def test_a_polled_slave_that_runs_the_masters_settings_gets_nothing(master: Node) -> None:
    slave = Slave(master.lending.fingerprint)
    await asyncio.wait_for(connect(master, slave).poll_all(), WAIT_SECS)
    # The hook schedules a catch-up before the poll returns, or never.
    assert not propagate._catch_up_tasks
    assert slave.pushed == []


async def test_a_polled_slave_with_another_key_table_gets_the_masters(master: Node) -> None:
    slave = Slave(master.lending.fingerprint, keys="not-the-masters")
    await asyncio.wait_for(connect(master, slave).poll_all(), WAIT_SECS)
    await asyncio.wait_for(slave.all_pushed.wait(), WAIT_SECS)
    # The key table alone: the slave runs the master's lending settings already.
    assert slave.pushed == [KEYS_PATH]
