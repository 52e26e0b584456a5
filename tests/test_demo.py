"""`./scripts/demo`'s cluster: it lends on its own traffic, and Ctrl-C stops every process."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
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


def test_the_demo_lends_within_its_first_minutes_and_ctrl_c_stops_everything(
    tmp_path: Path,
) -> None:
    port = three_free_ports()
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
    demo = subprocess.Popen(
        [sys.executable, str(REPO / "demo" / "cluster_demo.py"), "--port", str(port)],
        cwd=str(REPO),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    master = f"http://127.0.0.1:{port}"
    try:

        def lent() -> bool:
            if demo.poll() is not None:
                raise AssertionError(demo.stdout.read() if demo.stdout else "demo exited")
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
    finally:
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=90)
    assert demo.returncode == 0, out
    assert "demo: stopped" in out
    pids_line = next(line for line in out.splitlines() if line.startswith("demo: node pids:"))
    routers = [int(p) for p in re.findall(r"=(\d+)", pids_line)]
    assert len(routers) == 3
    # Every router and backend has exited (the routers stop their backends on SIGTERM).
    wait_for(lambda: not any(alive(p) for p in backends), timeout=30)
    assert not any(alive(p) for p in routers), out
