"""The Restorer's count of borrowed work per runtime (what the Nodes page and unload read)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from proxy.forwarding.local import Job
from proxy.node import Node, build_node
from registry.kcpps import Lane
from routerproject.config import load_config

SIM_WEIGHTS = {"load_ms": 5, "base_ms": 1, "output_ms_per_token": 0}
WAIT_SECS = 5.0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A node with two text models and an image model; nothing is ever loaded."""
    kcpps, weights = tmp_path / "kcpps", tmp_path / "weights"
    kcpps.mkdir()
    weights.mkdir()
    for name in ("chat", "other", "picture"):
        (weights / f"{name}.sim.json").write_text(json.dumps(SIM_WEIGHTS))
    for name in ("chat", "other"):
        raw = {"backend_mode": "sim", "model_param": f"../weights/{name}.sim.json"}
        (kcpps / f"{name}.kcpps").write_text(json.dumps(raw))
    picture = {"backend_mode": "sim", "sdmodel": "../weights/picture.sim.json"}
    (kcpps / "picture.kcpps").write_text(json.dumps(picture))
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
    try:
        yield built
    finally:
        built.restore.close()


def job(node: Node, model: str, lane: Lane = "text") -> Job:
    cfg = node.catalog.configs[model]
    return Job(
        cfg=cfg,
        lane=lane,
        model_id=model,
        public_id=model,
        backend_path="/v1/chat/completions",
        body=b"{}",
    )


def test_borrowed_work_is_counted_on_the_runtime_it_was_admitted_to(node: Node) -> None:
    text = node.runtimes.runtimes["text"]
    image = node.runtimes.runtimes["image"]
    first, second = job(node, "chat"), job(node, "other")
    drawing = job(node, "picture", "image")

    node.restore.borrowed_started(first, False)
    # A borrowed request for another model of the same lane waits for the same runtime.
    node.restore.borrowed_started(second, False)
    node.restore.borrowed_started(drawing, False)
    assert (node.restore.borrowed_on(text), node.restore.borrowed_on(image)) == (2, 1)
    assert node.restore.borrowed_in_flight == 3

    node.restore.borrowed_finished(first)
    node.restore.borrowed_finished(drawing)
    assert (node.restore.borrowed_on(text), node.restore.borrowed_on(image)) == (1, 0)
    node.restore.borrowed_finished(second)
    assert (node.restore.borrowed_on(text), node.restore.borrowed_on(image)) == (0, 0)
    assert node.restore.borrowed_in_flight == 0
    assert node.restore.borrowed_by_runtime == {}


def test_a_request_handed_back_before_it_started_uncounts_nothing(node: Node) -> None:
    # forward() calls borrowed_finished even when the helper's own work sent the request back
    # before it reached borrowed_started; that must not hide another request still running.
    text = node.runtimes.runtimes["text"]
    running, returned = job(node, "chat"), job(node, "other")
    node.restore.borrowed_started(running, False)
    node.restore.borrowed_finished(returned)
    assert node.restore.borrowed_on(text) == 1
    assert node.restore.borrowed_in_flight == 1
    # Finishing the same job twice does not uncount twice either.
    node.restore.borrowed_finished(running)
    node.restore.borrowed_finished(running)
    assert node.restore.borrowed_on(text) == 0 and node.restore.borrowed_in_flight == 0


async def test_borrowed_drained_returns_once_the_runtimes_last_borrowed_request_ends(
    node: Node,
) -> None:
    text = node.runtimes.runtimes["text"]
    first, second = job(node, "chat"), job(node, "other")
    await asyncio.wait_for(node.restore.borrowed_drained(text), WAIT_SECS)  # nothing to wait for

    node.restore.borrowed_started(first, False)
    node.restore.borrowed_started(second, False)
    waiter = asyncio.ensure_future(node.restore.borrowed_drained(text))
    await asyncio.sleep(0)  # one turn of the loop: the waiter is now parked
    # Borrowed work on another runtime ending, or one of two here, does not let it return.
    drawing = job(node, "picture", "image")
    node.restore.borrowed_started(drawing, False)
    node.restore.borrowed_finished(drawing)
    node.restore.borrowed_finished(first)
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()
    node.restore.borrowed_finished(second)
    await asyncio.wait_for(waiter, WAIT_SECS)


def test_a_guardian_restores_the_model_still_loading_for_the_request_before_it(
    node: Node,
) -> None:
    text = node.runtimes.runtimes["text"]
    # "chat" is being loaded for a text request: current is empty until the load finishes.
    text.current, text.loading = None, node.catalog.configs["chat"]
    node.restore.guardian_started(job(node, "other"))
    assert node.restore.targets == {id(text): node.catalog.configs["chat"]}


def test_a_guardian_running_on_the_model_already_loaded_restores_nothing(node: Node) -> None:
    text = node.runtimes.runtimes["text"]
    text.current = node.catalog.configs["other"]
    node.restore.guardian_started(job(node, "other"))
    assert node.restore.targets == {}
