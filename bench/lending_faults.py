"""Scenarios on clusters of their own: a helper killed, hung or hiccuping mid-burst, and a fresh
cluster at default lending settings. Each starts a master, an owner o (A, 400 ms) and a loaded
helper h (B, 100 ms), and always cleans up, a stopped helper included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.chaos_logs import CompletionLog
from bench.lending_cluster import (
    FAST_MS,
    OWNER_MS,
    UNIFORM_WARMUP,
    Ctx,
    new_ctx,
    pair_layout,
    plain,
)
from bench.lending_optimum import HelperSpec, identical_optimum
from bench.lending_report import Result, Row, ratio_row
from bench.lending_scenarios import check, optimum_row, plain_jobs, run_detail
from bench.lending_support import (
    TEXT,
    Job,
    Run,
    Target,
    compact_decisions,
    dispatch_timeline,
    lent_rows,
    run_jobs,
    run_sync,
    signal_tree,
    summarize_decisions,
    until_lent,
)

FAULT_N = 24
HUNG_LIMIT = 1.25
LENT_WAIT_SECS = 10.0
# The fault strikes once this share of the optimum's makespan has passed and a request is out
# at the helper: mid-burst, with lent work both finished and in flight.
FAULT_AT_SHARE = 0.4
DEFAULTS_N = 30
HICCUP_N = 72
# The router of the helper pauses for each of these, well under the master's health_timeout
# (3 s): slow, not gone. The issue measured 2 and 3 of 72 completed twice at these.
HICCUP_PAUSES_SECS = (0.7, 1.2)
HICCUP_GAP_SECS = 0.5


def _prepared(root: Path, *, tuned: bool = True, warm: bool = True) -> Ctx:
    ctx = new_ctx(root, pair_layout(), tuned=tuned)
    try:
        ctx.ops.load("A")
        ctx.ops.load("B")
        if warm:
            ctx.warm("o", "A", [plain("A")] * UNIFORM_WARMUP)
            ctx.warm("h", "B", [plain("B")] * UNIFORM_WARMUP)
    except BaseException:
        ctx.ops.cluster.cleanup()
        raise
    return ctx


def _all_answered(run: Run, n: int) -> tuple[bool, list[str]]:
    """Every request answered once, with a 200 under the owner's model."""
    problems = run.problems("A")
    return len(run.answers) == n and not problems, problems


# -- 11. helper killed mid-burst ------------------------------------------------------------------


def s11_killed(root: Path) -> Result:
    ctx = _prepared(root)
    ops = ctx.ops
    try:
        depth = ctx.depth
        optimum = identical_optimum(FAULT_N, OWNER_MS, [HelperSpec(FAST_MS)], owner_min=depth)
        fault_after_ms = FAULT_AT_SHARE * optimum.makespan_ms
        alone_run = run_sync(ops.node("o"), plain_jobs("A", FAULT_N))
        check(alone_run.answers, "A", "11 alone")
        ops.link(TEXT, "o", "A", [Target("h", "B")])
        helper = ops.node("h")
        owner = ops.node("o")

        async def kill(t0: float, done: asyncio.Event) -> dict[str, Any]:
            lent = await until_lent(
                owner, done, t0=t0, after_ms=fault_after_ms, timeout_secs=LENT_WAIT_SECS
            )
            at_ms = (time.perf_counter() - t0) * 1000.0
            # The whole process group at once, as a crash would; its wait must not block
            # the loop that is collecting the owner's answers.
            await asyncio.to_thread(helper.kill)
            return {"lent_before_kill": lent, "killed_at_ms": round(at_ms, 1)}

        run = asyncio.run(run_jobs(owner, plain_jobs("A", FAULT_N), during=kill))
        rows = ops.settled_decisions(run.started_wall_ms)
    finally:
        ops.cluster.cleanup()
    ok, problems = _all_answered(run, FAULT_N)
    summary = summarize_decisions(rows, "o")
    row = ratio_row(
        "11 helper killed mid-burst",
        with_ms=run.makespan_ms,
        alone_ms=alone_run.makespan_ms,
        optimum_ms=optimum.makespan_ms,
        basis="alone",
        limit=None,
        lent=int(summary["lent"]),
        decisions=compact_decisions(summary),
    )
    row.target = f"all {FAULT_N} answered once ({len(run.answers)} answers)"
    row.passed = ok
    detail = run_detail(run, alone_run, optimum, summary)
    detail.update(
        {
            "fault": run.side,
            "problems": problems,
            "timeline": dispatch_timeline(rows, run.started_wall_ms, {"o", "master"}),
        }
    )
    return Result([row], detail)


# -- 12. helper hung mid-burst --------------------------------------------------------------------


def s12_hung(root: Path) -> Result:
    ctx = _prepared(root)
    ops = ctx.ops
    stopped: list[int] = []
    try:
        depth = ctx.depth
        optimum = identical_optimum(FAULT_N, OWNER_MS, [HelperSpec(FAST_MS)], owner_min=depth)
        fault_after_ms = FAULT_AT_SHARE * optimum.makespan_ms
        alone_run = run_sync(ops.node("o"), plain_jobs("A", FAULT_N))
        check(alone_run.answers, "A", "12 alone")
        ops.link(TEXT, "o", "A", [Target("h", "B")])
        helper = ops.node("h")
        owner = ops.node("o")

        async def hang(t0: float, done: asyncio.Event) -> dict[str, Any]:
            lent = await until_lent(
                owner, done, t0=t0, after_ms=fault_after_ms, timeout_secs=LENT_WAIT_SECS
            )
            at_ms = (time.perf_counter() - t0) * 1000.0
            stopped.extend(signal_tree(helper.proc.pid, signal.SIGSTOP))
            return {"lent_before_stop": lent, "stopped_at_ms": round(at_ms, 1), "pids": stopped}

        try:
            run = asyncio.run(run_jobs(owner, plain_jobs("A", FAULT_N), during=hang))
        finally:
            # A stopped helper would keep its backends stopped through the cleanup's kill.
            signal_tree(helper.proc.pid, signal.SIGCONT)
        rows = ops.settled_decisions(run.started_wall_ms)
    finally:
        ops.cluster.cleanup()
    ok, problems = _all_answered(run, FAULT_N)
    summary = summarize_decisions(rows, "o")
    row = ratio_row(
        "12 helper hung mid-burst",
        with_ms=run.makespan_ms,
        alone_ms=alone_run.makespan_ms,
        optimum_ms=optimum.makespan_ms,
        basis="alone",
        limit=HUNG_LIMIT,
        lent=int(summary["lent"]),
        decisions=compact_decisions(summary),
    )
    if not ok:
        row.passed = False
        row.target += f", all answered ({len(problems)} problems)"
    detail = run_detail(run, alone_run, optimum, summary)
    detail.update(
        {
            "fault": run.side,
            "problems": problems,
            "timeline": dispatch_timeline(rows, run.started_wall_ms, {"o", "master"}),
        }
    )
    return Result([row], detail)


# -- 14. fresh cluster, default settings ----------------------------------------------------------


def s14_defaults(root: Path) -> Result:
    ctx = _prepared(root, tuned=False, warm=False)
    ops = ctx.ops
    try:
        settings = {
            key: ops.setting(key)
            for key in (
                "scheduling_min_samples",
                "scheduling_refresh_interval",
                "offload_probe_idle",
            )
        }
        ops.link(TEXT, "o", "A", [Target("h", "B")])
        jobs = plain_jobs("A", DEFAULTS_N)
        run = run_sync(ops.node("o"), jobs)
        check(run.answers, "A", "14 with link")
        rows = ops.settled_decisions(run.started_wall_ms)
        ops.unlink(TEXT, "o", "A")
        alone_run = run_sync(ops.node("o"), jobs)
        check(alone_run.answers, "A", "14 alone")
        depth = ctx.depth
    finally:
        ops.cluster.cleanup()
    lent = lent_rows(rows, {"o"})
    first_lent_ms = min(int(r["recorded_at"]) for r in lent) - run.started_wall_ms if lent else None
    summary = summarize_decisions(rows, "o")
    optimum = identical_optimum(DEFAULTS_N, OWNER_MS, [HelperSpec(FAST_MS)], owner_min=depth)
    ratio = optimum_row("14 defaults, no warm-up", run.makespan_ms, alone_run, optimum, summary)
    first = Row(
        label="14 defaults: first request -> first lent",
        with_link="never" if first_lent_ms is None else f"{first_lent_ms} ms",
        lent=str(len(lent)),
        decisions=", ".join(f"{k}={v}" for k, v in settings.items()),
    )
    detail = run_detail(run, alone_run, optimum, summary)
    detail.update({"first_lent_after_ms": first_lent_ms, "settings": settings})
    return Result([ratio, first], detail)


# -- 17. helper router hiccups mid-burst ------------------------------------------------------


def _users_jobs(tag: str, n: int) -> tuple[list[str], list[Job]]:
    """`n` plain requests to A, each naming its own OpenAI `user`: the simulated backend logs
    every one it completes under that name, so a request that ran on both nodes shows."""
    users = [f"hiccup-{tag}-{i:03d}" for i in range(n)]
    jobs = []
    for user in users:
        doc = json.loads(plain("A"))
        doc["user"] = user
        jobs.append(Job(json.dumps(doc).encode()))
    return users, jobs


def _hiccups(owner: Any, helper: Any, pause_secs: float) -> Any:
    async def side(t0: float, done: asyncio.Event) -> dict[str, Any]:
        pauses = 0
        while not done.is_set():
            lent = await until_lent(owner, done, t0=t0, after_ms=0, timeout_secs=LENT_WAIT_SECS)
            if not lent:
                break
            # The router alone (its process group): the backends run in sessions of their own.
            os.killpg(helper.proc.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(pause_secs)  # the fault itself: a pause this long
            finally:
                os.killpg(helper.proc.pid, signal.SIGCONT)
            pauses += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), HICCUP_GAP_SECS)
        return {"pauses": pauses}

    return side


def s17_hiccup(root: Path) -> Result:
    ctx = _prepared(root)
    ops = ctx.ops
    rows: list[Row] = []
    detail: dict[str, Any] = {}
    try:
        ops.link(TEXT, "o", "A", [Target("h", "B")])
        owner, helper = ops.node("o"), ops.node("h")
        for pause in HICCUP_PAUSES_SECS:
            users, jobs = _users_jobs(f"{pause:g}", HICCUP_N)
            try:
                run = asyncio.run(run_jobs(owner, jobs, during=_hiccups(owner, helper, pause)))
            finally:
                os.killpg(helper.proc.pid, signal.SIGCONT)
            log = CompletionLog(root)
            log.poll()
            twice = [u for u in users if log.runs[u] > 1]
            unran = [u for u in users if log.runs[u] == 0]
            on_helper = sum(1 for u in users for node, _ in log.where.get(u, []) if node == "h")
            ok, problems = _all_answered(run, HICCUP_N)
            label = f"17 helper router pauses {pause:g} s"
            rows.append(
                Row(
                    label=label,
                    with_link=f"{run.makespan_ms:.0f} ms",
                    lent=str(on_helper),
                    target=f"0 of {HICCUP_N} completed twice",
                    passed=ok and not twice and not unran,
                    decisions=(
                        f"twice={len(twice)} unran={len(unran)} pauses={run.side['pauses']}"
                        f" ran_on_helper={on_helper}"
                    ),
                )
            )
            detail[f"{pause:g}s"] = {
                "completed_twice": twice,
                "unran": unran,
                "ran_on_helper": on_helper,
                "pauses": run.side["pauses"],
                "makespan_ms": round(run.makespan_ms),
                "problems": problems,
            }
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ops.node("h").proc.pid, signal.SIGCONT)
        ops.cluster.cleanup()
    return Result(rows, detail)
