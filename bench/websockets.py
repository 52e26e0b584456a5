"""Idle WebSocket sessions against the node's connection limits, and the memory they leave.

Starts one real node (`runrouter`, simulated backend) under an open-file limit (`--fd-limit`,
which the node raises its soft limit to and derives `server.max_connections` from), opens
`--n` idle `/v1/realtime` sessions from a few loopback source addresses (127.0.0.2, .3, …),
and at the peak checks that `/healthz` from another address (127.0.0.9) still answers and that
the node protocol (`/router/v1/node/state` with the cluster token) still works. Sessions past
the cap are refused (503 `too_many_connections`). Then it closes them all and measures the
node's RSS once it settles; `--cycles` repeats open/close to show whether memory keeps growing.

Prints a table and, last, one JSON line. Exits 1 if `/healthz` or the node protocol failed at
the peak, or if the last cycle left RSS more than `--growth-mb` above the cycle before it.
Run: `.venv/bin/python bench/websockets.py [--n 2100 --fd-limit 4096]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/websockets.py`, this file's folder comes first on sys.path, where the
# sibling `queue.py` would shadow the standard library's `queue`; the repo root is wanted.
sys.path[0] = str(Path(__file__).resolve().parent.parent)
# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import asyncio
import json
import resource
import tempfile
import time
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidStatus

from tests.harness import (
    CLUSTER_TOKEN,
    ModelSpec,
    RouterNode,
    free_port,
    sim_weights,
    start_node,
)

PROBE_ADDRESS = "127.0.0.9"
OPEN_CONCURRENCY = 64
SETTLE_SECS = 20.0


def extra_env() -> dict[str, str]:
    """BENCH_NODE_PYTHONPATH lets a profiling `sitecustomize` into the node (tracemalloc)."""
    import os

    path = os.environ.get("BENCH_NODE_PYTHONPATH")
    return {"PYTHONPATH": path} if path else {}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def settled_rss(pid: int) -> float:
    """RSS once it stops falling (sessions close asynchronously), within SETTLE_SECS."""
    deadline = time.monotonic() + SETTLE_SECS
    last = rss_mb(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss_mb(pid)
        if abs(now - last) < 0.5:
            return now
        last = now
    return last


async def open_one(url: str, source: str) -> ClientConnection | str:
    try:
        ws = await connect(url, local_addr=(source, 0), open_timeout=60, ping_interval=None)
    except InvalidStatus as exc:
        return f"http {exc.response.status_code}"
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        return type(exc).__name__
    try:
        # The relay answers a session that could not start with an error event and a close.
        event = await asyncio.wait_for(ws.recv(), 0.05)
    except TimeoutError:
        return ws
    except Exception as exc:  # any close here is a refusal to count
        return type(exc).__name__
    await ws.close()
    try:
        return "relay: " + str(json.loads(event)["error"]["code"] or "error")
    except (ValueError, KeyError, TypeError):
        return "relay: ?"


async def open_sessions(url: str, n: int, sources: list[str]) -> tuple[list[Any], dict[str, int]]:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(i: int) -> ClientConnection | str:
        async with gate:
            return await open_one(url, sources[i % len(sources)])

    results = await asyncio.gather(*(one(i) for i in range(n)))
    opened = [r for r in results if not isinstance(r, str)]
    refused: dict[str, int] = {}
    for r in results:
        if isinstance(r, str):
            refused[r] = refused.get(r, 0) + 1
    return opened, refused


async def probes(node: RouterNode) -> dict[str, Any]:
    transport = httpx.AsyncHTTPTransport(local_address=PROBE_ADDRESS)
    async with httpx.AsyncClient(base_url=node.base_url, transport=transport, timeout=10) as c:
        t0 = time.perf_counter()
        health = await c.get("/healthz")
        health_ms = (time.perf_counter() - t0) * 1000
        state = await c.get(
            "/router/v1/node/state", headers={"Authorization": f"Bearer {CLUSTER_TOKEN}"}
        )
        models = await c.get("/v1/models")
    return {
        "healthz": health.status_code,
        "healthz_ms": round(health_ms, 1),
        "node_state": state.status_code,
        "inference_at_peak": models.status_code,
    }


async def cycle(node: RouterNode, n: int, sources: list[str]) -> dict[str, Any]:
    url = node.base_url.replace("http://", "ws://") + "/v1/realtime?model=talk"
    opened, refused = await open_sessions(url, n, sources)
    peak = rss_mb(node.proc.pid)
    checks = await probes(node)
    await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)
    after = await asyncio.to_thread(settled_rss, node.proc.pid)
    return {
        "opened": len(opened),
        "refused": refused,
        "rss_peak_mb": round(peak, 1),
        "rss_after_mb": round(after, 1),
        **checks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3072, help="sessions opened per cycle")
    parser.add_argument("--sources", type=int, default=2, help="source addresses")
    parser.add_argument("--fd-limit", type=int, default=8192, help="the node's open-file limit")
    # Three: the second cycle may still raise the process's high-water mark (allocator arenas
    # the first one's closed sessions left part-used); a leak shows as growth after that too.
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--growth-mb", type=float, default=16.0)
    args = parser.parse_args()

    # The node inherits this hard limit and raises its soft limit to it.
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.fd_limit, args.fd_limit))
    sources = [f"127.0.0.{2 + i}" for i in range(args.sources)]
    root = Path(tempfile.mkdtemp(prefix="bench-websockets-"))
    weights = sim_weights(base_ms=0)
    talk = ModelSpec("talk", {"contextsize": 4096}, {"model_param": weights, "ttsmodel": weights})
    port = free_port()
    node = start_node(
        root,
        [talk],
        server={"max_connections_per_client": 0},
        port=port,
        cluster={
            "role": "master",
            "token": CLUSTER_TOKEN,
            "public_url": f"http://127.0.0.1:{port}",
        },
        extra_env=extra_env(),
    )
    rows: list[dict[str, Any]] = []
    try:
        base = settled_rss(node.proc.pid)
        for _ in range(args.cycles):
            rows.append(asyncio.run(cycle(node, args.n, sources)))
        cap = [ln for ln in node.lines if "connection cap" in ln]
        refusal_lines = sum("refused:" in ln for ln in node.lines)
    finally:
        node.cleanup()

    print(f"node open-file limit {args.fd_limit}; {cap[0].split('] ')[-1] if cap else ''}")
    print(f"RSS before any session: {base:.1f} MB")
    print(
        f"{'cycle':>5} {'opened':>7} {'refused':>22} {'peak MB':>8} {'after MB':>9} "
        f"{'healthz':>8} {'ms':>6} {'node':>5}"
    )
    for i, r in enumerate(rows, 1):
        refused = ",".join(f"{k}:{v}" for k, v in r["refused"].items()) or "-"
        print(
            f"{i:>5} {r['opened']:>7} {refused:>22} {r['rss_peak_mb']:>8} "
            f"{r['rss_after_mb']:>9} {r['healthz']:>8} {r['healthz_ms']:>6} "
            f"{r['node_state']:>5}"
        )
    growth = rows[-1]["rss_after_mb"] - rows[0]["rss_after_mb"]
    # The allocator keeps what the peak took; bounded means a further cycle adds nothing.
    last = rows[-1]["rss_after_mb"] - rows[-2]["rss_after_mb"] if len(rows) > 1 else 0.0
    ok = all(r["healthz"] == 200 and r["node_state"] == 200 for r in rows)
    ok = ok and last <= args.growth_mb
    print(
        f"refusal log lines: {refusal_lines}; RSS after the last cycle vs the first "
        f"{growth:+.1f} MB, vs the one before {last:+.1f} MB"
    )
    summary = {
        "bench": "websockets",
        "n": args.n,
        "fd_limit": args.fd_limit,
        "sources": len(sources),
        "rss_before_mb": round(base, 1),
        "cycles": rows,
        "rss_growth_after_first_mb": round(growth, 1),
        "rss_growth_last_cycle_mb": round(last, 1),
        "refusal_log_lines": refusal_lines,
        "ok": ok,
    }
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
