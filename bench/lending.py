"""Backlog lending on real loopback clusters, scenario by scenario, against the exact optimum.

Clusters of a routing-only master and slaves on simulated backends (``tests.harness``): owners
lend held requests to linked helpers. Each scenario sends the same traffic with the link and,
after unlinking, to the owner alone, and compares both makespans with the exact offline
optimum of the same simulated costs (``bench/lending_optimum.py``). Run ``--list`` for the
scenarios; ``--only NAME[,NAME]`` (names or numbers) runs a subset.

Targets: <= 1.05x the optimum with one helper (no streams, kills or hangs); two helpers
<= 1.10x the optimum of the faster one alone; streams mixed in <= 1.10x; a shallow backlog
that would need a model switch <= 1.05x working alone; a hung helper <= 1.25x working alone;
a helper's own request delayed by at most one borrowed job + 30 ms; a killed helper loses no
request; a helper whose router pauses (0.7 s, 1.2 s) has no request completed twice. Other
figures are reported without a target.

Each linked row also shows the router's own overhead per lent job (bench/lending_overhead.py):
how long the helper's backend sat free while a lent job was already waiting at the owner,
per lent job, with the medians of its two legs (in transit to the helper; the answer's way
back to the owner's client) and of the helper's measured job time (a loaded machine runs the
simulated backends late, which the optimum leaves out).

Prints one table and, last, one JSON line; exits 1 when a target is missed or a scenario
fails to run. Run from the repo root: ``.venv/bin/python bench/lending.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/lending.py`, this file's folder comes first on sys.path, where the
# sibling `queue.py` would shadow the standard library's `queue`.
sys.path[0] = str(Path(__file__).resolve().parent.parent)
# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import json
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import lending_faults as faults
from bench import lending_scenarios as shared
from bench.lending_cluster import Ctx, new_ctx, shared_layout
from bench.lending_report import Result, Row, print_table

REPO = Path(__file__).resolve().parent.parent
PLANNER_TIMEOUT_SECS = 120.0
# One run can land either side of a discrete step (the owner running one job more than the
# split needs): three runs and their median keep a single unlucky one from deciding a row.
DEFAULT_REPEAT = 3


class Env:
    """Where scenarios run: a temporary root, and the shared cluster once one needs it."""

    def __init__(self, root: Path, repeat: int) -> None:
        self.root = root
        self.repeat = repeat
        self._shared: Ctx | None = None

    def shared(self) -> Ctx:
        if self._shared is None:
            self._shared = new_ctx(self.root / "shared", shared_layout(), repeat=self.repeat)
        return self._shared

    def close_shared(self) -> None:
        if self._shared is not None:
            self._shared.ops.cluster.cleanup()
            self._shared = None


def on_shared(run: Callable[[Ctx], Result]) -> Callable[[Env], Result]:
    def wrapped(env: Env) -> Result:
        ctx = env.shared()
        try:
            return run(ctx)
        finally:
            # A scenario that failed half-way must not leave its links to the next one.
            ctx.ops.unlink_all()

    return wrapped


def on_own(run: Callable[[Path], Result], folder: str) -> Callable[[Env], Result]:
    def wrapped(env: Env) -> Result:
        return run(env.root / folder)

    return wrapped


def planner(env: Env) -> Result:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "planner.py")],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=PLANNER_TIMEOUT_SECS,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"bench/planner.py printed no JSON line:\n{proc.stdout}{proc.stderr}")
    doc: dict[str, Any] = json.loads(lines[-1])
    row = Row(
        label=f"planner {doc['nodes']} nodes / {doc['links_per_lane']} links",
        with_link=f"{doc['median_ms']:.2f} ms",
        target=f"<= {doc['target_ms']} ms",
        passed=bool(doc["pass"]),
        decisions=f"max {doc['max_ms']:.2f} ms",
    )
    return Result([row], doc)


@dataclass(frozen=True)
class Scenario:
    number: int
    name: str
    title: str
    cluster: str  # "shared", "own" or "none"
    run: Callable[[Env], Result]


SCENARIOS = [
    Scenario(1, "fast", "helper 4x faster, loaded", "shared", on_shared(shared.s1_fast)),
    Scenario(
        2,
        "switch",
        "helper 4x faster but must load; deep and shallow backlog",
        "shared",
        on_shared(shared.s2_switch),
    ),
    Scenario(3, "slow", "helper 2x slower, loaded", "shared", on_shared(shared.s3_slow)),
    Scenario(
        4, "two_helpers", "two helpers, 100 and 200 ms", "shared", on_shared(shared.s4_two_helpers)
    ),
    Scenario(
        5, "two_owners", "two owners share one helper", "shared", on_shared(shared.s5_two_owners)
    ),
    Scenario(
        6,
        "own_traffic",
        "the helper's own requests mid-burst",
        "shared",
        on_shared(shared.s6_own_traffic),
    ),
    Scenario(7, "streams", "a third of the burst streams", "shared", on_shared(shared.s7_streams)),
    Scenario(8, "sizes", "varying prompt and output sizes", "shared", on_shared(shared.s8_sizes)),
    Scenario(
        9,
        "template",
        "one prompt template, varying output",
        "shared",
        on_shared(shared.s9_template),
    ),
    Scenario(
        10,
        "arrivals",
        "steady arrivals beyond the owner's rate",
        "shared",
        on_shared(shared.s10_arrivals),
    ),
    Scenario(
        11, "killed", "helper SIGKILLed mid-burst", "own", on_own(faults.s11_killed, "killed")
    ),
    Scenario(12, "hung", "helper SIGSTOPped mid-burst", "own", on_own(faults.s12_hung, "hung")),
    Scenario(
        13,
        "image",
        "image lane, and holding for a faster helper on both lanes",
        "shared",
        on_shared(shared.s13_image),
    ),
    Scenario(
        14,
        "defaults",
        "fresh cluster, default settings, no warm-up",
        "own",
        on_own(faults.s14_defaults, "defaults"),
    ),
    Scenario(15, "event", "master's event -> lease latency", "shared", on_shared(shared.s15_event)),
    Scenario(16, "planner", "planner time, 50 nodes / 200 links", "none", planner),
    Scenario(
        17,
        "hiccup",
        "helper router paused 0.7 s / 1.2 s, again and again",
        "own",
        on_own(faults.s17_hiccup, "hiccup"),
    ),
]

# Run order: the shared cluster first, with helper model switches (B -> B3 -> BV -> BT -> B2)
# as rare as possible, then it is stopped before clusters of their own start, so those do not
# compete with its idle nodes for the two cores.
RUN_ORDER = (1, 6, 4, 5, 7, 10, 13, 15, 3, 8, 9, 2, 11, 12, 17, 14, 16)


def select(only: str | None) -> list[Scenario]:
    if not only:
        return list(SCENARIOS)
    by_key: dict[str, Scenario] = {}
    for s in SCENARIOS:
        by_key[s.name] = s
        by_key[str(s.number)] = s
    chosen: list[Scenario] = []
    for key in (k.strip() for k in only.split(",")):
        if key not in by_key:
            names = ", ".join(s.name for s in SCENARIOS)
            raise SystemExit(f"unknown scenario {key!r}; one of: {names}")
        if by_key[key] not in chosen:
            chosen.append(by_key[key])
    return chosen


def failed_result(scenario: Scenario, exc: BaseException) -> Result:
    # A failed start dumps the node's whole output: its first and last lines say what broke.
    lines = [line for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    message = lines[0][:160] + (f" ... {lines[-1][:200]}" if len(lines) > 1 else "")
    row = Row(
        label=f"{scenario.number} {scenario.name}",
        target="runs to the end",
        passed=False,
        decisions=f"error: {message}",
    )
    traceback.print_exception(exc, file=sys.stderr)
    return Result([row], {"error": message})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated scenario names or numbers")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help="runs with the link per shared-cluster scenario; the median is reported",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.list:
        for s in SCENARIOS:
            print(f"{s.number:>2}  {s.name:<12} {s.cluster:<7} {s.title}")
        return 0
    chosen = select(args.only)
    ordered = sorted(chosen, key=lambda s: RUN_ORDER.index(s.number))
    started = time.monotonic()
    results: dict[int, Result] = {}
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-lending-") as tmp:
        env = Env(Path(tmp), args.repeat)
        try:
            for scenario in ordered:
                if scenario.cluster != "shared":
                    env.close_shared()
                t0 = time.monotonic()
                try:
                    results[scenario.number] = scenario.run(env)
                except Exception as exc:
                    results[scenario.number] = failed_result(scenario, exc)
                timings[scenario.name] = round(time.monotonic() - t0, 1)
                print(
                    f"[bench lending] {scenario.number} {scenario.name}: "
                    f"{timings[scenario.name]} s",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            env.close_shared()
    rows = [row for number in sorted(results) for row in results[number].rows]
    print_table(rows)
    passed = all(row.passed is not False for row in rows)
    doc = {
        "bench": "lending",
        "scenarios": {
            f"{s.number}_{s.name}": results[s.number].detail
            for s in sorted(chosen, key=lambda s: s.number)
        },
        "checks": {row.label: row.passed for row in rows if row.passed is not None},
        "scenario_secs": timings,
        "elapsed_secs": round(time.monotonic() - started, 1),
        "pass": passed,
    }
    print(json.dumps(doc, default=str))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
