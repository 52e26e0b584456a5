"""Router overhead: added latency and throughput for an unlinked model.

Starts a zero-cost simulated backend (the upstream) and a real router node (`runrouter`, with
its workers) whose one model is `upstream` mode pointing at it, then:

1. latency: N requests straight to the upstream and N through the router, interleaved one by
   one so both see the same machine state; reports p50/p99 of each and of the difference;
   the router's requests alternate between a config-file key (`auth.inference_keys`) and a
   stored key (made through the site API), so one run also says what a stored-key check adds
   over a config key (target: added p50 within 0.05 ms of each other);
2. throughput: requests/s through the router (and, for scale, straight to the upstream) with
   C concurrent clients, and the router process's CPU time (user + system, from /proc) per
   request of that run: on a shared, loaded machine the CPU a request costs moves far less from
   run to run than its wall time.

`--against PATH` compares this checkout with another one (e.g. a worktree of an older commit):
a second router starts from PATH's `manage.py` (under PATH's `.venv` when it has one: another
commit may need other packages) beside this one, on the same upstream, and the two are
measured in alternating rounds (this, PATH, PATH, this, this, PATH ... `--rounds` of each:
each goes first in every other round), so both see the same machine; each latency run starts
once both routers and their task workers are idle (analytics backlogs written, workers
started). Latency is measured with the config key only (an older checkout may have no stored
keys). It prints each checkout's figures (latencies pooled over its rounds, req/s and CPU per
request averaged; beside the pooled p99, the median of the rounds' own) and their ratios, this
over PATH.

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/overhead.py [--n 1000]
[--against /path/to/checkout --rounds 2]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
BODY = json.dumps(
    {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
).encode()
CONFIG_KEY = "sk-bench-config-key-0123456789"
KEYS_APART_TARGET_MS = 0.05
# A router counts as idle once its CPU time has not moved for this long (/proc counts ticks of
# 10 ms), looked at this often.
IDLE_QUIET_SECS = 0.3
IDLE_POLL_SECS = 0.05


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def wait_http(
    url: str, limit_secs: float = 60.0, session: aiohttp.ClientSession | None = None
) -> None:
    """Poll `url` until it answers 200 (on `session`, e.g. one that speaks TLS, if given)."""
    if session is None:
        async with aiohttp.ClientSession() as own:
            await wait_http(url, limit_secs, own)
        return
    deadline = time.monotonic() + limit_secs
    while True:
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        await asyncio.sleep(0.05)


async def one(session: aiohttp.ClientSession, url: str, key: str = "") -> float:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    async with session.post(url, data=BODY, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return (time.perf_counter() - t0) * 1000.0


async def latency(
    direct: str, routed: str, n: int, stored_key: str | None = None
) -> tuple[list[float], list[float], list[float]]:
    """Direct, routed with the config key, routed with the stored key: n of each, interleaved
    (without `stored_key`, no stored-key requests and an empty third list)."""
    d: list[float] = []
    r: list[float] = []
    s: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(50):  # warm every path and their connection pools
            await one(session, direct)
            await one(session, routed, CONFIG_KEY)
            if stored_key is not None:
                await one(session, routed, stored_key)
        for i in range(n):
            # Rotate which goes first so no path systematically gets the warmer cache.
            order = [(d, direct, ""), (r, routed, CONFIG_KEY)]
            if stored_key is not None:
                order.append((s, routed, stored_key))
            shift = i % len(order)
            for out, url, key in order[shift:] + order[:shift]:
                out.append(await one(session, url, key))
    return d, r, s


async def create_stored_key(base: str) -> str:
    """A stored key made through the site API (this node has no admin key): its secret."""
    body = {"name": "bench"}
    url = f"{base}/router/v1/site/api-keys"
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        doc = await resp.json()
        if resp.status != 201:
            raise RuntimeError(f"creating the stored key: HTTP {resp.status}: {doc}")
        secret: str = doc["key"]
        return secret


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process `pid` has used so far (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(
    url: str, clients: int, total: int, key: str = "", pid: int | None = None
) -> tuple[float, float | None]:
    """Requests/s with `clients` concurrent clients, and (given the server's `pid`) the server
    process's CPU milliseconds per request over the same measured run."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        remaining = total
        lock = asyncio.Lock()

        async def worker() -> None:
            nonlocal remaining
            while True:
                async with lock:
                    if remaining <= 0:
                        return
                    remaining -= 1
                await one(session, url, key)

        await asyncio.gather(*(worker() for _ in range(clients // 4)))  # warm-up pass
        remaining = total
        cpu0 = cpu_seconds(pid) if pid is not None else 0.0
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        rps = total / (time.perf_counter() - t0)
        if pid is None:
            return rps, None
        return rps, (cpu_seconds(pid) - cpu0) * 1000.0 / total


def start(
    argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv,
            cwd=str(cwd),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def write_two_node_configs(
    root: Path,
    *,
    master_port: int,
    slave_port: int,
    token: str,
    master_mode: str = "sim",
    master_extra: dict[str, Any] | None = None,
) -> None:
    """`root/master/config.yaml` and `root/slave/config.yaml` for a master and one slave.

    Each node's model configs go in `root/<name>/kcpps` (created here, left for the caller).
    """
    master_url = f"http://127.0.0.1:{master_port}"
    slave_url = f"http://127.0.0.1:{slave_port}"
    common = {"token": token, "health_interval": "2s", "sync_interval": "2s"}
    configs = {
        "master": (
            master_port,
            master_mode,
            {
                "role": "master",
                "public_url": master_url,
                "slave_urls": [slave_url],
                **(master_extra or {}),
            },
        ),
        "slave": (
            slave_port,
            "sim",
            {"role": "slave", "public_url": slave_url, "master_url": master_url},
        ),
    }
    for name, (port, mode, cluster) in configs.items():
        (root / name / "kcpps").mkdir(parents=True, exist_ok=True)
        doc = {
            "server": {"bind": f"127.0.0.1:{port}"},
            "cluster": {
                "node_id": name,
                "store_dir": str(root / name / "store"),
                **common,
                **cluster,
            },
            "models": {"config_dir": str(root / name / "kcpps")},
            "backend": {"mode": mode},
        }
        (root / name / "config.yaml").write_text(yaml.safe_dump(doc))


def router_env() -> dict[str, str]:
    """The environment for a benchmark's router: its own SQLite, its own config."""
    return {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ROUTER_CONFIG")}


@dataclass
class Router:
    """One router under test: the checkout it runs from, and what its rounds measured."""

    label: str
    checkout: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    stored_key: str | None = None
    direct: list[float] = field(default_factory=list)
    routed: list[float] = field(default_factory=list)
    stored: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    # Each round's added p99 (its routed p99 less its direct p99).
    round_p99: list[float] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def launch(router: Router, root: Path, upstream_url: str) -> None:
    """Start `router` from its checkout's `manage.py`, with one `upstream` model, `bench`."""
    home = root / router.label
    kcpps = home / "kcpps"
    kcpps.mkdir(parents=True)
    (kcpps / "bench.kcpps").write_text(
        json.dumps({"backend_mode": "upstream", "upstream_url": upstream_url})
    )
    config = {
        "server": {"bind": f"127.0.0.1:{router.port}"},
        "cluster": {"store_dir": str(home / "store")},
        "models": {"config_dir": str(kcpps)},
        "backend": {"mode": "sim"},
        "auth": {"inference_keys": [CONFIG_KEY]},
    }
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    router.proc = start(
        [
            python_of(router.checkout),
            "manage.py",
            "runrouter",
            "--config",
            str(home / "config.yaml"),
        ],
        home / "router.log",
        router_env(),
        cwd=router.checkout,
    )


def process_tree(pid: int) -> list[int]:
    """`pid` and every process under it (a router's task workers), from /proc."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass  # gone meanwhile
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU time used so far by `pid` and the processes under it that are still running."""
    total = 0.0
    for member in process_tree(pid):
        try:
            total += cpu_seconds(member)
        except OSError:
            pass
    return total


def wait_idle(
    pids: list[int], quiet_secs: float = IDLE_QUIET_SECS, limit_secs: float = 30.0
) -> None:
    """Return once none of `pids`, nor any process under them, has used a clock tick of CPU
    for `quiet_secs` (or after `limit_secs`): a router's throughput run leaves a backlog of
    analytics rows to write, and a router just started still has its task workers starting up;
    either, during a latency run, would count in that run's p99."""
    deadline = time.monotonic() + limit_secs
    last = [tree_cpu_seconds(pid) for pid in pids]
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(IDLE_POLL_SECS)
        now = [tree_cpu_seconds(pid) for pid in pids]
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_secs:
            return


def measure_round(
    router: Router, direct: str, args: argparse.Namespace, pids: list[int] | None = None
) -> None:
    """One round: the interleaved latency run, then the throughput run with its CPU. The
    latency run starts once the routers `pids` are idle: the router measured among them, since
    the one that goes first in a round has just finished its own throughput run, and its own
    backlog written during its latency run weighed on its p99 as another's would."""
    assert router.proc is not None
    routed = f"{router.base}/v1/chat/completions"
    if pids:
        wait_idle(pids)
    d, r, s = asyncio.run(latency(direct, routed, args.n, router.stored_key))
    router.direct += d
    router.routed += r
    router.round_p99.append(percentile(r, 99) - percentile(d, 99))
    router.stored += s
    rps, cpu_ms = asyncio.run(
        throughput(routed, args.clients, args.total, CONFIG_KEY, router.proc.pid)
    )
    router.rps.append(rps)
    if cpu_ms is not None:
        router.cpu_ms.append(cpu_ms)


def figures(router: Router) -> dict[str, Any]:
    """A router's figures over all its rounds (latencies pooled, req/s and CPU averaged)."""
    d, r, st = router.direct, router.routed, router.stored
    added = [b - a for a, b in zip(d, r, strict=True)]
    out: dict[str, Any] = {
        "checkout": str(router.checkout),
        "rounds": len(router.rps),
        "direct_p50_ms": round(percentile(d, 50), 3),
        "direct_p99_ms": round(percentile(d, 99), 3),
        "router_p50_ms": round(percentile(r, 50), 3),
        "router_p99_ms": round(percentile(r, 99), 3),
        "added_p50_ms": round(percentile(r, 50) - percentile(d, 50), 3),
        "added_p99_ms": round(percentile(r, 99) - percentile(d, 99), 3),
        "added_paired_median_ms": round(statistics.median(added), 3),
        # One bad stretch of the machine decides the pooled p99 of a whole run: each round's
        # own, and their median, say whether it was one round or every one.
        "added_p99_rounds_ms": [round(x, 3) for x in router.round_p99],
        "added_p99_median_round_ms": round(statistics.median(router.round_p99), 3),
        "router_rps": round(statistics.mean(router.rps), 1),
        "router_cpu_ms_per_request": round(statistics.mean(router.cpu_ms), 4),
    }
    if st:
        out.update(
            {
                "stored_key_router_p50_ms": round(percentile(st, 50), 3),
                "stored_key_added_p50_ms": round(percentile(st, 50) - percentile(d, 50), 3),
                # What a stored-key check costs over a config key, request for request.
                "stored_minus_config_p50_ms": round(percentile(st, 50) - percentile(r, 50), 3),
                "stored_minus_config_paired_median_ms": round(
                    statistics.median(b - a for a, b in zip(r, st, strict=True)), 3
                ),
            }
        )
    return out


def ratio(this: float, against: float) -> float | None:
    # A difference of latencies can come out at or below zero on a noisy run: no ratio then.
    return round(this / against, 3) if against > 0 else None


RATIO_KEYS = (
    "added_p50_ms",
    "added_p99_ms",
    "added_p99_median_round_ms",
    "added_paired_median_ms",
    "router_rps",
    "router_cpu_ms_per_request",
)


def print_single(result: dict[str, Any], clients: int) -> None:
    print(f"{'measure':<28}{'direct':>10}{'router':>10}{'added':>10}")
    for name, key in (("p50 latency (ms)", "p50"), ("p99 latency (ms)", "p99")):
        print(
            f"{name:<28}{result[f'direct_{key}_ms']:>10}{result[f'router_{key}_ms']:>10}"
            f"{result[f'added_{key}_ms']:>10}"
        )
    print(
        f"{'p50, stored key (ms)':<28}{result['direct_p50_ms']:>10}"
        f"{result['stored_key_router_p50_ms']:>10}{result['stored_key_added_p50_ms']:>10}"
    )
    print(
        f"{'stored - config key p50':<28}{'':>10}{'':>10}{result['stored_minus_config_p50_ms']:>10}"
    )
    print(
        f"{f'req/s at {clients} clients':<28}{result['direct_rps']:>10}"
        f"{result['router_rps']:>10}{'':>10}"
    )
    print(f"{'router CPU ms per request':<28}{'':>10}{result['router_cpu_ms_per_request']:>10}")


def print_compare(result: dict[str, Any], clients: int) -> None:
    this, against, ratios = result["this"], result["against"], result["ratios"]
    print(f"this:    {this['checkout']}\nagainst: {against['checkout']}")
    print(f"{'measure':<30}{'this':>10}{'against':>10}{'ratio':>10}")
    names = {
        "added_p50_ms": "added p50 (ms)",
        "added_p99_ms": "added p99 (ms)",
        "added_p99_median_round_ms": "added p99, median round (ms)",
        "added_paired_median_ms": "added, paired median (ms)",
        "router_rps": f"req/s at {clients} clients",
        "router_cpu_ms_per_request": "router CPU ms per request",
    }
    for key, name in names.items():
        shown = "-" if ratios[key] is None else ratios[key]
        print(f"{name:<30}{this[key]:>10}{against[key]:>10}{shown:>10}")


def python_of(checkout: Path) -> str:
    """The checkout's own interpreter when it has a venv, else this one."""
    own = checkout / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000, help="latency requests each way a round")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--total", type=int, default=4000, help="requests in a throughput run")
    parser.add_argument(
        "--against", type=Path, help="another checkout to compare with, in alternating rounds"
    )
    parser.add_argument("--rounds", type=int, help="rounds of each (default 1, 2 with --against)")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.against else 1)

    root = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    weights = root / "zero.sim.json"
    weights.write_text(json.dumps({"load_ms": 0, "base_ms": 0, "output_ms_per_token": 0}))
    up_port = free_port()
    routers = [Router("this", REPO, free_port())]
    if args.against is not None:
        routers.append(Router("against", args.against.resolve(), free_port()))
    upstream = start(
        [sys.executable, "-m", "proxy.sim", "-m", str(weights), "--port", str(up_port)],
        root / "upstream.log",
    )
    for router in routers:
        launch(router, root, f"http://127.0.0.1:{up_port}")
    direct = f"http://127.0.0.1:{up_port}/v1/chat/completions"
    try:
        asyncio.run(wait_http(f"http://127.0.0.1:{up_port}/health"))
        for router in routers:
            asyncio.run(wait_http(f"{router.base}/ping"))
        if args.against is None:
            routers[0].stored_key = asyncio.run(create_stored_key(routers[0].base))
        for round_index in range(rounds):
            # Each checkout goes first in every other round, so neither always meets the
            # machine as the other left it.
            pids = [r.proc.pid for r in routers if r.proc is not None]
            for router in routers if round_index % 2 == 0 else routers[::-1]:
                measure_round(router, direct, args, pids)
        rps_direct, _ = asyncio.run(throughput(direct, args.clients, args.total))
    finally:
        for router in routers:
            if router.proc is not None:
                stop(router.proc)
        stop(upstream)

    load = [round(x, 2) for x in os.getloadavg()]
    if args.against is not None:
        this, against = figures(routers[0]), figures(routers[1])
        ratios = {key: ratio(this[key], against[key]) for key in RATIO_KEYS}
        compared = {"this": this, "against": against, "ratios": ratios, "load_average": load}
        compared = {"bench": "overhead", "requests_each_way": args.n, **compared}
        print_compare(compared, args.clients)
        print(json.dumps({**compared, "clients": args.clients, "direct_rps": round(rps_direct, 1)}))
        return
    result: dict[str, Any] = {
        "bench": "overhead",
        "requests_each_way": args.n,
        **figures(routers[0]),
        "clients": args.clients,
        "direct_rps": round(rps_direct, 1),
        "load_average": load,
        "targets": {
            "added_p50_ms": 3.0,
            "added_p99_ms": 10.0,
            "router_rps": 250,
            "stored_minus_config_p50_ms": KEYS_APART_TARGET_MS,
        },
    }
    result["pass"] = (
        result["added_p50_ms"] <= 3.0
        and result["added_p99_ms"] <= 10.0
        and result["router_rps"] >= 250
        and abs(result["stored_minus_config_p50_ms"]) <= KEYS_APART_TARGET_MS
    )
    print_single(result, args.clients)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
