"""Router queue throughput and memory (lending/queue.py, no I/O).

1. Throughput: 100k requests over several models of one lane are enqueued at depth 2, then an
   admitted entry is completed (which admits the next) until all are done. Reported per phase and
   overall as operations per second, where an operation is one enqueue or one complete call
   (admission happens inside them). Run once plainly and once with a hold predicate installed that
   never holds, which is the cost of the hold check on every admission. Best of a few rounds.
2. Memory: tracemalloc over building a queue of 100k waiting requests whose 1 KB payload is one
   shared bytes object (so the body itself is not counted): the queue's own bytes per request,
   entry object and work tuple included, against the 8 KB target.

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/queue_ops.py [--n 100000]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Run as a script, bench/ is first on sys.path, and bench/queue.py would shadow the standard
# library's `queue`: swap that entry for the repository root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

from lending.queue import Entry, HoldPredicate, LaneQueue  # noqa: E402

DEFAULT_ENTRIES = 100_000
DEPTH = 2
MODELS = ("model-a", "model-b", "model-c", "model-d")
PAYLOAD_BYTES = 1024
TARGET_BYTES_PER_ENTRY = 8192
ROUNDS = 3


def make_entries(n: int, payload: bytes) -> list[Entry]:
    return [
        Entry(
            model_id=MODELS[i % len(MODELS)],
            arrived_at=float(i),
            work=(float(100 + i % 900), 64.0),
            context=1000 + i % 900,
            pinned=i % 50 == 0,
            payload=payload,
        )
        for i in range(n)
    ]


def never_hold(entry: Entry, queue: LaneQueue, now: float) -> bool:
    return False


def run_round(n: int, hold: HoldPredicate | None) -> tuple[float, float]:
    """(enqueue seconds, complete seconds) for one full round."""
    ticks = [0.0]

    def clock() -> float:
        return ticks[0]

    entries = make_entries(n, b"x" * PAYLOAD_BYTES)
    queue = LaneQueue("text", depth=DEPTH, clock=clock, hold=hold)
    running: deque[Entry] = deque()
    enqueue = queue.enqueue
    complete = queue.complete
    started = time.perf_counter()
    for entry in entries:
        running.extend(enqueue(entry))
    enqueued = time.perf_counter()
    done = 0
    while running:
        running.extend(complete(running.popleft()))
        done += 1
    finished = time.perf_counter()
    if done != n or len(queue) != 0:
        raise RuntimeError(f"queue did not drain: {done} completed, {len(queue)} left")
    return enqueued - started, finished - enqueued


def best_round(n: int, hold: HoldPredicate | None) -> tuple[float, float]:
    rounds = [run_round(n, hold) for _ in range(ROUNDS)]
    return min(r[0] for r in rounds), min(r[1] for r in rounds)


def bytes_per_entry(n: int) -> float:
    payload = b"x" * PAYLOAD_BYTES
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    queue = LaneQueue("text", depth=DEPTH, clock=lambda: 0.0)
    # Entries are referenced by the queue only, as in the router, so no list of them is counted.
    for i in range(n):
        queue.enqueue(
            Entry(
                model_id=MODELS[i % len(MODELS)],
                arrived_at=float(i),
                work=(float(100 + i % 900), 64.0),
                context=1000 + i % 900,
                payload=payload,
            )
        )
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    if len(queue) != n:
        raise RuntimeError("queue lost entries")
    return (after - before) / n


def row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=DEFAULT_ENTRIES, help="requests per round")
    args = parser.parse_args(argv)
    n: int = args.n

    scenarios: list[tuple[str, Callable[[Entry, LaneQueue, float], bool] | None]] = [
        ("plain", None),
        ("hold check", never_hold),
    ]
    results: dict[str, tuple[float, float]] = {
        name: best_round(n, hold) for name, hold in scenarios
    }
    memory = bytes_per_entry(n)

    widths = [12, 14, 16, 14, 16]
    print(f"router queue, {n} requests, depth {DEPTH}, {len(MODELS)} models, best of {ROUNDS}")
    print(row(["scenario", "enqueue/s", "complete+admit/s", "ops/s", "requests/s"], widths))
    for name, (enqueue_secs, complete_secs) in results.items():
        total = enqueue_secs + complete_secs
        print(
            row(
                [
                    name,
                    f"{n / enqueue_secs:,.0f}",
                    f"{n / complete_secs:,.0f}",
                    f"{2 * n / total:,.0f}",
                    f"{n / total:,.0f}",
                ],
                widths,
            )
        )
    passed = memory <= TARGET_BYTES_PER_ENTRY
    print(f"memory: {memory:,.0f} bytes per waiting request (target {TARGET_BYTES_PER_ENTRY:,})")

    enqueue_secs, complete_secs = results["plain"]
    print(
        json.dumps(
            {
                "bench": "queue_ops",
                "ops_per_sec": round(2 * n / (enqueue_secs + complete_secs)),
                "bytes_per_entry": round(memory, 1),
                "target_bytes": TARGET_BYTES_PER_ENTRY,
                "pass": passed,
            }
        )
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
