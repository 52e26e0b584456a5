"""Per-key limits: `rpm` 60 held across three nodes, and the per-request cost of the check.

1. Cluster (real processes, `tests/harness.py`): a master and two slaves, one sim replica of
   `alpha` on each; a stored key with `rpm` 60 made through the API on the master. Requests go
   round-robin to the three nodes at `--rate` a second (four times the limit by default) for
   `--seconds` (70: the first minute fills the limit, the rest shows the window sliding). The
   client notes each answer; the largest number of 200s whose sends fit in any 60 s is what
   the cluster let through in a minute. The slack the README states: what the other nodes
   admit in two exchange intervals (one report, one answer), here `rate` * 2/3 (the share
   of the other two nodes) * 2 * `LIMITS_SYNC_INTERVAL_SECS`, rounded up, plus one for the
   calls' own time. Pass: at most 60 + that slack in every minute, every other answer a 429.
2. In process: `Limiter.admit` + `release` with 1,000 keys (each with rpm, tpm and
   max_concurrent), and the whole edge check (`proxy.edge.limits.admit`: the body's token
   estimate, the table check, the decision, the headers), per request.

Run: `.venv/bin/python bench/ratelimit.py [--seconds 70] [--rate 4]`; `--seconds 0` skips the
cluster. Prints tables and, last, one JSON line.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/ratelimit.py`, this file's folder comes first on sys.path, where the
# sibling `queue.py` would shadow the standard library's `queue`.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import asyncio
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerproject.settings")
REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("ROUTER_CONFIG", str(REPO / "tests" / "config.test.yaml"))

import django

django.setup()

import httpx
import orjson

from access.identity import STORED, Caller
from access.keys import KeyRecord, KeyTable, install_table, secret_hash
from access.limits import WINDOW_SECS, Limiter, Limits, reset_for_tests
from registry.limitsync import LIMITS_SYNC_INTERVAL_SECS

RPM = 60
KEYS_IN_PROCESS = 1000
TARGET_CHECK_US = 20.0
CHAT = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


# -- 1. the cluster -----------------------------------------------------------------------------


def stated_slack(rate: float) -> int:
    others_per_sec = rate * 2 / 3
    return math.ceil(others_per_sec * 2 * LIMITS_SYNC_INTERVAL_SECS) + 1


def max_in_window(times: list[float], window: float) -> int:
    """The most sends that fit in any `window` seconds (two pointers over sorted times)."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, at in enumerate(times):
        while at - times[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


async def drive(
    urls: list[str], secret: str, rate: float, seconds: float
) -> list[tuple[float, int]]:
    """Send round-robin at `rate` a second; (send time from the start, status) of each."""
    out: list[tuple[float, int]] = []
    headers = {"Authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(timeout=30) as client:

        async def one(i: int, at: float) -> None:
            try:
                response = await client.post(
                    urls[i % len(urls)] + "/v1/chat/completions", json=CHAT, headers=headers
                )
                status = response.status_code
            except httpx.HTTPError:
                status = 0
            out.append((at, status))

        t0 = time.monotonic()
        tasks = []
        n = int(rate * seconds)
        for i in range(n):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(i, time.monotonic() - t0)))
        await asyncio.gather(*tasks)
    return out


def cluster_run(rate: float, seconds: float) -> dict[str, Any]:
    from tests.harness import start_cluster, text_model, wait_for

    root = Path(tempfile.mkdtemp(prefix="bench-ratelimit-"))
    alpha = text_model("alpha")
    cluster = start_cluster(root, [alpha], {"s1": [alpha], "s2": [alpha]})
    try:
        with cluster.master.client() as c:
            made = c.post("/router/v1/site/api-keys", json={"name": "bench", "rpm": RPM})
        made.raise_for_status()
        secret = made.json()["key"]
        urls = [n.base_url for n in cluster.nodes()]

        def everywhere() -> bool:
            return all(
                httpx.get(
                    u + "/v1/models", headers={"Authorization": f"Bearer {secret}"}
                ).status_code
                == 200
                for u in urls
            )

        wait_for(everywhere, timeout=15)
        answers = asyncio.run(drive(urls, secret, rate, seconds))
    finally:
        cluster.cleanup()
    admitted = [at for at, status in answers if status == 200]
    refused = sum(1 for _, status in answers if status == 429)
    other = len(answers) - len(admitted) - refused
    in_minute = max_in_window(admitted, float(WINDOW_SECS))
    slack = stated_slack(rate)
    return {
        "sent": len(answers),
        "admitted": len(admitted),
        "refused_429": refused,
        "other": other,
        "max_admitted_in_60s": in_minute,
        "first_minute_admitted": sum(1 for at in admitted if at < WINDOW_SECS),
        "stated_slack": slack,
        "pass": in_minute <= RPM + slack and other == 0,
    }


# -- 2. in process ------------------------------------------------------------------------------


def per_call_us(check: Callable[[], object], rounds: int) -> float:
    """The median over five runs of `rounds` calls, in µs per call."""
    runs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            check()
        runs.append((time.perf_counter_ns() - t0) / rounds / 1000.0)
    return sorted(runs)[2]


def in_process(rounds: int) -> dict[str, float]:
    from proxy.edge import limits as edge
    from proxy.request import Ctx

    names = [f"k{i}" for i in range(KEYS_IN_PROCESS)]
    table = KeyTable(
        KeyRecord(
            name=n, key_hash=secret_hash(f"rk-{n}"), rpm=10**9, tpm=10**12, max_concurrent=10**6
        )
        for n in names
    )
    install_table(table)
    generous = Limits(rpm=10**9, tpm=10**12, max_concurrent=10**6)
    core = Limiter()
    core.follow(table)
    cursor = iter(range(1 << 62))

    def core_check() -> object:
        decision = core.admit(names[next(cursor) % KEYS_IN_PROCESS], generous, 40)
        core.release(decision.ticket)
        return decision

    reset_for_tests()
    body = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "hello " * 40}]})
    callers = [
        Caller(kind=STORED, name=n, rpm=10**9, tpm=10**12, max_concurrent=10**6) for n in names
    ]

    async def send(message: dict[str, Any]) -> None:
        return None

    async def receive() -> dict[str, Any]:
        return {}

    def edge_check() -> object:
        ctx = Ctx({"headers": []}, receive, send, "/v1/chat/completions", "POST", body=body)
        ticket = edge.admit(ctx, callers[next(cursor) % KEYS_IN_PROCESS])
        edge.release(ticket)
        return ticket

    free = Caller(kind=STORED, name="free")

    def unlimited() -> object:
        ctx = Ctx({"headers": []}, receive, send, "/v1/chat/completions", "POST", body=body)
        return edge.admit(ctx, free)

    def baseline() -> object:
        # What every timed edge call does besides the check: a request context and a pick.
        ctx = Ctx({"headers": []}, receive, send, "/v1/chat/completions", "POST", body=body)
        return ctx, callers[next(cursor) % KEYS_IN_PROCESS]

    return {
        "baseline_ctx_us": per_call_us(baseline, rounds),
        "core_admit_release_us": per_call_us(core_check, rounds),
        "edge_check_us": per_call_us(edge_check, rounds),
        "unlimited_key_us": per_call_us(unlimited, rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=70.0, help="cluster run (0: skip)")
    parser.add_argument("--rate", type=float, default=4.0, help="requests a second, all nodes")
    parser.add_argument("--rounds", type=int, default=20_000, help="calls per timed run")
    args = parser.parse_args()

    costs = in_process(args.rounds)
    print(f"{'limit check (in process, 1,000 keys)':<44}{'µs/request':>12}")
    for label, key in (
        ("Limiter.admit + release", "core_admit_release_us"),
        ("edge admit + release (estimate, headers)", "edge_check_us"),
        ("stored key without limits", "unlimited_key_us"),
        ("baseline: a request context, no check", "baseline_ctx_us"),
    ):
        print(f"{label:<44}{costs[key]:>12.2f}")
    costs["edge_check_minus_baseline_us"] = costs["edge_check_us"] - costs["baseline_ctx_us"]
    print(f"{'edge check minus baseline':<44}{costs['edge_check_minus_baseline_us']:>12.2f}")
    cluster: dict[str, Any] | None = None
    if args.seconds > 0:
        cluster = cluster_run(args.rate, args.seconds)
        print()
        print(f"rpm {RPM} across master + 2 slaves, {args.rate}/s for {args.seconds:.0f}s")
        for key in (
            "sent",
            "admitted",
            "refused_429",
            "other",
            "first_minute_admitted",
            "max_admitted_in_60s",
            "stated_slack",
        ):
            print(f"  {key:<28}{cluster[key]:>8}")
        print(f"  {'allowed (60 + slack)':<28}{RPM + cluster['stated_slack']:>8}")
    check_ok = costs["edge_check_us"] <= TARGET_CHECK_US
    result = {
        "bench": "ratelimit",
        "keys": KEYS_IN_PROCESS,
        **{k: round(v, 3) for k, v in costs.items()},
        "cluster": cluster,
        "rate_per_sec": args.rate,
        "seconds": args.seconds,
        "sync_interval_secs": LIMITS_SYNC_INTERVAL_SECS,
        "targets": {"edge_check_us": TARGET_CHECK_US, "max_admitted_in_60s": "60 + stated_slack"},
        "pass": check_ok and (cluster is None or bool(cluster["pass"])),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
