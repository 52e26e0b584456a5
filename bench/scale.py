"""A real master with N emulated slaves: what a thousand nodes cost the master.

Starts the slave emulator (bench/slaves.py) with N slaves on loopback ports, then a real master
(`runrouter`) whose `cluster.slave_urls` names them all, whose database already holds 10 text
links per node (node i's first model lends to the first model of the next 10 nodes) and one
lending setting off its default (so every slave that registers is caught up with the links and
settings, as slaves are after a master restart). Then it measures:

1. the start: master process start to its ready line (the master polls every slave before it
   says ready) and to every slave healthy in `site/nodes/state`;
2. a registration storm: every slave POSTs `node/register` at once; the time until the master
   has accepted them all (and each registration's p50/p99);
3. the health poll: how long one round of `node/models` polls takes (first to last poll the
   emulator sees in a round, with the master's own pace, `cluster.sync_concurrency`);
4. routing: added latency of the master for a model on an emulated slave, against the same
   request sent to the emulated slave straight, interleaved one by one, measured while the
   master's poll rounds and the slaves' key pulls run;
5. lending: 5 % of the owners hold a backlog and report it (`offload/event`), one after the
   other; each event's answer time is one plan (the master polls every node's runtime status,
   or under `--event-poll linked` only the nodes that owner's plan can involve, then plans both
   lanes, re-planning only the owners whose inputs changed), and the master's own planning
   time per event past its polls (`router_cluster_plan_compute_seconds_total` over its rounds);
6. the master's RSS (its whole process group), and answer times of `site/nodes/state`, one
   node's state through the master, and the folded decision log (which asks every node).

Prints a table and, last, one JSON line. Run one size at a time (the machine is shared):

    .venv/bin/python -m bench.scale --nodes 100 [--event-poll linked]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.overhead import free_port, percentile, router_env, start, wait_http
from bench.slaves import NODE, SlaveFarm, free_ports

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-scale-cluster-token-0123456789"
LINKS_PER_NODE = 10
BACKLOGGED_SHARE = 0.05
FIRST_SLAVE_PORT = 22000
HEALTH_INTERVAL_SECS = 5.0
# A lending setting off its default: the slaves' fingerprints differ, so each registration
# gets the links and settings pushed, as after a master restart with slaves that restarted.
CHANGED_SETTING = ("scheduling_backend_depth", "3")
TARGETS = {
    "registration_storm_s": 10.0,
    "poll_round_s": 2.0,
    "plan_per_event_p50_ms": 50.0,
    "master_rss_mb": 1024.0,
    "nodes_state_ms": 300.0,
}
PLAN_METRICS = (
    "router_cluster_plan_rounds_total",
    "router_cluster_plan_compute_seconds_total",
)
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


class Figures(dict[str, Any]):
    """The result, each figure also printed (to stderr) as it is taken: a run that fails or is
    stopped half way still shows what it measured."""

    def __setitem__(self, key: str, value: Any) -> None:
        print(f"  {key} = {value}", file=sys.stderr, flush=True)
        super().__setitem__(key, value)


def write_master(
    root: Path, port: int, slave_urls: list[str], concurrency: int, event_poll: str = "all"
) -> Path:
    """The master's config; its database migrated, with the links and the changed setting."""
    store = root / "store"
    (root / "kcpps").mkdir(parents=True, exist_ok=True)
    config = {
        "server": {"bind": f"127.0.0.1:{port}"},
        "cluster": {
            "role": "master",
            "node_id": "master",
            "token": TOKEN,
            "public_url": f"http://127.0.0.1:{port}",
            "slave_urls": slave_urls,
            "store_dir": str(store),
            "health_interval": f"{HEALTH_INTERVAL_SECS:g}s",
            "sync_interval": "60s",
            "sync_concurrency": concurrency,
            "lending_event_poll": event_poll,
        },
        "models": {"config_dir": str(root / "kcpps")},
        "backend": {"mode": "sim"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**router_env(), "ROUTER_CONFIG": str(path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError("migrate failed:\n" + done.stdout + done.stderr)
    return path


def seed_links(database: Path, node_ids: list[str], models: dict[str, list[str]]) -> int:
    """LINKS_PER_NODE text links per node, straight into the master's (stopped) database."""
    rows = []
    count = len(node_ids)
    for i, owner in enumerate(node_ids):
        for k in range(1, min(LINKS_PER_NODE, count - 1) + 1):
            helper = node_ids[(i + k) % count]
            rows.append((owner, models[owner][0], helper, models[helper][0], 1, 0))
    lite = sqlite3.connect(database)
    try:
        lite.executemany(
            "INSERT INTO routing_links_text (owner_node_id, owner_model_id, helper_node_id, "
            "helper_model_id, load_if_unloaded, restore_after_borrow, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, datetime('now'), datetime('now'))",
            rows,
        )
        lite.execute(
            "INSERT INTO offload_settings (key, value, updated_at) VALUES (?, ?, ?)",
            (*CHANGED_SETTING, int(time.time() * 1000)),
        )
        lite.commit()
    finally:
        lite.close()
    return len(rows)


def group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in the group (the router and its backends)."""
    total_kb = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            status = (entry / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        if match:
            total_kb += int(match.group(1))
    return total_kb / 1024.0


async def timed_get(session: aiohttp.ClientSession, url: str, runs: int) -> tuple[float, Any]:
    """Median milliseconds of `runs` GETs of `url`, and the last answer."""
    times = []
    doc: Any = None
    for _ in range(runs):
        t0 = time.perf_counter()
        async with session.get(url) as resp:
            doc = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status}: {doc}")
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times), doc


async def healthy_count(session: aiohttp.ClientSession, master: str) -> int:
    async with session.get(master + "/router/v1/site/nodes/state") as resp:
        doc = await resp.json(content_type=None)
    return sum(1 for n in doc.get("cluster", {}).get("nodes", []) if n.get("healthy"))


async def wait_until(check: Any, limit_secs: float, what: str) -> float:
    """Poll `check()` (a coroutine function) until true; seconds it took."""
    t0 = time.monotonic()
    while not await check():
        if time.monotonic() - t0 > limit_secs:
            raise RuntimeError(f"{what}: not within {limit_secs:.0f}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def routed_latency(
    farm: SlaveFarm, master: str, secs: float
) -> tuple[list[float], list[float], Counter[int]]:
    """Direct and routed chat requests for the first slave's model, interleaved, for `secs`;
    the statuses of those that were not answered 200 (left out of the times)."""
    slave = farm.slaves[0]
    body = {**BODY, "model": slave.model_names[0]}
    direct = f"{slave.url}{NODE}inference/v1/chat/completions"
    routed = f"{master}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    d: list[float] = []
    r: list[float] = []
    failed: Counter[int] = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(url: str, headers: dict[str, str], out: list[float]) -> None:
            t0 = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as resp:
                await resp.read()
            if resp.status == 200:
                out.append((time.perf_counter() - t0) * 1000.0)
            else:
                failed[resp.status] += 1

        for _ in range(50):
            await one(direct, auth, [])
            await one(routed, {}, [])
        failed.clear()
        end = time.monotonic() + secs
        i = 0
        while time.monotonic() < end:
            pair = [(d, direct, auth), (r, routed, {})]
            for out, url, headers in pair[i % 2 :] + pair[: i % 2]:
                await one(url, headers, out)
            i += 1
    return d, r, failed


def poll_rounds(times: list[float], gap: float) -> list[float]:
    """Durations of the poll rounds in a sorted list of poll arrival times (rounds apart by
    more than `gap`), the first round left out (it may have started before the list)."""
    rounds: list[list[float]] = []
    for t in times:
        if rounds and t - rounds[-1][-1] <= gap:
            rounds[-1].append(t)
        else:
            rounds.append([t])
    return [group[-1] - group[0] for group in rounds[1:]]


async def plan_counters(session: aiohttp.ClientSession, master: str) -> tuple[float, float]:
    """The master's planned rounds and the seconds their planning took past the polls."""
    async with session.get(master + "/metrics") as resp:
        text = await resp.text()
    found = dict.fromkeys(PLAN_METRICS, 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    return found[PLAN_METRICS[0]], found[PLAN_METRICS[1]]


async def lending_events(farm: SlaveFarm) -> tuple[list[float], int]:
    """5 % of the owners report a backlog, one after the other: each answer's ms, and leases."""
    count = max(1, round(len(farm.slaves) * BACKLOGGED_SHARE))
    step = max(1, len(farm.slaves) // count)
    times: list[float] = []
    leases = 0
    for slave in farm.slaves[::step][:count]:
        doc, secs = await farm.event(slave, slave.model_names[0], 8)
        times.append(secs * 1000.0)
        leases += 1 if isinstance(doc, dict) and doc.get("lease") else 0
    return times, leases


async def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    ports = free_ports(args.nodes, args.first_port)
    farm = SlaveFarm(
        master_url="",
        token=TOKEN,
        ports=ports,
        duration_ms=0.0,
        sync_interval=60.0,
        key_pull=not args.no_key_pull,
    )
    master_port = free_port()
    master = f"http://127.0.0.1:{master_port}"
    farm.master_url = master
    config = write_master(
        root / "master", master_port, farm.urls, args.sync_concurrency, args.event_poll
    )
    links = seed_links(
        root / "master" / "store" / "router.sqlite3",
        [s.node_id for s in farm.slaves],
        {s.node_id: s.model_names for s in farm.slaves},
    )
    poll_times: list[float] = []
    farm.on_poll = poll_times.append
    await farm.start()
    result: dict[str, Any] = Figures(bench="scale", nodes=args.nodes, links=links)
    t0 = time.monotonic()
    argv = [sys.executable, "manage.py", "runrouter", "--config", str(config), "--no-migrate"]
    proc = start([*argv, "--no-workers"], root / "master.log", router_env())
    try:
        async with aiohttp.ClientSession() as session:
            await wait_http(master + "/ping", limit_secs=600, session=session)
            result["start_to_ready_s"] = round(time.monotonic() - t0, 3)

            async def all_healthy() -> bool:
                return await healthy_count(session, master) >= args.nodes

            await wait_until(all_healthy, 600, "every slave healthy")
            result["start_to_all_healthy_s"] = round(time.monotonic() - t0, 3)
            result["rss_after_start_mb"] = round(group_rss_mb(proc.pid), 1)

            storm_t0 = time.monotonic()
            answers = await farm.register_all()
            result["registration_storm_s"] = round(time.monotonic() - storm_t0, 3)
            result["registrations_accepted"] = sum(1 for s, _ in answers if s == 200)
            each = [secs * 1000.0 for _, secs in answers]
            result["registration_p50_ms"] = round(percentile(each, 50), 1)
            result["registration_p99_ms"] = round(percentile(each, 99), 1)

            async def links_pushed() -> bool:
                return all(s.links.get("text") for s in farm.slaves)

            result["links_pushed_s"] = round(await wait_until(links_pushed, 600, "links"), 3)

            farm.run_loops()
            loops_t0 = time.monotonic()
            poll_times.clear()
            d, r, failed = await routed_latency(farm, master, args.latency_secs)
            result["latency_pairs"] = len(d)
            result["routed_not_200"] = dict(failed)
            if d and r:
                result["direct_p50_ms"] = round(percentile(d, 50), 3)
                result["routed_p50_ms"] = round(percentile(r, 50), 3)
                result["added_p50_ms"] = round(percentile(r, 50) - percentile(d, 50), 3)
                result["added_p99_ms"] = round(percentile(r, 99) - percentile(d, 99), 3)
            rounds = poll_rounds(sorted(poll_times), HEALTH_INTERVAL_SECS / 2)
            result["poll_rounds_seen"] = len(rounds)
            result["poll_round_s"] = round(max(rounds), 3) if rounds else None
            elapsed = time.monotonic() - loops_t0
            result["key_pulls_per_s"] = round(farm.key_pulls / elapsed, 1)

            asks_before = farm.status_asks
            planned_before = await plan_counters(session, master)
            times, leases = await lending_events(farm)
            planned = await plan_counters(session, master)
            result["events"] = len(times)
            result["plan_per_event_p50_ms"] = round(statistics.median(times), 1)
            result["plan_per_event_max_ms"] = round(max(times), 1)
            plan_rounds = planned[0] - planned_before[0]
            if plan_rounds > 0:
                compute_ms = (planned[1] - planned_before[1]) * 1000.0 / plan_rounds
                result["plan_compute_per_round_ms"] = round(compute_ms, 2)
            result["plan_rounds"] = plan_rounds
            result["leases"] = leases
            result["status_polls_per_event"] = round((farm.status_asks - asks_before) / len(times))

            state_ms, _ = await timed_get(session, master + "/router/v1/site/nodes/state", 5)
            result["nodes_state_ms"] = round(state_ms, 1)
            one_ms, _ = await timed_get(
                session,
                f"{master}/router/v1/site/nodes/state?node_id={farm.slaves[-1].node_id}",
                5,
            )
            result["one_node_state_ms"] = round(one_ms, 1)
            folds_ms, folds = await timed_get(
                session, master + "/router/v1/site/offload/decisions/folded", 3
            )
            result["folded_page_ms"] = round(folds_ms, 1)
            result["folded_total_rows"] = folds.get("total_rows")
            result["folded_node_errors"] = len(folds.get("node_errors", []))
            result["master_rss_mb"] = round(group_rss_mb(proc.pid), 1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        await farm.close()
    return result


def verdict(result: dict[str, Any]) -> dict[str, bool]:
    return {
        "registration_storm_s": result["registration_storm_s"] <= TARGETS["registration_storm_s"]
        and result["registrations_accepted"] == result["nodes"],
        "poll_round_s": result["poll_round_s"] is not None
        and result["poll_round_s"] <= TARGETS["poll_round_s"],
        "plan_per_event_p50_ms": result["plan_per_event_p50_ms"]
        <= TARGETS["plan_per_event_p50_ms"],
        "master_rss_mb": result["master_rss_mb"] <= TARGETS["master_rss_mb"],
        "nodes_state_ms": result["nodes_state_ms"] <= TARGETS["nodes_state_ms"],
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['nodes']} emulated slaves, {result['links']} text links")
    print(f"{'measure':<34}{'value':>12}{'target':>10}")
    for key, value in result.items():
        if key in ("bench", "nodes", "links", "targets", "pass", "met"):
            continue
        target = TARGETS.get(key)
        print(f"{key:<34}{value!s:>12}{'' if target is None else f'{target:g}':>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--first-port", type=int, default=FIRST_SLAVE_PORT)
    parser.add_argument("--latency-secs", type=float, default=16.0)
    parser.add_argument(
        "--sync-concurrency", type=int, default=4, help="the master's cluster.sync_concurrency"
    )
    parser.add_argument("--no-key-pull", action="store_true", help="slaves do not pull keys")
    parser.add_argument(
        "--event-poll",
        choices=("all", "linked"),
        default="all",
        help="the master's cluster.lending_event_poll",
    )
    parser.add_argument("--keep", action="store_true", help="keep the master's files")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    # A SIGTERM ends the run through its cleanup (the master is in a session of its own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = asyncio.run(measure(args, root))
    result["sync_concurrency"] = args.sync_concurrency
    result["key_pull"] = not args.no_key_pull
    result["event_poll"] = args.event_poll
    met = verdict(result)
    result["targets"] = TARGETS
    result["met"] = met
    result["pass"] = all(met.values())
    print_table(result)
    if args.keep:
        print(f"master files: {root}")
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
