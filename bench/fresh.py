"""Fresh clusters at DEFAULT lending settings: when the first lend comes and what the first
burst costs, without and with `manage.py benchmark_models` run on each node after install.

Each variant starts its own cluster (``tests.harness``): a routing-only master, an owner o
whose model A is slow and a helper h whose model B is four times faster, both loaded, A
linked to lend to B, and no `scheduling_*` or `offload_*` setting changed. "calibrated" first
runs `manage.py benchmark_models` on o and on h (their own configs, as an operator would after
install) and waits until both publish a fit. Then one burst of same-size chat requests goes to
o, and the same burst again after unlinking (the owner alone). Reported: the time from the
burst's first request to the first `lent` decision row and to the master's first priced grant,
the makespan against the exact optimum of the same simulated costs
(``bench/lending_optimum.py``), and how long the calibration took.

The models' costs scale with prompt and answer sizes (``--layout sized``, the default), as a
real model's do; ``--layout fixed`` gives every request the same cost whatever its size, the
layout of ``bench/lending.py``'s scenario 14.

Prints one table and, last, one JSON line. Run: ``.venv/bin/python -m bench.fresh``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.lending_cluster import (
    FAST_MS,
    OWNER_MS,
    TEXT_BYTES,
    TEXT_MAX_TOKENS,
    Ctx,
    TextCost,
    fixed_text,
    new_ctx,
    sized_text,
)
from bench.lending_optimum import HelperSpec, identical_optimum
from bench.lending_report import Row, print_table
from bench.lending_scenarios import check, optimum_row, plain_jobs, run_detail
from bench.lending_support import (
    TEXT,
    Target,
    fit_brief,
    fit_row,
    lent_rows,
    run_sync,
    runtime_status,
    summarize_decisions,
    wait_until,
)
from tests.harness import ModelSpec, RouterNode

REPO = Path(__file__).resolve().parent.parent
BURST_N = 30
# Prompt tokens of one burst request: the simulated backend counts ceil(body bytes / 4).
BURST_PROMPT_TOKENS = -(-TEXT_BYTES // 4)
CALIBRATE_TIMEOUT_SECS = 600.0
FIT_PUBLISH_TIMEOUT_SECS = 30.0
SETTINGS = ("scheduling_min_samples", "scheduling_refresh_interval", "offload_probe_idle")


def _sized(base_ms: float, job_ms: float) -> TextCost:
    """Costs that scale with the work and come to `job_ms` for one burst request: the rest of
    the job after `base_ms` split evenly between prompt and answer."""
    share = (job_ms - base_ms) / 2.0
    return TextCost(base_ms, share / BURST_PROMPT_TOKENS, share / TEXT_MAX_TOKENS)


def layout(kind: str) -> dict[str, list[ModelSpec]]:
    if kind == "fixed":
        return {"o": [fixed_text("A", OWNER_MS)], "h": [fixed_text("B", FAST_MS)]}
    return {
        "o": [sized_text("A", _sized(OWNER_MS / 2, OWNER_MS))],
        "h": [sized_text("B", _sized(FAST_MS / 2, FAST_MS))],
    }


def _benchmark(node: RouterNode, model: str) -> subprocess.Popen[str]:
    argv = ["manage.py", "benchmark_models", "--config", str(node.config_path), "--models", model]
    return subprocess.Popen(
        [sys.executable, *argv],
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def calibrate(ctx: Ctx) -> dict[str, Any]:
    """`benchmark_models` on o and h at once (each node calibrates its own model), then the
    wait until both nodes publish the fit the master prices with."""
    started = time.monotonic()
    procs = {"o": _benchmark(ctx.ops.node("o"), "A"), "h": _benchmark(ctx.ops.node("h"), "B")}
    outputs = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=CALIBRATE_TIMEOUT_SECS)
        outputs[name] = out
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark_models on {name} exited {proc.returncode}:\n{out}")
    command_secs = time.monotonic() - started

    def published() -> dict[str, Any] | None:
        fits = {
            f"{model}@{name}": fit_row(runtime_status(ctx.ops.node(name)), model, "llm")
            for name, model in (("o", "A"), ("h", "B"))
        }
        return fits if all(fits.values()) else None

    fits = wait_until(published, timeout_secs=FIT_PUBLISH_TIMEOUT_SECS, what="fits published")
    return {
        "command_secs": round(command_secs, 1),
        "until_published_secs": round(time.monotonic() - started, 1),
        "fits": {key: fit_brief(row) for key, row in fits.items()},
        "output": {name: out.strip().splitlines() for name, out in outputs.items()},
    }


def _first_ms(rows: Sequence[Mapping[str, Any]], started_ms: int) -> int | None:
    return min(int(r["recorded_at"]) for r in rows) - started_ms if rows else None


def variant(root: Path, kind: str, calibrated: bool) -> tuple[list[Row], dict[str, Any]]:
    ctx = new_ctx(root, layout(kind), tuned=False)
    ops = ctx.ops
    try:
        calibration = calibrate(ctx) if calibrated else None
        ops.load("A")
        ops.load("B")
        settings = {key: ops.setting(key) for key in SETTINGS}
        ops.link(TEXT, "o", "A", [Target("h", "B")])
        jobs = plain_jobs("A", BURST_N)
        run = run_sync(ops.node("o"), jobs)
        check(run.answers, "A", f"{kind} with link")
        rows = ops.settled_decisions(run.started_wall_ms)
        ops.unlink(TEXT, "o", "A")
        alone_run = run_sync(ops.node("o"), jobs)
        check(alone_run.answers, "A", f"{kind} alone")
        depth = ctx.depth
    finally:
        ops.cluster.cleanup()
    name = "calibrated" if calibrated else "fresh"
    lent = lent_rows(rows, {"o"})
    granted = [r for r in rows if r.get("kind") == "plan" and r.get("outcome") == "granted"]
    first_lent_ms = _first_ms(lent, run.started_wall_ms)
    first_grant_ms = _first_ms(granted, run.started_wall_ms)
    summary = summarize_decisions(rows, "o")
    optimum = identical_optimum(BURST_N, OWNER_MS, [HelperSpec(FAST_MS)], owner_min=depth)
    ratio = optimum_row(
        f"{kind} {name}: burst of {BURST_N}", run.makespan_ms, alone_run, optimum, summary
    )
    first = Row(
        label=f"{kind} {name}: first request -> first lent / first priced grant",
        with_link=f"{_ms(first_lent_ms)} / {_ms(first_grant_ms)}",
        lent=str(len(lent)),
        decisions=", ".join(f"{k}={v}" for k, v in settings.items()),
    )
    detail = run_detail(run, alone_run, optimum, summary)
    detail.update(
        {
            "first_lent_after_ms": first_lent_ms,
            "first_granted_after_ms": first_grant_ms,
            "ratio_to_optimum": round(run.makespan_ms / optimum.makespan_ms, 3),
            "settings": settings,
            "calibration": calibration,
        }
    )
    return [ratio, first], detail


def _ms(value: int | None) -> str:
    return "never" if value is None else f"{value} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("sized", "fixed"), default="sized")
    parser.add_argument(
        "--only", choices=("fresh", "calibrated"), help="run one variant (default both)"
    )
    args = parser.parse_args()
    wanted = [v for v in ("fresh", "calibrated") if args.only in (None, v)]
    started = time.monotonic()
    rows: list[Row] = []
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fresh-") as tmp:
        for name in wanted:
            t0 = time.monotonic()
            found, detail = variant(Path(tmp) / name, args.layout, name == "calibrated")
            rows += found
            details[name] = {**detail, "secs": round(time.monotonic() - t0, 1)}
            print(f"[bench fresh] {name}: {details[name]['secs']} s", file=sys.stderr, flush=True)
    print_table(rows)
    doc = {
        "bench": "fresh",
        "layout": args.layout,
        "n": BURST_N,
        "owner_ms": OWNER_MS,
        "helper_ms": FAST_MS,
        "variants": details,
        "elapsed_secs": round(time.monotonic() - started, 1),
    }
    print(json.dumps(doc, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
