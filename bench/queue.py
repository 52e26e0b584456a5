"""Lending part 1 benchmarks: router queue, memory per held request, cost fits, decision-log lag.

1. Queue operations per second: 100k entries, enqueue → admit → complete (bench/queue_ops.py).
2. Memory per held request beyond its body, two ways: the queue entry alone (tracemalloc), and
   a real router process (a master whose linked model is slow, depth 1) holding N concurrent
   requests: its RSS growth divided by N, which counts everything a held request costs there
   (connection, ASGI messages, consumer task, queue entry).
3. Cost-fit time for 10k samples (bench/fits.py).
4. The event loop's worst lag while the decision log flushes 10k rows to SQLite.

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/queue.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/queue.py`, this file's folder comes first on sys.path and its name would
# shadow the standard library's `queue` (which asyncio and concurrent.futures import).
sys.path[0] = str(Path(__file__).resolve().parent.parent)
# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent

from bench.overhead import free_port, router_env, start, stop, wait_http, write_two_node_configs

TOKEN = "bench-queue-token-0123456789"


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with session.post(url, json=body) as resp:
        await resp.read()
        return resp.status


async def held_memory(n: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bench-queue-"))
    mport, sport = free_port(), free_port()
    murl, surl = f"http://127.0.0.1:{mport}", f"http://127.0.0.1:{sport}"
    slow = root / "slow.sim.json"
    # Each job takes 30 s, so every request but the admitted one stays held for the run.
    slow.write_text(json.dumps({"load_ms": 0, "base_ms": 30_000}))
    for name in ("master", "slave"):
        (root / name / "kcpps").mkdir(parents=True)
        (root / name / "kcpps" / f"{name}-m.kcpps").write_text(
            json.dumps(
                {
                    "backend_mode": "sim",
                    "model_param": str(slow),
                    "contextsize": 4096,
                    "parallel": 1,
                }
            )
        )
    write_two_node_configs(
        root,
        master_port=mport,
        slave_port=sport,
        token=TOKEN,
        master_mode="sim",
        master_extra={"scheduling_backend_depth": 1},
    )
    env = router_env()
    procs = [
        start(
            [
                sys.executable,
                "manage.py",
                "runrouter",
                "--config",
                str(root / name / "config.yaml"),
            ],
            root / f"{name}.log",
            env,
        )
        for name in ("master", "slave")
    ]
    try:
        await wait_http(f"{murl}/ping")
        await wait_http(f"{surl}/ping")
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            deadline = time.monotonic() + 30
            while True:
                async with session.get(f"{murl}/v1/models") as resp:
                    # 503 until the master's first round of health polls is over.
                    doc = await resp.json() if resp.status == 200 else {"data": []}
                    ids = [m["id"] for m in doc["data"]]
                if "slave-m" in ids or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            link = {
                "anchor": {"node_id": "master", "model_id": "master-m"},
                "lends_to": [{"node_id": "slave", "model_id": "slave-m"}],
                "acknowledge_different_weights": True,
            }
            async with session.post(f"{murl}/router/v1/site/text-routing-groups", json=link) as r:
                assert r.status == 200, await r.text()
            body = {
                "model": "master-m",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1,
            }
            pid = procs[0].pid
            # Warm the process's allocator and pools with one round first, then measure.
            warm = [
                asyncio.ensure_future(_post(session, f"{murl}/v1/chat/completions", body))
                for _ in range(50)
            ]
            await _wait_held(session, murl, 49)
            before = rss_bytes(pid)
            tasks = [
                asyncio.ensure_future(_post(session, f"{murl}/v1/chat/completions", body))
                for _ in range(n)
            ]
            await _wait_held(session, murl, 49 + n)
            after = rss_bytes(pid)
            for task in [*warm, *tasks]:
                task.cancel()
            await asyncio.gather(*warm, *tasks, return_exceptions=True)
    finally:
        for proc in procs:
            stop(proc)
    return {"held": n, "rss_delta_bytes": after - before, "bytes_per_held": (after - before) / n}


async def _wait_held(session: aiohttp.ClientSession, murl: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        async with session.get(f"{murl}/router/v1/site/offload/summary") as resp:
            nodes = (await resp.json())["nodes"]
        held = next(n for n in nodes if n["node_id"] == "master")["held_requests"]
        if len(held) >= count:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"never saw {count} held requests")


async def wait_log(path: Path, mark: str, *, limit_secs: float) -> None:
    deadline = time.monotonic() + limit_secs
    while mark not in path.read_text():  # noqa: ASYNC240 (another process writes it)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{mark!r} never appeared in {path}")
        await asyncio.sleep(0.05)


async def server_baseline(n: int) -> float:
    """RSS growth per held connection of the node's HTTP server (uvicorn's httptools protocol
    on uvloop) serving an app that does nothing at all."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="bench-server-")) / "server.log"
    proc = start(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--no-access-log",
            "bench.hang_app:application",
        ],
        log,
    )
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"model": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    try:
        await wait_log(log, "Uvicorn running", limit_secs=30)
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            warm = [asyncio.ensure_future(_post(session, url, body)) for _ in range(50)]
            await asyncio.sleep(1.0)
            before = rss_bytes(proc.pid)
            tasks = [asyncio.ensure_future(_post(session, url, body)) for _ in range(n)]
            await asyncio.sleep(3.0)  # nothing to wait on: the app never answers
            after = rss_bytes(proc.pid)
            for task in [*warm, *tasks]:
                task.cancel()
            await asyncio.gather(*warm, *tasks, return_exceptions=True)
    finally:
        stop(proc)
    return (after - before) / n


def decision_log_lag(rows: int) -> dict[str, float]:
    """Worst event-loop lag while the decision log flushes `rows` rows (SQLite, WAL)."""
    root = Path(tempfile.mkdtemp(prefix="bench-declog-"))
    (root / "kcpps").mkdir()
    (root / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "cluster": {"store_dir": str(root / "store")},
                "models": {"config_dir": str(root / "kcpps")},
            }
        )
    )
    os.environ["ROUTER_CONFIG"] = str(root / "config.yaml")
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerproject.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from routerproject.gctune import tune_gc

    tune_gc()  # the router process runs with these interpreter settings
    from lending.decisions import DecisionLog

    log = DecisionLog(
        node_id="bench", router_version="bench", clock_ms=lambda: int(time.time() * 1000)
    )
    for i in range(rows):
        log.record(
            kind="plan",
            trigger="enqueued",
            lane="text",
            owner_node_id="a",
            owner_model_id="m",
            helper_node_id="b",
            helper_model_id="h",
            outcome="skipped",
            reason="cost_rejected",
            pending_count=i % 40,
            backlog_count=i % 42,
            keep_ms=1234.5,
            switch_ms=2000.0,
            service_ms=250.0,
            owner_job_ms=1000.0,
            service_source="helper",
            helper_idle_ms=5000,
            slots=0,
        )

    async def run() -> tuple[float, float]:
        worst = 0.0
        stop_flag = False

        async def monitor() -> None:
            nonlocal worst
            while not stop_flag:
                t0 = time.perf_counter()
                await asyncio.sleep(0.001)
                worst = max(worst, (time.perf_counter() - t0) * 1000.0 - 1.0)

        task = asyncio.ensure_future(monitor())
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        written = await log.flush()
        flush_ms = (time.perf_counter() - t0) * 1000.0
        stop_flag = True
        await task
        assert written == rows, written
        return worst, flush_ms

    worst, flush_ms = asyncio.run(run())
    return {"rows": rows, "max_loop_lag_ms": worst, "flush_ms": flush_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--held", type=int, default=500)
    args = parser.parse_args()
    from bench import fits, queue_ops

    enqueue_secs, complete_secs = queue_ops.best_round(100_000, None)
    entry_bytes = queue_ops.bytes_per_entry(100_000)
    import numpy as np

    from analytics.fitting import fit_durations

    rng = np.random.default_rng(7)
    prompt = rng.integers(10, 4000, 10_000).astype(float)
    output = rng.integers(1, 800, 10_000).astype(float)
    dur = 40 + 0.5 * prompt + 20 * output + rng.normal(0, 5, 10_000)
    work = np.column_stack([prompt, output])
    fit_ms = fits.median_ms(lambda: fit_durations(work, dur, min_samples=20), 20)
    memory = asyncio.run(held_memory(args.held))
    baseline = asyncio.run(server_baseline(args.held))
    own = memory["bytes_per_held"] - baseline
    lag = decision_log_lag(10_000)
    ops_per_sec = 200_000 / (enqueue_secs + complete_secs)
    result: dict[str, Any] = {
        "bench": "queue",
        "queue_ops_per_sec": round(ops_per_sec),
        "queue_entry_bytes": round(entry_bytes, 1),
        "router_bytes_per_held_request": round(memory["bytes_per_held"]),
        "server_connection_baseline_bytes": round(baseline),
        "router_own_bytes_per_held_request": round(own),
        "held_requests": memory["held"],
        "fit_10k_ms": round(fit_ms, 3),
        "decision_flush_10k_ms": round(lag["flush_ms"], 1),
        "max_loop_lag_ms": round(lag["max_loop_lag_ms"], 3),
        "targets": {"bytes_per_held": 8192, "fit_ms": 20, "loop_lag_ms": 5},
    }
    result["pass"] = own <= 8192 and fit_ms <= 20 and lag["max_loop_lag_ms"] <= 5
    print(f"{'measure':<44}{'value':>14}{'target':>10}")
    print(
        f"{'queue ops/s (enqueue, admit, complete)':<44}{result['queue_ops_per_sec']:>14}{'':>10}"
    )
    print(f"{'queue entry bytes (tracemalloc)':<44}{result['queue_entry_bytes']:>14}{'':>10}")
    print(
        f"{'router process bytes per held request (RSS)':<44}"
        f"{result['router_bytes_per_held_request']:>14}{'':>10}"
    )
    print(
        f"{'  of which server connection (baseline app)':<44}"
        f"{result['server_connection_baseline_bytes']:>14}{'':>10}"
    )
    print(
        f"{'  the router own cost per held request':<44}"
        f"{result['router_own_bytes_per_held_request']:>14}{8192:>10}"
    )
    print(f"{'fit 10k samples (ms)':<44}{result['fit_10k_ms']:>14}{20:>10}")
    print(f"{'decision log flush 10k rows (ms)':<44}{result['decision_flush_10k_ms']:>14}{'':>10}")
    print(f"{'worst event-loop lag during flush (ms)':<44}{result['max_loop_lag_ms']:>14}{5:>10}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
