"""The master's side of lending belongs to its node: built with it, and collected with it.

And an owner asks the master with its own node's `cluster.lending_event_timeout`."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import yaml

from lending.master import get_master
from proxy.node import Node, build_node
from routerproject.config import load_config

TOKEN = "cluster-secret-for-master-owner-tests"


def node_of(tmp_path: Path, role: str, **timers: str) -> Node:
    (tmp_path / "kcpps").mkdir(exist_ok=True)
    cluster: dict[str, Any] = {
        "role": role,
        "node_id": role,
        "token": TOKEN,
        "public_url": "http://127.0.0.1:18994",
        "store_dir": str(tmp_path / "store"),
        **timers,
    }
    if role == "slave":
        cluster["master_url"] = "http://127.0.0.1:18993"
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": cluster,
                "models": {"config_dir": str(tmp_path / "kcpps")},
                "backend": {"mode": "sim"},
            }
        )
    )
    return build_node(load_config(config_path, environ={}))


async def test_a_dropped_master_node_is_collected_with_its_master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = node_of(tmp_path, "master")
    monkeypatch.setattr(node.decisions, "record", lambda **fields: None)
    master = get_master(node)
    assert master is node.master
    assert get_master(node) is master
    await master.plan("tick")
    await master.close()
    if node.client is not None:
        await node.client.aclose()
    node_ref, master_ref = weakref.ref(node), weakref.ref(master)

    del node, master
    gc.collect()

    assert node_ref() is None
    assert master_ref() is None


def test_a_slave_has_no_master_side(tmp_path: Path) -> None:
    node = node_of(tmp_path, "slave")

    assert node.master is None
    with pytest.raises(RuntimeError, match="slave"):
        get_master(node)


def test_a_standalone_node_has_one_for_its_metrics(tmp_path: Path) -> None:
    node = node_of(tmp_path, "standalone")

    assert get_master(node) is node.master
    assert node.master is not None and node.master.node is node


async def test_an_owner_waits_for_the_master_s_answer_as_long_as_its_config_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = node_of(tmp_path, "slave", lending_event_timeout="1.5s")
    assert node.client is not None
    asked: list[Any] = []

    async def call_json(method: str, base_url: str, path: str, **kwargs: Any) -> Any:
        asked.append((path, kwargs.get("timeout")))
        return 200, {}

    monkeypatch.setattr(node.client, "call_json", call_json)

    assert await node.owner._ask("text", "big", "enqueued") == (None, True)
    assert asked == [("/router/v1/node/offload/event", 1.5)]
    await node.client.aclose()


async def test_a_task_that_fails_as_the_master_closes_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = node_of(tmp_path, "master")
    master = get_master(node)
    started = asyncio.Event()

    async def fails_when_cancelled() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("a clean-up bug")

    task = asyncio.ensure_future(fails_when_cancelled())
    master._tasks.add(task)
    await started.wait()

    await master.close()

    (record,) = [r for r in caplog.records if r.name == "lending.master" and r.exc_info]
    assert "failed as it closed" in record.getMessage()
    assert "a clean-up bug" in caplog.text
    if node.client is not None:
        await node.client.aclose()
