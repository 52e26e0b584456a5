"""Request IDs in the analytics index: what a row's write costs with random IDs and with the
router's time-ordered ones (UUIDv7), as the table grows.

An SQLite file in WAL mode (as the router runs it) holds a copy of `analytics_requests`' three
indexes (finished_at; request_id; model_id, lane, finished_at). It is filled with `--rows` rows,
then written in `--batches` transactions of `--batch` rows each, the size of one 50 ms analytics
flush at about 1,600 requests a second, and the CPU time per written row is reported. Random IDs
land on a different index page each time; time-ordered ones go at the end of the index.

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/request_ids.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Run as a script, bench/ is first on sys.path, and bench/queue.py would shadow the standard
# library's `queue`: swap that entry for the repository root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from routerproject import request_ids  # noqa: E402

SCHEMA = (
    "CREATE TABLE r (id INTEGER PRIMARY KEY, model_id TEXT, lane TEXT, finished_at TEXT,"
    " request_id TEXT, path TEXT)",
    "CREATE INDEX r_finished ON r (finished_at)",
    "CREATE INDEX r_request ON r (request_id)",
    "CREATE INDEX r_model ON r (model_id, lane, finished_at)",
)
INSERT = "INSERT INTO r (model_id, lane, finished_at, request_id, path) VALUES (?, ?, ?, ?, ?)"


def random_id() -> str:
    return os.urandom(16).hex()


def _row(i: int, make_id: Callable[[], str]) -> tuple[str, str, str, str, str]:
    return ("chat", "text", f"{i:015d}", make_id(), "/v1/chat/completions")


def us_per_row(make_id: Callable[[], str], rows: int, batches: int, batch: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "bench.sqlite3", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        for statement in SCHEMA:
            db.execute(statement)
        db.execute("BEGIN")
        db.executemany(INSERT, (_row(i, make_id) for i in range(rows)))
        db.execute("COMMIT")
        start = time.process_time()
        for b in range(batches):
            first = rows + b * batch
            written = [_row(first + i, make_id) for i in range(batch)]
            db.execute("BEGIN")
            db.executemany(INSERT, written)
            db.execute("COMMIT")
        spent = time.process_time() - start
        db.close()
    return spent / (batches * batch) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[20_000, 500_000])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=80)
    args = parser.parse_args()
    results = []
    print(f"{'rows in the table':>18}{'random us/row':>16}{'uuid7 us/row':>15}{'ratio':>8}")
    for rows in args.rows:
        rand = us_per_row(random_id, rows, args.batches, args.batch)
        ordered = us_per_row(request_ids.new, rows, args.batches, args.batch)
        results.append({"rows": rows, "random_us": round(rand, 1), "uuid7_us": round(ordered, 1)})
        print(f"{rows:>18,}{rand:>16.1f}{ordered:>15.1f}{rand / ordered:>8.2f}")
    print(json.dumps({"bench": "request_ids", "batch": args.batch, "results": results}))


if __name__ == "__main__":
    main()
