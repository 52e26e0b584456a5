"""TLS cost: the latency HTTPS adds over plain HTTP on kept-alive connections.

Starts one zero-cost simulated backend and two router nodes in front of it (one model each, in
`upstream` mode): one plain, one serving HTTPS with a certificate from a CA made for the run.
Then N requests through each, interleaved one by one over one kept-alive connection each, so
both see the same machine state and the handshake is paid once (what a client or a node that
keeps its connections pays). Reports p50/p99 of each and the added p50 (target: at most 0.3 ms).

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/tls.py [--n 2000]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ is first on sys.path, and bench/queue.py would shadow the standard
# library's `queue`: swap that entry for the repository root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# ruff: noqa: E402  (imports below need the path fix above)

import argparse
import asyncio
import json
import ssl
import statistics
import tempfile
from typing import Any

import aiohttp
import trustme
import yaml

from bench.overhead import free_port, one, percentile, router_env, start, stop, wait_http

TARGET_ADDED_P50_MS = 0.3


def write_router(root: Path, name: str, port: int, up_port: int, tls: dict[str, str]) -> Path:
    kcpps = root / name / "kcpps"
    kcpps.mkdir(parents=True)
    (kcpps / "bench.kcpps").write_text(
        json.dumps({"backend_mode": "upstream", "upstream_url": f"http://127.0.0.1:{up_port}"})
    )
    config = {
        "server": {"bind": f"127.0.0.1:{port}", **tls},
        "cluster": {"store_dir": str(root / name / "store")},
        "models": {"config_dir": str(kcpps)},
        "backend": {"mode": "sim"},
    }
    path = root / name / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def measure(
    plain: str, secure: str, context: ssl.SSLContext, n: int
) -> tuple[list[float], list[float], int]:
    """Latencies over one kept-alive connection per side; and the TLS side's connection count
    (1 means every request after the first reused the handshake)."""
    p: list[float] = []
    s: list[float] = []
    plain_conn = aiohttp.TCPConnector(limit=1)
    tls_conn = aiohttp.TCPConnector(limit=1, ssl=context)
    async with (
        aiohttp.ClientSession(connector=plain_conn) as ps,
        aiohttp.ClientSession(connector=tls_conn) as ss,
    ):
        await wait_http(plain.replace("/v1/chat/completions", "/ping"), session=ps)
        await wait_http(secure.replace("/v1/chat/completions", "/ping"), session=ss)
        for _ in range(100):  # warm both paths
            await one(ps, plain)
            await one(ss, secure)
        for i in range(n):
            # Alternate which goes first so neither side systematically gets the warmer cache.
            if i % 2:
                p.append(await one(ps, plain))
                s.append(await one(ss, secure))
            else:
                s.append(await one(ss, secure))
                p.append(await one(ps, plain))
        opened = len(tls_conn._conns)  # a bench's look at the pool
    return p, s, opened


def report(args: Any, p: list[float], s: list[float]) -> dict[str, Any]:
    added = [b - a for a, b in zip(p, s, strict=True)]
    result: dict[str, Any] = {
        "bench": "tls",
        "requests_each_way": args.n,
        "plain_p50_ms": round(percentile(p, 50), 3),
        "plain_p99_ms": round(percentile(p, 99), 3),
        "tls_p50_ms": round(percentile(s, 50), 3),
        "tls_p99_ms": round(percentile(s, 99), 3),
        "added_p50_ms": round(percentile(s, 50) - percentile(p, 50), 3),
        "added_p99_ms": round(percentile(s, 99) - percentile(p, 99), 3),
        "added_paired_median_ms": round(statistics.median(added), 3),
        "targets": {"added_p50_ms": TARGET_ADDED_P50_MS},
    }
    result["pass"] = result["added_p50_ms"] <= TARGET_ADDED_P50_MS
    print(f"{'measure':<24}{'plain':>10}{'https':>10}{'added':>10}")
    for label, key in (("p50 latency (ms)", "p50"), ("p99 latency (ms)", "p99")):
        print(
            f"{label:<24}{result[f'plain_{key}_ms']:>10}{result[f'tls_{key}_ms']:>10}"
            f"{result[f'added_{key}_ms']:>10}"
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="requests each way")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(root / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(root / "key.pem"))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    weights = root / "zero.sim.json"
    weights.write_text(json.dumps({"load_ms": 0, "base_ms": 0, "output_ms_per_token": 0}))
    up_port, plain_port, tls_port = free_port(), free_port(), free_port()
    tls_keys = {"tls_cert_file": str(root / "cert.pem"), "tls_key_file": str(root / "key.pem")}
    configs = {
        "plain": write_router(root, "plain", plain_port, up_port, {}),
        "tls": write_router(root, "tls", tls_port, up_port, tls_keys),
    }
    upstream = start(
        [sys.executable, "-m", "proxy.sim", "-m", str(weights), "--port", str(up_port)],
        root / "upstream.log",
    )
    routers = [
        start(
            [sys.executable, "manage.py", "runrouter", "--no-workers", "--config", str(path)],
            root / f"{name}.log",
            router_env(),
        )
        for name, path in configs.items()
    ]
    try:
        p, s, opened = asyncio.run(
            measure(
                f"http://127.0.0.1:{plain_port}/v1/chat/completions",
                f"https://127.0.0.1:{tls_port}/v1/chat/completions",
                context,
                args.n,
            )
        )
    finally:
        for proc in [*routers, upstream]:
            stop(proc)
    result = report(args, p, s)
    result["tls_connections"] = opened
    print(json.dumps(result))


if __name__ == "__main__":
    main()
