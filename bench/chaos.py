"""Chaos soak: a throwaway 3-node cluster on loopback, faults at random, clients all along.

A master and two slaves (`runrouter` processes on 127.0.0.1, simulated backends) serve a
replicated model and one model of each slave's own. Clients send OpenAI requests (a quarter
of them streamed) through the master without pause, and a few send straight to the slaves.
Meanwhile, at random: a slave is SIGKILLed and restarted, a slave is SIGSTOPped and later
SIGCONTed, a backend is SIGKILLed, or the master is restarted with SIGTERM (it drains).

Every request names a unique OpenAI `user`; the simulated backend logs each request that
completes with its `user`, and those logs outlive the processes, so a request that ran twice
shows up as a duplicate, and a 200 whose request never ran as "unran".

Outcomes, per request:
  200        a complete answer (a stream ends with [DONE])
  error      a clear error: an error status with the JSON envelope, or a stream that ends
             with an error event
  hung       no answer within the hang limit
  lost       the connection broke without an answer, or an answer that is neither of the above
Connections refused (the node was down or restarting: nothing was sent) are counted apart as
"refused", not as sent. Requests sent straight to a slave are reported apart: a client
connected to a node that dies loses its connection, and that is not the router's to save.

    ./scripts/chaos --minutes 5 [--clients 6] [--direct 2] [--seed N]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.harness import (
    CLUSTER_TOKEN,
    Cluster,
    ModelSpec,
    sim_weights,
    start_cluster,
    start_node,
)

HUNG_SECS = 120.0
OUTCOMES = ("200", "error", "hung", "lost")
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
USER_RE = re.compile(r"sim: completed \S+ user=(\S+)")


def _model(name: str) -> ModelSpec:
    # Identical weights and settings on every node that has it: replicas of one public ID.
    weights = sim_weights(load_ms=100, base_ms=5, output_ms_per_token=10)
    return ModelSpec(name, {"contextsize": 4096, "parallel": 1}, {"model_param": weights})


@dataclass
class Tally:
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    ok_users: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, user: str, outcome: str, detail: str = "") -> None:
        self.counts[outcome] += 1
        if outcome == "refused":
            return  # never sent: the node was not listening
        self.counts["sent"] += 1
        self.users.add(user)
        if outcome == "200":
            self.ok_users.add(user)
        elif detail:
            self.errors[f"{outcome}: {detail[:90]}"] += 1


def _classify_error(status: int, body: bytes) -> tuple[str, str]:
    try:
        doc = json.loads(body)
    except ValueError:
        return "lost", f"{status} without a JSON envelope"
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return "error", f"{status} {err.get('code') or err.get('type')}"
    return "lost", f"{status} without an error envelope"


async def _one(
    client: httpx.AsyncClient, url: str, model: str, stream: bool
) -> tuple[str, str, str]:
    user = f"chaos-{uuid.uuid4().hex}"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "chaos"}],
        "max_tokens": random.randint(1, 30),
        "user": user,
        "stream": stream,
    }
    try:
        async with asyncio.timeout(HUNG_SECS):
            if stream:
                async with client.stream("POST", url, json=body) as r:
                    if r.status_code != 200:
                        return (user, *_classify_error(r.status_code, await r.aread()))
                    last = ""
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            last = line
                    if last == "data: [DONE]":
                        return user, "200", ""
                    if '"error"' in last:
                        return user, "error", "stream ended with an error event"
                    return user, "lost", "stream ended without [DONE] or an error"
            r = await client.post(url, json=body)
            if r.status_code == 200:
                ok = isinstance(r.json(), dict) and r.json().get("choices")
                return (user, "200", "") if ok else (user, "lost", "200 without choices")
            return (user, *_classify_error(r.status_code, r.content))
    except TimeoutError:
        return user, "hung", ""
    except httpx.ConnectError:
        return user, "refused", ""
    except httpx.HTTPError as exc:
        return user, "lost", type(exc).__name__


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
                user, outcome, detail = await _one(
                    client, base + "/v1/chat/completions", model, random.random() < 0.25
                )
                tally.add(user, outcome, detail)
                if outcome == "refused":
                    # The node is down: a pause before the next try, not a busy loop.
                    await asyncio.sleep(0.5)

    await asyncio.gather(*(run(i) for i in range(count)))


class Faults:
    """Injects one fault at a time, at random, from its own thread."""

    def __init__(self, cluster: Cluster, rng: random.Random, stop: threading.Event) -> None:
        self.cluster = cluster
        self.rng = rng
        self.stop = stop
        self.done: collections.Counter[str] = collections.Counter()
        self.log: list[str] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        # Weighted: a master restart takes the longest, and clients can only be refused then.
        actions = [self.kill_slave] * 2 + [self.freeze_slave] * 2 + [self.kill_backend] * 3
        actions.append(self.restart_master)
        while not self.stop.wait(self.rng.uniform(1.0, 4.0)):
            action = self.rng.choice(actions)
            try:
                action()
                self.done[action.__name__] += 1
            except Exception as exc:  # a fault that could not be made is reported, not fatal
                self.log.append(f"{action.__name__} failed: {exc!r}")

    def kill_slave(self) -> None:
        name = self.rng.choice(sorted(self.cluster.slaves))
        node = self.cluster.slaves[name]
        os.killpg(node.proc.pid, signal.SIGKILL)
        self.stop.wait(self.rng.uniform(1.0, 3.0))
        with self.lock:
            self.cluster.restart_slave(name)

    def freeze_slave(self) -> None:
        name = self.rng.choice(sorted(self.cluster.slaves))
        node = self.cluster.slaves[name]
        os.killpg(node.proc.pid, signal.SIGSTOP)
        try:
            self.stop.wait(self.rng.uniform(2.0, 6.0))
        finally:
            os.killpg(node.proc.pid, signal.SIGCONT)

    def kill_backend(self) -> None:
        node = self.rng.choice(self.cluster.nodes())
        state = httpx.get(node.base_url + "/router/v1/node/state", headers=AUTH, timeout=5).json()
        pids = [b["pid"] for b in state["backends"] if b.get("pid")]
        if pids:
            os.kill(self.rng.choice(pids), signal.SIGKILL)

    def restart_master(self) -> None:
        c = self.cluster
        old = c.master
        old.stop(timeout=60)
        old.cleanup(drop_db=False)
        port, models, sections = c.specs["master"]
        c.master = start_node(c.root / "master", models, port=port, db=old.db, **sections)

    def thaw_all(self) -> None:
        for node in self.cluster.nodes():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGCONT)


def _completions(root: Path) -> collections.Counter[str]:
    runs: collections.Counter[str] = collections.Counter()
    for log in root.rglob("*-backend.log"):
        for match in USER_RE.finditer(log.read_text(errors="replace")):
            runs[match.group(1)] += 1
    return runs


def _report(name: str, tally: Tally, runs: collections.Counter[str]) -> dict[str, Any]:
    duplicated = sum(1 for u in tally.users if runs[u] > 1)
    unran = sum(1 for u in tally.ok_users if runs[u] == 0)
    row: dict[str, Any] = {k: tally.counts[k] for k in ("sent", *OUTCOMES, "refused")}
    row["duplicated"] = duplicated
    row["unran"] = unran
    row["name"] = name
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long faults run")
    parser.add_argument("--clients", type=int, default=6, help="clients sending to the master")
    parser.add_argument("--direct", type=int, default=2, help="clients sending to the slaves")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 120:
        parser.error("--minutes must be in (0, 120]")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="router-chaos-"))
    print(f"chaos: seed {seed}, {args.minutes:g} min, cluster in {root}", flush=True)
    fast = {"cluster": {"health_timeout": "1s"}}
    cluster = start_cluster(
        root,
        [_model("twin")],
        {"s1": [_model("twin"), _model("solo1")], "s2": [_model("twin"), _model("solo2")]},
        health_interval="1s",
        master_sections=fast,
    )
    through = Tally()
    direct = Tally()
    stop = threading.Event()
    faults = Faults(cluster, rng, stop)
    try:
        master_url = cluster.master.base_url
        slave_urls = [
            (cluster.slaves["s1"].base_url, ["twin", "solo1"]),
            (cluster.slaves["s2"].base_url, ["twin", "solo2"]),
        ]
        fault_thread = threading.Thread(target=faults.run, daemon=True)
        started = time.monotonic()
        fault_thread.start()

        async def soak() -> None:
            timer = asyncio.get_running_loop().call_later(args.minutes * 60, stop.set)
            try:
                await asyncio.gather(
                    _clients(
                        [(master_url, ["twin", "solo1", "solo2"])], args.clients, through, stop
                    ),
                    _clients(slave_urls, args.direct, direct, stop) if args.direct else _none(),
                )
            finally:
                timer.cancel()

        asyncio.run(soak())
        fault_thread.join(120)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        faults.thaw_all()
        cluster.cleanup()
    runs = _completions(root)
    rows = [
        _report("through the master", through, runs),
        _report("straight to a slave", direct, runs),
    ]
    header = ["", "sent", *OUTCOMES, "duplicated", "unran", "refused"]
    print()
    print(" | ".join(f"{h:>20}" if i == 0 else f"{h:>8}" for i, h in enumerate(header)))
    for row in rows:
        cells = [row["name"], *(row[k] for k in header[1:])]
        print(" | ".join(f"{c:>20}" if i == 0 else f"{c:>8}" for i, c in enumerate(cells)))
    print(f"\nfaults: {dict(faults.done)}; {elapsed:.0f} s")
    for line in faults.log:
        print(f"  {line}")
    for label, tally in (("through the master", through), ("straight to a slave", direct)):
        if tally.errors:
            print(f"answers other than 200, {label}:")
            for what, n in tally.errors.most_common(12):
                print(f"  {n:6d}  {what}")
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    result = {
        "bench": "chaos",
        "seed": seed,
        "minutes": args.minutes,
        "faults": dict(faults.done),
        "through_master": {k: v for k, v in rows[0].items() if k != "name"},
        "direct_to_slave": {k: v for k, v in rows[1].items() if k != "name"},
    }
    print(json.dumps(result), flush=True)
    target = rows[0]
    return 0 if target["hung"] == target["lost"] == target["duplicated"] == 0 else 1


async def _none() -> None:
    return None


if __name__ == "__main__":
    sys.exit(main())
