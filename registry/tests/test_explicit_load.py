"""An operator's explicit load is the node's own work (spec: Probes, what idle means)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lending.runtime import Lending
from proxy.node import Node, build_node
from registry import services
from registry.kcpps import ModelConfig
from routerproject.config import load_config
from routerproject.errors import BackendError


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(10.0)


@pytest.fixture
def node(tmp_path: Path, clock: Clock) -> Iterator[Node]:
    kcpps, weights = tmp_path / "kcpps", tmp_path / "weights"
    kcpps.mkdir()
    weights.mkdir()
    (weights / "chat.sim.json").write_text(json.dumps({"load_ms": 1}))
    raw = {"backend_mode": "sim", "model_param": "../weights/chat.sim.json", "contextsize": 512}
    (kcpps / "chat.kcpps").write_text(json.dumps(raw))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": {"node_id": "helper", "store_dir": str(tmp_path / "store")},
                "models": {"config_dir": str(kcpps)},
                "backend": {"mode": "sim"},
            }
        )
    )
    built = build_node(load_config(config_path, environ={}))
    built.lending = Lending(node_id="helper", file_values={}, clock=clock)
    yield built


def fake_load(node: Node, monkeypatch: pytest.MonkeyPatch, body: Any) -> None:
    cfg = node.catalog.configs["chat"]
    runtime = node.runtimes.runtime_for(cfg, "text")

    async def load(cfg: ModelConfig, *, reason: str = "explicit") -> None:
        await body()

    monkeypatch.setattr(runtime, "load", load)


async def test_a_node_loading_for_itself_is_busy_and_takes_no_borrowed_work(
    node: Node, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, bool]] = []

    async def loading() -> None:
        clock.now = 107.0
        seen.append((node.lending.idle_for_ms(), node.lending.accepting_borrowed("text")))

    fake_load(node, monkeypatch, loading)
    await services.model_load_local(node=node, model_id="chat")

    assert seen == [(0, False)]
    # Idle counts from the end of the load, not from before it.
    clock.now = 110.0
    assert node.lending.idle_for_ms() == 3000
    assert node.lending.accepting_borrowed("text")


async def test_a_load_that_fails_still_ends_the_nodes_own_work(
    node: Node, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing() -> None:
        clock.now = 50.0
        raise BackendError("no such weights")

    fake_load(node, monkeypatch, failing)
    with pytest.raises(BackendError):
        await services.model_load_local(node=node, model_id="chat")

    assert not node.lending.own_work_running()
    clock.now = 50.25
    assert node.lending.idle_for_ms() == 250
