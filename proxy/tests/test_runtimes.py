"""Runtime and RuntimeManager against real simulated backend processes (`python -m proxy.sim`).

Every wait is on a condition (a future, a task, or a state polled in a bounded loop); load
times are kept small so the whole file runs in a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from analytics.recorder import LoadEvent
from proxy.runtimes import runtime as runtime_module
from proxy.runtimes.backends import Launch
from proxy.runtimes.runtime import Runtime, RuntimeManager, free_port
from registry.hashing import FileHasher
from registry.httpclient import close_session, get_session
from registry.kcpps import ModelConfig, load_model_config
from routerproject.config import RouterConfig, load_config
from routerproject.errors import BackendError

REPO_DIR = Path(__file__).resolve().parents[2]
LOAD_MS = 50
CONDITION_TIMEOUT_SECS = 20.0
POLL_SECS = 0.01
SIM_WEIGHTS = {"load_ms": LOAD_MS, "base_ms": 1, "output_ms_per_token": 0}


class Node:
    """A temp models dir with simulated configs, the router config, and what the loads were."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kcpps = root / "kcpps"
        self.weights = root / "weights"
        self.kcpps.mkdir()
        self.weights.mkdir()
        config_path = root / "config.yaml"
        config_path.write_text(
            yaml.safe_dump(
                {
                    "cluster": {"store_dir": str(root / "store")},
                    "models": {"config_dir": str(self.kcpps)},
                    "backend": {"mode": "sim", "load_timeout": "20s"},
                }
            )
        )
        self.config: RouterConfig = load_config(config_path, environ={})
        self.events: list[LoadEvent] = []

    def model(self, name: str, weights: Any = None, **raw: Any) -> ModelConfig:
        weights_path = self.weights / f"{name}.sim.json"
        text = weights if isinstance(weights, str) else json.dumps(weights or SIM_WEIGHTS)
        weights_path.write_text(text)
        path = self.kcpps / f"{name}.kcpps"
        doc = {"backend_mode": "sim", "model_param": f"../weights/{weights_path.name}"} | raw
        path.write_text(json.dumps(doc))
        return load_model_config(path, default_backend_mode="sim", hasher=FileHasher(None))

    def runtime(self) -> Runtime:
        return Runtime(
            "text", config=self.config, log_dir=self.root / "logs", on_load=self.events.append
        )

    def loads(self) -> list[tuple[str, bool]]:
        return [(e.model_id, e.success) for e in self.events]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.fixture
async def runtime(node: Node) -> AsyncIterator[Runtime]:
    rt = node.runtime()
    try:
        yield rt
    finally:
        await rt.close()
        await close_session()


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONDITION_TIMEOUT_SECS
    while not predicate():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(POLL_SECS)


async def within(awaitable: Any) -> Any:
    return await asyncio.wait_for(awaitable, CONDITION_TIMEOUT_SECS)


async def served_model(launch: Launch) -> str:
    """The model id the backend behind `launch` reports (a real round trip)."""
    async with get_session().get(launch.base_url + "/v1/models") as resp:
        assert resp.status == 200
        doc = await resp.json()
    model_id: str = doc["data"][0]["id"]
    return model_id


async def answers(launch: Launch) -> bool:
    try:
        async with get_session().get(
            launch.base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=5)
        ) as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


# -- loading and admission --------------------------------------------------------------


async def test_the_first_acquire_starts_the_backend_and_returns_once_it_is_ready(
    node: Node, runtime: Runtime
) -> None:
    alpha = node.model("alpha")
    launch = await within(runtime.acquire(alpha))
    assert (runtime.state, runtime.current, runtime.active) == ("ready", alpha, 1)
    assert runtime.process is not None and runtime.process.returncode is None
    assert await served_model(launch) == "alpha"
    [event] = node.events
    assert (event.lane, event.model_id, event.config_filename) == ("text", "alpha", "alpha.kcpps")
    assert (event.success, event.reason, event.error) == (True, "own", "")
    assert event.duration_ms >= LOAD_MS
    runtime.release()
    assert runtime.active == 0 and runtime.is_idle()


async def test_a_second_acquire_of_the_loaded_config_is_granted_without_suspending(
    node: Node, runtime: Runtime
) -> None:
    alpha = node.model("alpha")
    launch = await within(runtime.acquire(alpha))
    pid = runtime.process.pid if runtime.process else None
    # Driving the coroutine by hand proves it never waits: it finishes on its first step.
    coro = runtime.acquire(alpha)
    with pytest.raises(StopIteration) as finished:
        coro.send(None)
    assert finished.value.value is launch
    assert runtime.active == 2
    assert runtime.process is not None and runtime.process.pid == pid
    assert node.loads() == [("alpha", True)]


async def test_a_switch_waits_until_every_in_flight_use_is_released(
    node: Node, runtime: Runtime
) -> None:
    alpha, beta = node.model("alpha"), node.model("beta")
    first = await within(runtime.acquire(alpha))
    await within(runtime.acquire(alpha))
    alpha_process = runtime.process
    switch = asyncio.ensure_future(runtime.acquire(beta))
    await wait_for(lambda: runtime.waiting() == 1, "the beta request queues")
    # A real round trip gives the runtime every chance to switch early; it must not.
    assert await served_model(first) == "alpha"
    assert (runtime.state, runtime.current, runtime.loading) == ("ready", alpha, None)
    assert not switch.done()

    runtime.release()
    assert await served_model(first) == "alpha"
    assert not switch.done() and runtime.current is alpha

    runtime.release()
    second = await within(switch)
    assert runtime.current is beta and await served_model(second) == "beta"
    assert alpha_process is not None and alpha_process.returncode is not None
    assert node.loads() == [("alpha", True), ("beta", True)]


async def test_a_request_for_the_loaded_model_does_not_overtake_a_queued_switch(
    node: Node, runtime: Runtime
) -> None:
    alpha, beta = node.model("alpha"), node.model("beta")
    await within(runtime.acquire(alpha))
    to_beta = asyncio.ensure_future(runtime.acquire(beta))
    await wait_for(lambda: runtime.waiting() == 1, "the beta request queues")
    back_to_alpha = asyncio.ensure_future(runtime.acquire(alpha))
    await wait_for(lambda: runtime.waiting() == 2, "the second alpha request queues")

    runtime.release()
    await within(to_beta)
    assert runtime.current is beta
    assert not back_to_alpha.done()
    runtime.release()
    await within(back_to_alpha)
    assert runtime.current is alpha
    assert node.loads() == [("alpha", True), ("beta", True), ("alpha", True)]


async def test_every_waiter_for_a_model_being_loaded_gets_it_from_one_load(
    node: Node, runtime: Runtime
) -> None:
    beta = node.model("beta")
    launches = await within(asyncio.gather(*(runtime.acquire(beta) for _ in range(4))))
    assert all(launch is launches[0] for launch in launches)
    assert runtime.active == 4
    assert node.loads() == [("beta", True)]


async def test_a_cancelled_waiter_gives_its_place_to_the_next_one(
    node: Node, runtime: Runtime
) -> None:
    alpha, beta = node.model("alpha"), node.model("beta")
    await within(runtime.acquire(alpha))
    to_beta = asyncio.ensure_future(runtime.acquire(beta))
    await wait_for(lambda: runtime.waiting() == 1, "the beta request queues")
    more_alpha = asyncio.ensure_future(runtime.acquire(alpha))
    await wait_for(lambda: runtime.waiting() == 2, "the alpha request queues behind it")

    to_beta.cancel()
    launch = await within(more_alpha)
    assert to_beta.cancelled()
    assert await served_model(launch) == "alpha"
    assert (runtime.active, runtime.waiting()) == (2, 0)
    assert node.loads() == [("alpha", True)]


async def test_a_waiter_cancelled_while_its_model_loads_leaves_the_runtime_usable(
    node: Node, runtime: Runtime
) -> None:
    alpha = node.model("alpha")
    waiter = asyncio.ensure_future(runtime.acquire(alpha))
    await wait_for(lambda: runtime.state == "loading", "the load starts")
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    await within(runtime.wait_idle())
    assert (runtime.state, runtime.active) == ("ready", 0)
    launch = await within(runtime.acquire(alpha))
    assert await served_model(launch) == "alpha"
    assert node.loads() == [("alpha", True)]


# -- failures ---------------------------------------------------------------------------


async def test_a_failed_load_fails_only_the_waiters_for_that_config(
    node: Node, runtime: Runtime
) -> None:
    alpha, gamma = node.model("alpha"), node.model("gamma")
    # The sim exits with code 2 on weights that are not valid JSON.
    broken = node.model("broken", weights="{not json")
    await within(runtime.acquire(alpha))
    tasks = [asyncio.ensure_future(runtime.acquire(cfg)) for cfg in (broken, broken, gamma)]
    await wait_for(lambda: runtime.waiting() == 3, "all three requests queue")

    runtime.release()
    results = await within(asyncio.gather(*tasks, return_exceptions=True))
    for result in results[:2]:
        assert isinstance(result, BackendError)
        assert "exited with code 2" in str(result)
    assert isinstance(results[2], Launch)
    assert await served_model(results[2]) == "gamma"
    assert (runtime.state, runtime.current) == ("ready", gamma)
    assert node.loads() == [("alpha", True), ("broken", False), ("gamma", True)]
    failed = node.events[1]
    assert failed.config_filename == "broken.kcpps"
    assert "exited with code 2" in failed.error


async def test_a_failed_load_leaves_the_runtime_failed_with_the_reason(
    node: Node, runtime: Runtime
) -> None:
    broken = node.model("broken", weights='{"load_ms": -1}')
    with pytest.raises(BackendError, match="exited with code 2"):
        await within(runtime.acquire(broken))
    assert (runtime.state, runtime.current, runtime.active) == ("failed", None, 0)
    assert "load_ms" in runtime.last_error
    assert runtime.status()["last_error"] == runtime.last_error


async def test_a_config_with_missing_weights_fails_without_starting_a_process(
    node: Node, runtime: Runtime
) -> None:
    ghost = node.model("ghost")
    (node.weights / "ghost.sim.json").unlink()
    with pytest.raises(BackendError, match="does not exist"):
        await within(runtime.acquire(ghost))
    assert runtime.process is None
    assert node.loads() == [("ghost", False)]


async def test_a_killed_backend_marks_the_runtime_failed_and_the_next_acquire_restarts_it(
    node: Node, runtime: Runtime
) -> None:
    alpha = node.model("alpha")
    await within(runtime.load(alpha))
    assert runtime.process is not None
    old_pid = runtime.process.pid
    generation = runtime.generation
    os.kill(old_pid, signal.SIGKILL)
    await wait_for(lambda: runtime.state == "failed", "the runtime notices the exit")
    assert "exited with code" in runtime.last_error

    launch = await within(runtime.acquire(alpha))
    assert runtime.state == "ready" and runtime.generation == generation + 1
    assert runtime.process is not None and runtime.process.pid != old_pid
    assert await served_model(launch) == "alpha"
    assert node.loads() == [("alpha", True), ("alpha", True)]


async def test_a_backend_crash_logs_the_configs_name_and_path_not_the_whole_config(
    node: Node, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    alpha = node.model("alpha")
    await within(runtime.load(alpha))
    assert runtime.process is not None
    with caplog.at_level(logging.WARNING, logger="proxy.runtimes.runtime"):
        os.kill(runtime.process.pid, signal.SIGKILL)
        await wait_for(lambda: runtime.state == "failed", "the runtime notices the exit")
    crashes = [r.getMessage() for r in caplog.records if "exited with code" in r.getMessage()]
    assert len(crashes) == 1
    assert "alpha" in crashes[0] and str(alpha.path) in crashes[0]
    assert "ModelConfig(" not in crashes[0] and alpha.config_hash not in crashes[0]


# -- explicit control -------------------------------------------------------------------


async def test_unload_waits_for_in_flight_uses_then_stops_the_backend(
    node: Node, runtime: Runtime
) -> None:
    alpha = node.model("alpha")
    launch = await within(runtime.acquire(alpha))
    process = runtime.process
    unload = asyncio.ensure_future(runtime.unload())
    assert await served_model(launch) == "alpha"
    assert not unload.done() and runtime.state == "ready"

    runtime.release()
    assert await within(unload) is True
    assert (runtime.state, runtime.current, runtime.process) == ("empty", None, None)
    assert process is not None and process.returncode is not None
    assert not await answers(launch)


async def test_unload_of_an_empty_runtime_reports_that_nothing_was_loaded(
    runtime: Runtime,
) -> None:
    assert await within(runtime.unload()) is False
    assert runtime.state == "empty"


async def test_an_acquire_during_an_unload_gets_a_live_backend(
    node: Node, runtime: Runtime
) -> None:
    alpha = node.model("alpha")
    await within(runtime.load(alpha))
    unload = asyncio.ensure_future(runtime.unload())
    await wait_for(lambda: runtime.process is None, "unload starts stopping the backend")
    launch = await within(runtime.acquire(alpha))
    await within(unload)
    assert (runtime.state, runtime.current) == ("ready", alpha)
    assert await answers(launch)


async def test_close_stops_the_backend_and_fails_every_waiter(node: Node, runtime: Runtime) -> None:
    alpha, beta = node.model("alpha"), node.model("beta")
    await within(runtime.acquire(alpha))
    process = runtime.process
    waiter = asyncio.ensure_future(runtime.acquire(beta))
    await wait_for(lambda: runtime.waiting() == 1, "the beta request queues")

    await within(runtime.close())
    with pytest.raises(BackendError, match="shutting down"):
        await within(waiter)
    assert runtime.state == "stopped" and runtime.process is None
    assert process is not None and process.returncode is not None
    with pytest.raises(BackendError, match="shutting down"):
        await runtime.acquire(alpha)
    assert node.loads() == [("alpha", True)]


async def test_close_during_a_load_stops_the_starting_backend(node: Node, runtime: Runtime) -> None:
    slow = node.model("slow", {"load_ms": 30_000})
    waiter = asyncio.ensure_future(runtime.acquire(slow))
    await wait_for(lambda: runtime.process is not None, "the backend process starts")
    process = runtime.process

    await within(runtime.close())
    with pytest.raises(BackendError, match="shutting down"):
        await within(waiter)
    assert process is not None and process.returncode is not None
    assert runtime.state == "stopped"


# -- upstream ---------------------------------------------------------------------------


@pytest.fixture
async def upstream(node: Node) -> AsyncIterator[str]:
    """A sim started by the test itself, standing for a server the router does not own."""
    weights = node.weights / "remote.sim.json"
    weights.write_text(json.dumps({"load_ms": 0, "base_ms": 1}))
    port = free_port("127.0.0.1")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy.sim",
        "-m",
        str(weights),
        "--port",
        str(port),
        "-a",
        "remote",
        cwd=str(REPO_DIR),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    probe = Launch(None, url, "models")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONDITION_TIMEOUT_SECS
        while not await answers(probe):
            assert process.returncode is None, "the upstream sim exited"
            assert loop.time() < deadline, "the upstream sim did not come up"
            await asyncio.sleep(POLL_SECS)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()
        await close_session()


async def test_an_upstream_config_loads_nothing_and_records_no_load(
    node: Node, upstream: str
) -> None:
    remote = node.model("remote-cfg", backend_mode="upstream", upstream_url=upstream + "/")
    manager = RuntimeManager(
        config=node.config, log_dir=node.root / "logs", on_load=node.events.append
    )
    try:
        rt = manager.runtime_for(remote, "text")
        assert rt is manager.runtime_for(remote, "image")
        assert rt not in manager.runtimes.values()
        first, second = await within(asyncio.gather(rt.acquire(remote), rt.acquire(remote)))
        assert first.argv is None and first.base_url == upstream
        assert second is first
        assert await served_model(first) == "remote"
        assert (rt.state, rt.active, rt.process) == ("ready", 2, None)
        assert rt.status()["family"] == "upstream"
        assert manager.is_loaded(remote) and manager.active_requests() == 2
        # The node's own text runtime is untouched by an upstream model.
        assert manager.runtimes["text"].state == "empty"
        assert node.events == []
    finally:
        await manager.close()


async def test_the_lane_is_ready_only_while_a_loaded_backend_passes_its_probe(
    node: Node, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is checked is how the lane follows the probe, not how often it runs or how long
    # it waits: each wait for a hung backend's failed probe is an interval plus a timeout.
    monkeypatch.setattr(runtime_module, "LANE_PROBE_EVERY_SECS", 0.1)
    monkeypatch.setattr(runtime_module, "PROBE_TIMEOUT_SECS", 1.0)
    cfg = node.model("alpha")
    other = node.model("beta")
    # Nothing loaded: a request would queue behind the load, so the lane counts as ready.
    assert runtime.lane_ready(cfg)
    launch = await within(runtime.acquire(cfg))
    runtime.release()
    assert runtime.lane_ready(cfg) and runtime.status()["probe_ok"] is True
    assert runtime.process is not None
    os.kill(runtime.process.pid, signal.SIGSTOP)
    try:
        await wait_for(lambda: not runtime.probe_ok, "the hung backend fails its probe")
        assert not runtime.lane_ready(cfg) and not runtime.lane_ready(other)
    finally:
        os.kill(runtime.process.pid, signal.SIGCONT)
    await wait_for(lambda: runtime.probe_ok, "the backend passes its probe again")
    assert runtime.lane_ready(cfg)
    # A backend found gone is reloaded by the next request: that lane takes requests again.
    os.kill(runtime.process.pid, signal.SIGSTOP)
    await wait_for(lambda: not runtime.probe_ok, "the hung backend fails its probe")
    runtime.backend_lost(launch, "refused")
    assert runtime.state == "failed" and runtime.lane_ready(cfg)
    os.kill(runtime.process.pid, signal.SIGCONT)
