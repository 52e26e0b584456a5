"""A real master (`runrouter`, its own process) with N emulated slaves (bench/slaves.py) for
tests that need a big cluster: the WebUI at 300 nodes, say. The emulator runs on an event loop
of its own thread in the test process; the master is set up as bench/scale.py sets it up.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from bench.overhead import free_port, router_env, start
from bench.scale import TOKEN, write_master
from bench.slaves import SlaveFarm, free_ports

T = TypeVar("T")
START_LIMIT_SECS = 300.0
FIRST_PORT = 23000


class FarmThread:
    """The emulator on an event loop of its own thread."""

    def __init__(self, farm: SlaveFarm) -> None:
        self.farm = farm
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def close(self) -> None:
        self.run(self.farm.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class EmulatedCluster:
    master_url: str
    farm: FarmThread

    def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = httpx.get(
            self.master_url + "/router/v1/site/nodes/state", timeout=60
        ).json()
        return doc


def poll(check: Callable[[], bool], limit_secs: float, what: str) -> None:
    """Wait for `check()` to hold, polling; fail naming `what` after `limit_secs`."""
    deadline = time.monotonic() + limit_secs
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {limit_secs:g} s")
        time.sleep(0.1)


def _healthy(cluster: EmulatedCluster, count: int) -> bool:
    try:
        nodes = cluster.state()["cluster"]["nodes"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return sum(1 for n in nodes if n["healthy"]) >= count


@contextmanager
def emulated_cluster(root: Path, nodes: int) -> Iterator[EmulatedCluster]:
    """A running master whose `cluster.slave_urls` name `nodes` emulated slaves, all healthy."""
    farm = SlaveFarm(master_url="", token=TOKEN, ports=free_ports(nodes, FIRST_PORT))
    runner = FarmThread(farm)
    port = free_port()
    master = f"http://127.0.0.1:{port}"
    farm.master_url = master
    config = write_master(root / "master", port, farm.urls, 8)
    proc: subprocess.Popen[bytes] | None = None
    try:
        runner.run(farm.start())
        argv = [sys.executable, "manage.py", "runrouter", "--config", str(config), "--no-migrate"]
        proc = start([*argv, "--no-workers"], root / "master.log", router_env())
        cluster = EmulatedCluster(master, runner)
        poll(lambda: _healthy(cluster, nodes), START_LIMIT_SECS, f"{nodes} slaves healthy")
        yield cluster
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        runner.close()
