"""A three-node demo cluster that lends: `./scripts/demo` runs this.

A master and two slaves on loopback with simulated models. `chat` on gpu-a is slow and gets
bursts of traffic; it is linked to lend to `chat-fast` on gpu-b (different weights,
acknowledged), so within a minute the pages show held and lent requests, the decision log and
the timeline. gpu-b also gets a little traffic of its own, so borrowed work yields to it now and
then. Ctrl-C (or SIGTERM) stops the traffic and every node, and removes the demo's directory
unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
TOKEN = "demo-cluster-token-not-for-production-use"
READY = "router ready:"

# Costs of each simulated model (see "The simulated backend" in README.md).
MODELS: dict[str, dict[str, dict[str, Any]]] = {
    "master": {"notes": {"load_ms": 300, "base_ms": 20, "output_ms_per_token": 10}},
    "gpu-a": {"chat": {"load_ms": 1500, "base_ms": 40, "output_ms_per_token": 45}},
    "gpu-b": {
        "chat-fast": {"load_ms": 800, "base_ms": 20, "output_ms_per_token": 8},
        "coder": {"load_ms": 800, "base_ms": 20, "output_ms_per_token": 12},
    },
}
# Short enough that the first probes and fits come within the first minute.
SETTINGS = {
    "offload_probe_idle": "1s",
    "scheduling_min_samples": 4,
    "scheduling_refresh_interval": "5s",
}


def write_node(root: Path, name: str, port: int, ports: dict[str, int]) -> Path:
    node_dir = root / name
    kcpps, weights = node_dir / "kcpps", node_dir / "weights"
    kcpps.mkdir(parents=True)
    weights.mkdir()
    for model, costs in MODELS[name].items():
        weight_file = weights / f"{model}.sim.json"
        weight_file.write_text(json.dumps({"prompt_ms_per_token": 0.2, **costs}))
        config = {"backend_mode": "sim", "model_param": str(weight_file), "contextsize": 8192}
        (kcpps / f"{model}.kcpps").write_text(json.dumps({**config, "parallel": 1}))
    cluster: dict[str, Any] = {
        "node_id": name,
        "token": TOKEN,
        "public_url": f"http://127.0.0.1:{port}",
        "store_dir": str(node_dir / "store"),
        "health_interval": "2s",
        "sync_interval": "2s",
    }
    if name == "master":
        cluster.update(
            role="master",
            slave_urls=[f"http://127.0.0.1:{p}" for n, p in ports.items() if n != "master"],
        )
    else:
        cluster.update(role="slave", master_url=f"http://127.0.0.1:{ports['master']}")
    doc = {
        "server": {"bind": f"127.0.0.1:{port}"},
        "cluster": cluster,
        "models": {"config_dir": str(kcpps)},
        "backend": {"mode": "sim", "load_timeout": "60s"},
    }
    path = node_dir / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "runrouter", "--config", str(config)],
            cwd=str(REPO),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class Stopped(Exception):
    """SIGINT or SIGTERM arrived while the demo was still starting."""


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM ask the demo to stop; every wait of the demo watches this.

    Installed explicitly rather than left to Python's KeyboardInterrupt: a process started in
    the background of a non-interactive shell inherits SIGINT ignored, and Python then installs
    no handler of its own, so Ctrl-C sent to such a demo would leave its nodes running. The
    handler raises nothing either: an exception between starting a node and recording it would
    leave that node behind.
    """

    def __init__(self) -> None:
        self.requested = False
        # A pipe, not a threading.Event: a handler that took the Event's lock while the
        # interrupted main thread held it would wait forever.
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.requested = True
        try:
            os.write(self._wake_write, b"x")
        except BlockingIOError:
            pass  # the pipe is full of earlier wake-ups: the waiter wakes all the same

    def pause(self, secs: float) -> None:
        """Wait `secs` between two looks at a condition, or raise Stopped when asked to stop."""
        if not self.requested:
            # A signal that lands before the select has already written to the pipe.
            select.select([self._wake_read], [], [], secs)
        if self.requested:
            raise Stopped


def wait_ready(
    procs: dict[str, subprocess.Popen[bytes]], logs: dict[str, Path], stop: StopSignals
) -> None:
    deadline = time.monotonic() + 120
    pending = set(procs)
    while pending:
        for name in sorted(pending):
            text = logs[name].read_text(errors="replace")
            if READY in text:
                pending.discard(name)
            elif procs[name].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"demo: node {name} did not start:\n{text[-3000:]}")
        if pending:
            stop.pause(0.2)


def setup_cluster(master: str, stop: StopSignals) -> None:
    with httpx.Client(base_url=master, timeout=30) as client:
        # The master sees both slaves before it links their models.
        deadline = time.monotonic() + 60
        while True:
            nodes = client.get("/router/v1/site/nodes/state").json()["cluster"]["nodes"]
            if len(nodes) == 2 and all(n["healthy"] for n in nodes):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"demo: the slaves did not join: {nodes}")
            stop.pause(0.3)
        settings = client.post("/router/v1/site/offload/settings", json={"values": SETTINGS})
        settings.raise_for_status()
        link = {
            "anchor": {"node_id": "gpu-a", "model_id": "chat"},
            "lends_to": [
                {
                    "node_id": "gpu-b",
                    "model_id": "chat-fast",
                    "load_if_unloaded": True,
                    "restore_after_borrow": True,
                }
            ],
            "acknowledge_different_weights": True,
        }
        client.post("/router/v1/site/text-routing-groups", json=link).raise_for_status()
        client.post("/router/v1/load", json={"model": "chat"}).raise_for_status()


def traffic(master: str, stop: threading.Event, seed: int) -> None:
    """Bursts for the slow owner, now and then a request of gpu-b's own."""
    rng = random.Random(seed)

    def one(model: str, tokens: int) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Tell me about the cluster."}],
            "max_tokens": tokens,
        }
        try:
            with httpx.Client(base_url=master, timeout=120) as client:
                client.post("/v1/chat/completions", json=body)
        except httpx.HTTPError:
            pass  # a node being stopped by Ctrl-C

    while not stop.is_set():
        burst = [
            threading.Thread(target=one, args=("chat", rng.randint(20, 80)), daemon=True)
            for _ in range(rng.randint(3, 7))
        ]
        if rng.random() < 0.3:
            model = rng.choice(["chat-fast", "coder"])
            burst.append(threading.Thread(target=one, args=(model, 20), daemon=True))
        for t in burst:
            t.start()
        stop.wait(rng.uniform(2.0, 5.0))


def stop_nodes(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every node (each stops its backends), then wait for all of them; a node still
    running after 30 s is killed with its whole process group."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for name, proc in procs.items():
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"demo: node {name} ignored SIGTERM; killing it", file=sys.stderr, flush=True)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it exited between the wait and the kill
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8080, help="The master's port (slaves +1, +2).")
    parser.add_argument("--dir", type=Path, help="Where the nodes keep their files.")
    parser.add_argument("--keep", action="store_true", help="Keep that directory on exit.")
    parser.add_argument("--seed", type=int, default=1, help="Seed of the traffic pattern.")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="router-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    ports = {"master": args.port, "gpu-a": args.port + 1, "gpu-b": args.port + 2}
    configs = {name: write_node(root, name, port, ports) for name, port in ports.items()}
    logs = {name: root / f"{name}.log" for name in ports}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stop = StopSignals()
    stop.install()
    traffic_stop = threading.Event()

    def launch(name: str) -> None:
        procs[name] = start(configs[name], logs[name])
        # Each pid as soon as it exists, so that whoever stops the demo knows every node.
        print(f"demo: started {name} pid={procs[name].pid}", flush=True)

    try:
        launch("master")
        wait_ready({"master": procs["master"]}, logs, stop)
        for name in ("gpu-a", "gpu-b"):
            launch(name)
        wait_ready(procs, logs, stop)
        master = f"http://127.0.0.1:{ports['master']}"
        setup_cluster(master, stop)
        threading.Thread(
            target=traffic, args=(master, traffic_stop, args.seed), daemon=True
        ).start()
        print(
            f"demo: master {master} with slaves gpu-a (:{ports['gpu-a']}) and gpu-b "
            f"(:{ports['gpu-b']}); gpu-a/chat lends to gpu-b/chat-fast, traffic is running.\n"
            f"demo: open {master}/ (Nodes page) and {master}/ui/lending; logs in {root}\n"
            "demo: Ctrl-C stops everything.\n"
            "demo: node pids: " + " ".join(f"{n}={p.pid}" for n, p in procs.items()),
            flush=True,
        )
        # Until a signal asks it to stop, or a node exits on its own.
        while all(p.poll() is None for p in procs.values()):
            stop.pause(0.5)
        print("demo: a node exited; stopping the rest", file=sys.stderr, flush=True)
        return 1
    except Stopped:
        return 0
    finally:
        traffic_stop.set()
        stop_nodes(procs)
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
        print("demo: stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
