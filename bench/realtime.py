"""Realtime relay: latency the router adds to each WebSocket frame.

Starts a zero-cost simulated backend (whose `/v1/realtime` echoes every frame) and a real router
node (`runrouter`) whose one model points at it, opens one session straight to the backend and
one through the router, and sends N frames on each, interleaved one by one so that both see the
same machine state. A frame's time is its round trip (sent to its echo received): the relay's
added latency per frame is the routed round trip less the direct one, both directions of the
relay included. Text and binary frames alternate.

Targets: added p50 ≤ 1 ms, added p99 ≤ 3 ms. Prints a table and, last, one JSON line; exits 1
on a miss. Run: `.venv/bin/python bench/realtime.py [--n 2000]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/realtime.py`, this file's folder comes first on sys.path, where the
# sibling `queue.py` would shadow the standard library's `queue`; the repo root is wanted.
sys.path[0] = str(Path(__file__).resolve().parent.parent)
# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from typing import Any

import yaml
from websockets.asyncio.client import ClientConnection, connect

from bench.overhead import free_port, percentile, router_env, start, stop, wait_http

TARGET_P50_MS = 1.0
TARGET_P99_MS = 3.0
WARMUP_FRAMES = 200
BINARY_FRAME = bytes(range(256)) * 2
TEXT_FRAME = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA" * 64})


async def round_trip(ws: ClientConnection, frame: str | bytes) -> float:
    t0 = time.perf_counter()
    await ws.send(frame)
    await ws.recv()
    return (time.perf_counter() - t0) * 1000.0


async def measure(direct_url: str, routed_url: str, n: int) -> tuple[list[float], list[float]]:
    direct: list[float] = []
    routed: list[float] = []
    async with connect(direct_url) as d_ws, connect(routed_url, open_timeout=60) as r_ws:
        for i in range(WARMUP_FRAMES):
            frame = TEXT_FRAME if i % 2 else BINARY_FRAME
            await round_trip(d_ws, frame)
            await round_trip(r_ws, frame)
        for i in range(n):
            frame = TEXT_FRAME if (i // 2) % 2 else BINARY_FRAME
            # Alternate which goes first so neither side systematically gets the warmer cache.
            if i % 2:
                direct.append(await round_trip(d_ws, frame))
                routed.append(await round_trip(r_ws, frame))
            else:
                routed.append(await round_trip(r_ws, frame))
                direct.append(await round_trip(d_ws, frame))
    return direct, routed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="frames each way")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-realtime-"))
    weights = root / "zero.sim.json"
    weights.write_text(json.dumps({"load_ms": 0, "base_ms": 0, "output_ms_per_token": 0}))
    up_port, router_port = free_port(), free_port()
    kcpps = root / "kcpps"
    kcpps.mkdir()
    upstream_url = f"http://127.0.0.1:{up_port}"
    (kcpps / "bench.kcpps").write_text(
        json.dumps({"backend_mode": "upstream", "upstream_url": upstream_url, "tts": True})
    )
    config = {
        "server": {"bind": f"127.0.0.1:{router_port}"},
        "cluster": {"store_dir": str(root / "store")},
        "models": {"config_dir": str(kcpps)},
        "backend": {"mode": "sim"},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    upstream = start(
        [sys.executable, "-m", "proxy.sim", "-m", str(weights), "--port", str(up_port)],
        root / "upstream.log",
    )
    router = start(
        [sys.executable, "manage.py", "runrouter", "--config", str(root / "config.yaml")],
        root / "router.log",
        router_env(),
    )
    direct_url = f"ws://127.0.0.1:{up_port}/v1/realtime?model=bench"
    routed_url = f"ws://127.0.0.1:{router_port}/v1/realtime?model=bench"
    try:
        asyncio.run(wait_http(f"{upstream_url}/health"))
        asyncio.run(wait_http(f"http://127.0.0.1:{router_port}/ping"))
        d, r = asyncio.run(measure(direct_url, routed_url, args.n))
    finally:
        stop(router)
        stop(upstream)

    added = [b - a for a, b in zip(d, r, strict=True)]
    result: dict[str, Any] = {
        "bench": "realtime",
        "frames_each_way": args.n,
        "direct_p50_ms": round(percentile(d, 50), 3),
        "direct_p99_ms": round(percentile(d, 99), 3),
        "router_p50_ms": round(percentile(r, 50), 3),
        "router_p99_ms": round(percentile(r, 99), 3),
        "added_p50_ms": round(percentile(r, 50) - percentile(d, 50), 3),
        "added_p99_ms": round(percentile(r, 99) - percentile(d, 99), 3),
        "added_paired_median_ms": round(statistics.median(added), 3),
        "targets": {"added_p50_ms": TARGET_P50_MS, "added_p99_ms": TARGET_P99_MS},
    }
    result["pass"] = (
        result["added_p50_ms"] <= TARGET_P50_MS and result["added_p99_ms"] <= TARGET_P99_MS
    )
    print(f"{'frame round trip (ms)':<24}{'direct':>10}{'router':>10}{'added':>10}")
    for q in ("p50", "p99"):
        print(
            f"{q:<24}{result[f'direct_{q}_ms']:>10}{result[f'router_{q}_ms']:>10}"
            f"{result[f'added_{q}_ms']:>10}"
        )
    print(f"{'paired median':<24}{'':>10}{'':>10}{result['added_paired_median_ms']:>10}")
    print(json.dumps(result))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
