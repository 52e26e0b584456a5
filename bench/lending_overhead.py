"""The router's own overhead per lent job, from one run's timestamps on every side.

For each lent request: when the client sent it, when the owner decided to lend it (its `lent`
row), when the helper's backend ran it (the helper's analytics row: its backend service time,
ending when the helper finished answering), and when the owner's client had the answer. All
processes run on one machine, so their wall clocks agree.

- ``idle``: per lent job, how long the helper's backend sat free while that job was already
  waiting at the owner: from the later of its send and the end of the helper's previous lent
  job to its start. It sums everything the router adds before a lent job runs (the first
  lease's round trip, the relay, a freed slot waiting for its refill); time a lent job waits
  behind another one in the helper's backend is not counted (the backend was busy), nor is
  time the helper had nothing to do because nothing had arrived yet.
- ``to_helper``: the relay leg alone, from the later of the lend decision and the end of the
  helper's previous lent job to its start.
- ``back``: from the helper's backend finishing to the owner's client having the answer
  (relay, rewriting, bookkeeping).

`service` is what the helper's backend took per job: on a loaded machine the simulated
backends run later than their nominal cost, which the optimum leaves out and no router change
can win back.
"""

from __future__ import annotations

import math
import sqlite3
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench.lending_support import Run
from tests.harness import RouterNode


@dataclass(frozen=True)
class LentJob:
    """One lent request's wall-clock times (ms since the epoch)."""

    helper: str
    sent_ms: float
    lent_ms: float
    start_ms: float
    end_ms: float
    done_ms: float


def _wall_ms(value: Any) -> float:
    # PostgreSQL gives an aware datetime; SQLite the text Django wrote, in UTC.
    stamp = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp() * 1000.0


def helper_rows(node: RouterNode, since_wall_ms: int) -> list[dict[str, Any]]:
    """The node's borrowed request rows since then, from its own database (a slave serves no
    site route for them)."""
    since = datetime.fromtimestamp(since_wall_ms / 1000.0, UTC).replace(tzinfo=None)
    found = node.query(
        "SELECT request_id, duration_ms, finished_at FROM analytics_requests"
        " WHERE borrowed = %s AND finished_at >= %s",
        (True, since.isoformat(sep=" ")),
    )
    return [{"request_id": r[0], "duration_ms": r[1], "finished_at": r[2]} for r in found]


def lent_jobs(
    run: Run,
    decisions: Iterable[Mapping[str, Any]],
    owners: Iterable[str],
    helpers: Mapping[str, RouterNode],
) -> list[LentJob]:
    """Every lent request of ``run`` that a helper answered, with its four times."""
    wanted = set(owners)
    lent = {
        str(r["request_id"]): r
        for r in decisions
        if r.get("outcome") == "lent" and r.get("node_id") in wanted and r.get("request_id")
    }
    answers = {a.request_id: a for a in run.answers if a.request_id}
    jobs: list[LentJob] = []
    for name, node in helpers.items():
        for row in helper_rows(node, run.started_wall_ms):
            rid = str(row.get("request_id") or "")
            answer = answers.get(rid)
            if rid not in lent or answer is None:
                continue
            end = _wall_ms(str(row["finished_at"]))
            jobs.append(
                LentJob(
                    helper=name,
                    sent_ms=run.started_wall_ms + answer.sent_ms,
                    lent_ms=float(lent[rid]["recorded_at"]),
                    start_ms=end - float(row["duration_ms"]),
                    end_ms=end,
                    done_ms=run.started_wall_ms + answer.done_ms,
                )
            )
    return jobs


def overhead(jobs: Sequence[LentJob], started_wall_ms: float) -> dict[str, Any]:
    """Mean ``idle`` per lent job, medians of ``to_helper``, ``back`` and ``service`` (ms),
    and when the first job was lent and started, after the run's first send."""
    if not jobs:
        return {"jobs": 0}
    to_helper: list[float] = []
    idle = 0.0
    for helper in sorted({j.helper for j in jobs}):
        free_at = -math.inf
        for job in sorted((j for j in jobs if j.helper == helper), key=lambda j: j.start_ms):
            idle += max(0.0, job.start_ms - max(job.sent_ms, free_at))
            to_helper.append(max(0.0, job.start_ms - max(job.lent_ms, free_at)))
            free_at = max(free_at, job.end_ms)
    back = [j.done_ms - j.end_ms for j in jobs]
    return {
        "jobs": len(jobs),
        "idle_per_job_ms": round(idle / len(jobs), 1),
        "to_helper_p50_ms": round(statistics.median(to_helper), 1),
        "to_helper_max_ms": round(max(to_helper), 1),
        "back_p50_ms": round(statistics.median(back), 1),
        "back_max_ms": round(max(back), 1),
        "service_p50_ms": round(statistics.median(j.end_ms - j.start_ms for j in jobs), 1),
        "first_lent_after_ms": round(min(j.lent_ms for j in jobs) - started_wall_ms, 1),
        "first_start_after_ms": round(min(j.start_ms for j in jobs) - started_wall_ms, 1),
    }


def overhead_cell(doc: Mapping[str, Any]) -> str:
    """One table cell: idle per lent job, the two legs' medians, the helper's job time."""
    if not doc.get("jobs"):
        return "-"
    return (
        f"{doc['idle_per_job_ms']:.0f} ms "
        f"(to {doc['to_helper_p50_ms']:.0f} / back {doc['back_p50_ms']:.0f}; "
        f"job {doc['service_p50_ms']:.0f})"
    )


def measure(
    run: Run,
    decisions: Iterable[Mapping[str, Any]],
    owners: Iterable[str],
    helpers: Mapping[str, RouterNode],
) -> dict[str, Any]:
    """The overhead figures of one run; an ``error`` entry instead when they cannot be read
    (a stopped helper), so a scenario still reports its makespan."""
    rows = list(decisions)
    try:
        doc = overhead(lent_jobs(run, rows, owners, helpers), run.started_wall_ms)
        leases = [int(r["recorded_at"]) for r in rows if r.get("outcome") == "lease_updated"]
        if leases:
            doc["first_lease_after_ms"] = min(leases) - run.started_wall_ms
        return doc
    except (sqlite3.Error, OSError, RuntimeError, KeyError, ValueError) as exc:
        return {"jobs": 0, "error": f"{type(exc).__name__}: {exc}"[:200]}
