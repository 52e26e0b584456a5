"""How close `lending_replay` predicts a real run: a loopback cluster (master, owner o, helper h
on simulated backends with known costs), warm-up traffic so both fits exist, then bursts of
requests at the owner; each node's rows are exported (`analytics_export`) and replayed on the
master (`lending_replay --input …`), and each burst's predicted makespan is set beside the one
measured by the client and the one the rows say.

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/replay.py [--bursts 3]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/replay.py`, this file's folder comes first on sys.path, where the
# sibling `queue.py` would shadow the standard library's `queue`.
sys.path[0] = str(Path(__file__).resolve().parent.parent)
# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any

from tests.harness import (
    CLUSTER_TOKEN,
    REPO,
    Cluster,
    RouterNode,
    start_cluster,
    text_model,
    wait_for,
)

OWNER_PER_TOKEN, HELPER_PER_TOKEN = 40, 2
BURST_TOKENS = 10
TARGET_ERROR = 0.05


def chat(model: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    }


def warm_up(node: RouterNode, model: str, count: int) -> None:
    with node.client(timeout=120) as client:
        for i in range(count):
            resp = client.post("/v1/chat/completions", json=chat(model, 5 + i))
            resp.raise_for_status()


def burst(node: RouterNode, size: int) -> float:
    """Send `size` requests at once; the client's makespan in ms."""
    done: list[float] = []
    lock = threading.Lock()
    start = time.monotonic()

    def one() -> None:
        with node.client(timeout=120) as client:
            resp = client.post("/v1/chat/completions", json=chat("big", BURST_TOKENS))
        resp.raise_for_status()
        with lock:
            done.append(time.monotonic())

    threads = [threading.Thread(target=one) for _ in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (max(done) - start) * 1000.0


def fits_known(c: Cluster) -> bool:
    for name, model in (("o", "big"), ("h", "fast")):
        node = c.slaves[name]
        with node.client() as client:
            status = client.get(
                "/router/v1/node/runtime-status",
                headers={"Authorization": f"Bearer {CLUSTER_TOKEN}"},
            ).json()
        costs = status.get("costs") or {}
        if not any(row.get("model_id") == model for row in costs.get("models", [])):
            return False
    return True


def manage(node: RouterNode, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ROUTER_CONFIG")}
    argv = [sys.executable, str(REPO / "manage.py"), *args, "--config", str(node.config_path)]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--size", type=int, default=12)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    c = start_cluster(
        root,
        [],
        {
            "o": [text_model("big", load_ms=50, base_ms=5, output_ms_per_token=OWNER_PER_TOKEN)],
            "h": [text_model("fast", load_ms=50, base_ms=5, output_ms_per_token=HELPER_PER_TOKEN)],
        },
        master_sections={"cluster": {"scheduling_refresh_interval": "1s"}},
    )
    try:
        with c.master.client() as client:
            link = {
                "anchor": {"node_id": "o", "model_id": "big"},
                "lends_to": [{"node_id": "h", "model_id": "fast"}],
                "acknowledge_different_weights": True,
            }
            client.post("/router/v1/site/text-routing-groups", json=link).raise_for_status()
            client.post("/router/v1/load", json={"model": "fast"}).raise_for_status()
        warm_up(c.slaves["o"], "big", 25)
        warm_up(c.slaves["h"], "fast", 25)
        wait_for(lambda: fits_known(c), timeout=60, interval=0.2)
        measured = []
        for _ in range(args.bursts):
            measured.append(burst(c.slaves["o"], args.size))
            time.sleep(3.0)  # bench pacing: a quiet gap longer than the replay's 2 s burst gap
        files = []
        for name in ("o", "h"):
            out = root / f"{name}.jsonl"
            manage(c.slaves[name], "analytics_export", "--since", "1h", "--output", str(out))
            files += ["--input", str(out)]
        # The writers flush every second; the export above ran after the last burst's rows
        # were written (the gap), and the master's own decision rows are in its database.
        text = manage(c.master, "lending_replay", "--since", "1h", *files, "--min-burst", "3")
    finally:
        c.cleanup()
    doc = json.loads(text.strip().splitlines()[-1])
    print(text.strip().splitlines()[0])
    print(
        f"{'burst':>5} {'client ms':>10} {'rows ms':>8} {'predicted':>10} {'error':>7} {'lent':>9}"
    )
    errors = []
    rows = []
    # The warm-up is a slow "burst" of its own: only the bursts sent here are compared.
    sent = [b for b in doc["bursts"] if b["requests"] == args.size]
    for measured_ms, b in zip(measured, sent, strict=False):
        predicted = b["recorded"]["makespan_ms"]
        actual = b["actual"]["makespan_ms"]
        error = (predicted - actual) / actual
        errors.append(abs(error))
        rows.append(
            {
                "client_ms": round(measured_ms, 1),
                "rows_ms": actual,
                "predicted_ms": predicted,
                "error": round(error, 4),
                "lent_actual": b["actual"]["lent"],
                "lent_predicted": b["recorded"]["lent"],
            }
        )
        print(
            f"{b['burst']:>5} {measured_ms:>10.0f} {actual:>8.0f} {predicted:>10.0f} "
            f"{error:>+7.1%} {b['actual']['lent']:>4}/{b['recorded']['lent']:<4}"
        )
    median = statistics.median(errors) if errors else None
    print(
        json.dumps(
            {
                "bench": "replay",
                "bursts": rows,
                "median_abs_error": median,
                "target_abs_error": TARGET_ERROR,
                "pass": median is not None and median <= TARGET_ERROR,
            }
        )
    )


if __name__ == "__main__":
    main()
