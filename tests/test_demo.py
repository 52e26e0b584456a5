"""`./scripts/demo`'s cluster: it lends on its own traffic, and Ctrl-C stops every process."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import REPO, wait_for

pytestmark = pytest.mark.integration


def three_free_ports() -> int:
    """A port whose next two are free as well (the demo's master and slaves)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base > 65000:
            continue
        try:
            for offset in (1, 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError("no three consecutive free ports")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent's wait is missing.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


class Demo:
    """The demo's process, with every line it printed and the pids of the nodes it started."""

    def __init__(self, port: int, root: Path) -> None:
        self.port = port
        env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
        argv = [sys.executable, str(REPO / "demo" / "cluster_demo.py"), "--port", str(port)]
        self.proc = subprocess.Popen(
            [*argv, "--dir", str(root)],
            cwd=str(REPO),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # Its own group, so that killing it reaches nothing of the test runner's; and
            # SIGINT ignored, as in the background of a non-interactive shell: the demo must
            # handle Ctrl-C itself rather than rely on inheriting Python's handler.
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        self.lines: list[str] = []
        self.nodes: dict[str, int] = {}
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            started = re.match(r"demo: started (\S+) pid=(\d+)", line)
            if started:
                self.nodes[started[1]] = int(started[2])

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def interrupt(self, timeout: float = 90.0) -> int:
        """Ctrl-C, then the demo's exit status once it has stopped every node."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout)
        self._pump.join(10)
        return code

    def teardown(self) -> None:
        """Nothing the demo started outlives the test, whatever state the test left it in."""
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.interrupt(60)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        # Each node leads its own process group, with its backends (which also die with it).
        for pid in self.nodes.values():
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: not any(alive(p) for p in self.nodes.values()), timeout=30)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(three_free_ports(), tmp_path / "demo")
    try:
        yield running
    finally:
        running.teardown()


def test_ctrl_c_while_the_nodes_start_stops_the_ones_already_started(demo: Demo) -> None:
    wait_for(lambda: "master" in demo.nodes, timeout=60, interval=0.05)

    assert demo.interrupt() == 0, demo.output

    assert "demo: stopped" in demo.output
    assert not alive(demo.nodes["master"]), demo.output


def test_the_demo_lends_within_its_first_minutes_and_ctrl_c_stops_everything(
    demo: Demo,
) -> None:
    master = f"http://127.0.0.1:{demo.port}"

    def lent() -> bool:
        if demo.proc.poll() is not None:
            raise AssertionError(demo.output or "demo exited")
        try:
            doc = httpx.get(
                master + "/router/v1/site/offload/decisions/folded",
                params={"outcome": "lent"},
            ).json()
        except (httpx.HTTPError, ValueError):
            return False
        return bool(doc.get("total_rows"))

    wait_for(lent, timeout=180, interval=0.2)
    nodes = httpx.get(master + "/router/v1/site/nodes/state").json()["cluster"]["nodes"]
    assert sorted(n["node_id"] for n in nodes) == ["gpu-a", "gpu-b"]
    links = httpx.get(master + "/router/v1/site/text-routing-groups").json()["links"]
    assert [(ln["owner_model_id"], ln["helper_model_id"]) for ln in links] == [
        ("chat", "chat-fast")
    ]
    # The node processes and their backends, by the pids their ready lines and the
    # state API name.
    states = [httpx.get(master + "/router/v1/site/nodes/state").json()] + [
        httpx.get(master + "/router/v1/site/nodes/state", params={"node_id": n}).json()
        for n in ("gpu-a", "gpu-b")
    ]
    backends = [b["pid"] for s in states for b in s["backends"] if b.get("pid")]
    assert backends

    assert demo.interrupt() == 0, demo.output

    out = demo.output
    assert "demo: stopped" in out
    pids_line = next(line for line in out.splitlines() if line.startswith("demo: node pids:"))
    routers = [int(p) for p in re.findall(r"=(\d+)", pids_line)]
    assert sorted(routers) == sorted(demo.nodes.values())
    # Every router and backend has exited (the routers stop their backends on SIGTERM).
    wait_for(lambda: not any(alive(p) for p in backends), timeout=30)
    assert not any(alive(p) for p in routers), out
