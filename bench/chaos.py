"""Chaos soak: a throwaway 3-node cluster on loopback, faults at random, clients all along.

A master and two slaves (`runrouter` processes on 127.0.0.1, simulated backends) serve a
replicated model and one model of each slave's own. Clients send OpenAI requests (a quarter
of them streamed) through the master without pause, and a few send straight to the slaves.
Meanwhile, at random: a slave is SIGKILLed and restarted, a slave's machine freezes (router
and backends SIGSTOPped for 2-6 s, past the master's health_timeout, then SIGCONTed), a slave's
router alone hiccups (SIGSTOPped for less than health_timeout), a backend is SIGKILLed, or the
master is restarted, after a SIGTERM (it drains) or a SIGKILL. With `--lending`, the slaves'
models are linked to each other (bench/chaos_lending.py) and most traffic goes to one slave's
own model, so backlogs build and work is lent; every slave is then a helper, and a slave fault
picks one that holds lent work when there is one.

Every request names a unique OpenAI `user` (and the same X-Request-Id); the simulated backend
logs each request that completes with its `user`, and those logs outlive the processes and are
followed across rotations (bench/chaos_logs.py; the soak sets a small
`logging.backend_log_max_bytes` to exercise that). So a request that ran twice shows up as
"duplicated", a 200 whose request never ran as "unran", and an error answer for a request
that did run as "wasted" (reported, not a failure: the client may send it again). A request
that ran on a slave that was then lost while it held it (SIGKILLed, or frozen past
health_timeout), or on a backend killed as it finished it, and ran again elsewhere is
"rerun_loss": wasted work the loss made, not a failure, and not counted as duplicated (each
is listed with where it ran).

Outcomes, per request:
  200        a complete answer (a stream ends with [DONE])
  error      a clear error: an error status with the JSON envelope, or a stream that ends
             with an error event
  hung       no answer within the hang limit
  lost       the connection broke without an answer, or an answer that is neither of the above
  cut        (through the master) the connection broke while the master was being SIGKILLed:
             nothing can answer a client whose server process died
Connections refused (the node was down or restarting: nothing was sent) are counted apart as
"refused", not as sent. Requests sent straight to a slave are reported apart: a client
connected to a node that dies loses its connection, and that is not the router's to save.

    ./scripts/chaos --minutes 5 [--lending] [--clients 6] [--direct 2] [--seed N] [--keep]

Prints a table, then one JSON line. Exits 1 if any request through the master hung, was lost,
ran twice or was answered 200 without running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import chaos_lending
from bench.chaos_faults import Faults
from bench.chaos_logs import CompletionLog
from tests.harness import Cluster, ModelSpec, sim_weights, start_cluster

HUNG_SECS = 120.0
# The master's per-poll deadline in the soak: a freeze longer than this is a lost node.
HEALTH_TIMEOUT_SECS = 1.0
# A backend's completion line and the fault around it: the line is written the moment the work
# ends, a kill's signal lands a moment later, and a frozen backend resumed finishes or is
# cancelled within one of its (short) jobs.
LOSS_GRACE_SECS = 1.0
OUTCOMES = ("200", "error", "hung", "lost", "cut")
FAILURES = ("hung", "lost", "duplicated", "unran")
# A connection the master's SIGKILL broke fails within moments of the kill.
CUT_GRACE_SECS = 2.0
CUT_OPEN_SECS = 0.5
# Small, so that a soak of minutes rotates every backend log several times.
LOG_MAX_BYTES = 8192
LOG_BACKUPS = 2


def _model(name: str) -> ModelSpec:
    # Identical weights and settings on every node that has it: replicas of one public ID.
    weights = sim_weights(load_ms=100, base_ms=5, output_ms_per_token=10)
    return ModelSpec(name, {"contextsize": 4096, "parallel": 1}, {"model_param": weights})


@dataclass
class Record:
    user: str
    outcome: str
    detail: str
    started: float
    ended: float


@dataclass
class Tally:
    records: list[Record] = field(default_factory=list)

    def add(self, record: Record) -> None:
        self.records.append(record)


def _classify_error(status: int, body: bytes) -> tuple[str, str]:
    try:
        doc = json.loads(body)
    except ValueError:
        return "lost", f"{status} without a JSON envelope"
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return "error", f"{status} {err.get('code') or err.get('type')}"
    return "lost", f"{status} without an error envelope"


async def _exchange(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], stream: bool
) -> tuple[str, str]:
    headers = {"X-Request-Id": body["user"]}
    if stream:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                return _classify_error(r.status_code, await r.aread())
            last = ""
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    last = line
            if last == "data: [DONE]":
                return "200", ""
            if '"error"' in last:
                return "error", "stream ended with an error event"
            return "lost", "stream ended without [DONE] or an error"
    r = await client.post(url, json=body, headers=headers)
    if r.status_code == 200:
        ok = isinstance(r.json(), dict) and r.json().get("choices")
        return ("200", "") if ok else ("lost", "200 without choices")
    return _classify_error(r.status_code, r.content)


async def _one(client: httpx.AsyncClient, url: str, model: str, stream: bool) -> Record:
    user = f"chaos-{uuid.uuid4().hex}"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "chaos"}],
        "max_tokens": random.randint(1, 30),
        "user": user,
        "stream": stream,
    }
    started = time.monotonic()
    try:
        async with asyncio.timeout(HUNG_SECS):
            outcome, detail = await _exchange(client, url, body, stream)
    except TimeoutError:
        outcome, detail = "hung", ""
    except httpx.ConnectError:
        outcome, detail = "refused", ""
    except httpx.HTTPError as exc:
        outcome, detail = "lost", type(exc).__name__
    return Record(user, outcome, detail, started, time.monotonic())


async def _clients(
    urls: list[tuple[str, list[str]]], count: int, tally: Tally, stop: threading.Event
) -> None:
    async def run(index: int) -> None:
        base, models = urls[index % len(urls)]
        # One connection per request: a pooled connection a restarting node closes would
        # count a request it never read as lost.
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            while not stop.is_set():
                model = random.choice(models)
                record = await _one(
                    client, base + "/v1/chat/completions", model, random.random() < 0.25
                )
                tally.add(record)
                if record.outcome == "refused":
                    # The node is down: a pause before the next try, not a busy loop.
                    await asyncio.sleep(0.5)
                elif record.outcome != "200":
                    # As a client backs off after an error (a 503 while a slave restarts
                    # comes in a millisecond: without it, those would swamp the count).
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(run(i) for i in range(count)))


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of `values` (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def _when(rec: Record, events: list[tuple[float, float, str]], t0: float) -> str:
    """When a request was sent and answered, and the faults under way around it."""
    near = [
        f"{what} {began - t0:.1f}-{ended - t0:.1f}"
        for began, ended, what in events
        if began - 1.0 <= rec.ended and ended + 1.0 >= rec.started
    ]
    return f"[{rec.started - t0:.1f}-{rec.ended - t0:.1f} s; {', '.join(near) or 'no fault'}]"


def reruns_after_loss(
    where: dict[str, list[tuple[str, int]]], losses: list[tuple[str, float, float]]
) -> set[str]:
    """The requests that ran more than once only because a node that held them was lost.

    A run is on a lost node when that node's backend completed it while the node was lost
    (`losses`: node, from, to in epoch seconds, with `LOSS_GRACE_SECS` either side). A request
    is rerun after a loss when at least one of its runs is such, and of the others at most one
    is not: the run elsewhere that answered it, completed after the loss began.
    """
    out = set()
    for user, runs in where.items():
        if len(runs) < 2:
            continue
        lost = [(node, at) for node, at in runs if _in_loss(node, at / 1000.0, losses)]
        kept = [(node, at) for node, at in runs if (node, at) not in lost]
        if not lost or len(kept) > 1:
            continue
        if all(
            node != lost_node and at / 1000.0 >= _loss_start(lost_node, lost_at, losses)
            for node, at in kept
            for lost_node, lost_at in lost
        ):
            out.add(user)
    return out


def _in_loss(node: str, at: float, losses: list[tuple[str, float, float]]) -> bool:
    return any(
        n == node and began - LOSS_GRACE_SECS <= at <= ended + LOSS_GRACE_SECS
        for n, began, ended in losses
    )


def _loss_start(node: str, at_ms: int, losses: list[tuple[str, float, float]]) -> float:
    at = at_ms / 1000.0
    return min(
        began - LOSS_GRACE_SECS
        for n, began, ended in losses
        if n == node and began - LOSS_GRACE_SECS <= at <= ended + LOSS_GRACE_SECS
    )


def summarize(
    tally: Tally,
    runs: dict[str, int],
    kills: list[float],
    lent_ids: set[str],
    stalled_ids: set[str] | None = None,
    events: tuple[list[tuple[float, float, str]], float] = ([], 0.0),
    reruns: set[str] | None = None,
) -> dict[str, Any]:
    """One table row: outcomes, duplicated/unran/wasted against the completion logs, latency.

    `reruns` (see `reruns_after_loss`) ran more than once because a node was lost: they
    count as `rerun_loss`, not as duplicated.

    A connection that broke within `CUT_GRACE_SECS` after a master SIGKILL that happened while
    it was open (or `CUT_OPEN_SECS` before it opened) is "cut", not lost; `kills` is empty for
    a tally not sent through the master.
    `events` (the faults made and when the soak began) place each example among the faults.
    """
    row: dict[str, Any] = dict.fromkeys(("sent", *OUTCOMES, "refused"), 0)
    row.update(duplicated=0, rerun_loss=0, unran=0, wasted=0, lent=0, dup_stalled=0)
    latencies: list[float] = []
    examples: dict[str, list[str]] = {k: [] for k in (*FAILURES, "rerun_loss")}
    for rec in tally.records:
        outcome = rec.outcome
        # A connection opened an instant after the kill signal can still reach the dying
        # process's listening socket: such a request is cut by the kill too.
        if outcome == "lost" and any(
            rec.started <= k + CUT_OPEN_SECS and k <= rec.ended <= k + CUT_GRACE_SECS for k in kills
        ):
            outcome = "cut"
        row[outcome] += 1
        if outcome == "refused":
            continue  # never sent: the node was not listening
        row["sent"] += 1
        ran = runs.get(rec.user, 0)
        rerun = ran > 1 and rec.user in (reruns or set())
        duplicated = ran > 1 and not rerun
        row["duplicated"] += duplicated
        row["rerun_loss"] += rerun
        # Of those, the ones the master took back from a helper that stopped answering.
        row["dup_stalled"] += duplicated and rec.user in (stalled_ids or set())
        row["unran"] += outcome == "200" and ran == 0
        flags = {
            "hung": outcome == "hung",
            "lost": outcome == "lost",
            "duplicated": duplicated,
            "rerun_loss": rerun,
            "unran": outcome == "200" and ran == 0,
        }
        for key in (k for k, hit in flags.items() if hit):
            examples[key].append(f"{rec.user} {rec.detail} {_when(rec, *events)}")
        row["wasted"] += outcome != "200" and ran > 0
        row["lent"] += rec.user in lent_ids
        if outcome == "200":
            latencies.append((rec.ended - rec.started) * 1000.0)
    for pct in (50, 95, 99):
        value = percentile(latencies, pct)
        row[f"p{pct}_ms"] = None if value is None else round(value)
    row["examples"] = {k: v[:20] for k, v in examples.items() if v}
    return row


def _start(root: Path, lending: bool) -> Cluster:
    cluster_fast: dict[str, Any] = {"health_timeout": f"{HEALTH_TIMEOUT_SECS:g}s"}
    if lending:
        cluster_fast.update(chaos_lending.MASTER_LENDING)
    logs = {"backend_log_max_bytes": LOG_MAX_BYTES, "backend_log_backups": LOG_BACKUPS}
    slave_sections = {"logging": logs}
    cluster = start_cluster(
        root,
        [_model("twin")],
        {"s1": [_model("twin"), _model("solo1")], "s2": [_model("twin"), _model("solo2")]},
        health_interval="1s",
        master_sections={"cluster": cluster_fast, "logging": logs},
        per_slave_sections={"s1": slave_sections, "s2": slave_sections},
    )
    if lending:
        try:
            for problem in chaos_lending.link(cluster):
                print(f"  {problem}", flush=True)
        except BaseException:
            cluster.cleanup()
            raise
    return cluster


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long faults run")
    parser.add_argument("--clients", type=int, default=6, help="clients sending to the master")
    parser.add_argument("--direct", type=int, default=2, help="clients sending to the slaves")
    parser.add_argument("--lending", action="store_true", help="link the slaves' models")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 120:
        parser.error("--minutes must be in (0, 120]")
    return args


def _traffic(cluster: Cluster, lending: bool) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Models the master's clients pick from (repeats weigh), and each direct client's slave."""
    if lending:
        # Mostly s1's own model: s1 builds a backlog while s2 is often idle (a helper takes
        # borrowed work only while it has none of its own); s2's own requests, now and then,
        # take it back from borrowed work.
        through = ["solo1"] * 4 + ["twin", "solo2"]
        return through, [(cluster.slaves["s1"].base_url, ["solo1"])]
    through = ["twin", "solo1", "solo2"]
    direct = [(cluster.slaves["s1"].base_url, ["twin", "solo1"])]
    return through, [*direct, (cluster.slaves["s2"].base_url, ["twin", "solo2"])]


def _soak(
    args: argparse.Namespace, cluster: Cluster, faults: Faults, tallies: tuple[Tally, Tally]
) -> float:
    stop = faults.stop
    master_url = cluster.master.base_url
    through_models, slave_urls = _traffic(cluster, args.lending)
    fault_thread = threading.Thread(target=faults.run, daemon=True)
    started = time.monotonic()
    fault_thread.start()

    async def soak() -> None:
        timer = asyncio.get_running_loop().call_later(args.minutes * 60, stop.set)
        try:
            await asyncio.gather(
                _clients([(master_url, through_models)], args.clients, tallies[0], stop),
                _clients(slave_urls, args.direct, tallies[1], stop) if args.direct else _none(),
            )
        finally:
            timer.cancel()

    asyncio.run(soak())
    fault_thread.join(120)
    return time.monotonic() - started


def _print_table(rows: list[dict[str, Any]]) -> None:
    keys = ["sent", *OUTCOMES, "duplicated", "dup_stalled", "rerun_loss", "unran", "wasted"]
    keys += ["refused", "lent"]
    keys += ["p50_ms", "p95_ms", "p99_ms"]
    print()
    print(" | ".join([f"{'':>20}", *(f"{k:>8}" for k in keys)]))
    for row in rows:
        cells = [f"{row['name']:>20}", *(f"{row[k]!s:>8}" for k in keys)]
        print(" | ".join(cells))


def _print_details(
    faults: Faults, elapsed: float, log: CompletionLog, tallies: dict[str, Tally]
) -> None:
    print(f"\nfaults: {dict(faults.done)}; {elapsed:.0f} s")
    for line in faults.log:
        print(f"  {line}")
    print(
        f"completion logs: {log.rotations} rotations followed, {log.torn} torn,"
        f" {log.gaps()} completion lines missing"
    )
    for label, tally in tallies.items():
        errors: dict[str, int] = {}
        for rec in tally.records:
            if rec.outcome not in ("200", "refused") and rec.detail:
                what = f"{rec.outcome}: {rec.detail[:90]}"
                errors[what] = errors.get(what, 0) + 1
        if errors:
            print(f"answers other than 200, {label}:")
            for what, n in sorted(errors.items(), key=lambda kv: -kv[1])[:12]:
                print(f"  {n:6d}  {what}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    root = Path(tempfile.mkdtemp(prefix="router-chaos-"))
    mode = " with lending" if args.lending else ""
    print(f"chaos: seed {seed}, {args.minutes:g} min{mode}, cluster in {root}", flush=True)
    cluster = _start(root, args.lending)
    since_ms = int(time.time() * 1000)
    began = time.monotonic()
    tallies = (Tally(), Tally())
    stop = threading.Event()
    faults = Faults(
        cluster, random.Random(seed), stop, lending=args.lending, health_timeout=HEALTH_TIMEOUT_SECS
    )
    log = CompletionLog(root)
    # Followed until every node is gone: the router rotates logs until it exits.
    log_stop = threading.Event()
    follower = threading.Thread(target=log.follow, args=(log_stop,), daemon=True)
    follower.start()
    lending: dict[str, Any] = {}
    try:
        elapsed = _soak(args, cluster, faults, tallies)
        faults.thaw_all()
        if args.lending:
            lending = chaos_lending.lending_counts(cluster, since_ms)
    finally:
        stop.set()
        faults.thaw_all()
        cluster.cleanup()
        log_stop.set()
    follower.join(10)
    log.poll()  # what the backends wrote after the follower's last look
    lent_ids = lending.pop("lent_ids", set())
    stalled_ids = lending.pop("stalled_ids", set())
    reruns = reruns_after_loss(log.where, faults.losses)
    placed = (faults.events, began)
    rows = [
        {"name": "through the master"}
        | summarize(
            tallies[0], log.runs, faults.master_kills, lent_ids, stalled_ids, placed, reruns
        ),
        {"name": "straight to a slave"}
        | summarize(tallies[1], log.runs, [], lent_ids, stalled_ids, placed, reruns),
    ]
    _print_table(rows)
    labelled = {"through the master": tallies[0], "straight to a slave": tallies[1]}
    _print_details(faults, elapsed, log, labelled)
    if args.lending:
        print(f"lending: {lending}")
    for row in rows:
        for key, users in row["examples"].items():
            print(f"{key}, {row['name']}:")
            for example in users:
                # Where it ran: the node whose backend completed it, seconds into the soak.
                ran = log.where.get(example.split()[0], [])
                runs = ", ".join(f"{node} at {(at - since_ms) / 1000:.1f}" for node, at in ran)
                print(f"  {example} ran: {runs or 'nowhere'}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "bench": "chaos",
        "seed": seed,
        "minutes": args.minutes,
        "lending": lending if args.lending else None,
        "faults": dict(faults.done),
        "completion_logs": {"rotations": log.rotations, "torn": log.torn, "gaps": log.gaps()},
        "through_master": {k: v for k, v in rows[0].items() if k != "name"},
        "direct_to_slave": {k: v for k, v in rows[1].items() if k != "name"},
    }
    print(json.dumps(result), flush=True)
    return 1 if any(rows[0][k] for k in FAILURES) else 0


async def _none() -> None:
    return None


if __name__ == "__main__":
    sys.exit(main())
