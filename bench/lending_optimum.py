"""Exact offline optima for the lending benchmark: the best any scheduler could have done.

Every function here is pure and knows the whole job set in advance. The shared model:

* a job runs on one machine, start to finish, never preempted and never split;
* the owner runs jobs back to back at its per-job time; it needs no load;
* a helper pays its switch (model load, plus the restore of whatever it displaced when that is
  part of the price) once, before its first job, and nothing if it gets no job at all; a
  helper's first job cannot start before that job's release, so the switch starts at the
  earliest when the job exists;
* the owner's first ``depth`` jobs (in arrival order) are already in its backend and cannot
  move, and streams can never leave the owner;
* no network, router or relay overhead anywhere: the optimum is what the simulated backends
  alone would need.

Each function names its objective (makespan: release of the first job to the end of the
last; or mean latency: completion minus release, averaged). Self-checks at import compare
them with values worked out by hand, so a broken optimum can never report a flattering ratio.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ArrivalOptimum",
    "HelperSpec",
    "Split",
    "arrivals_optimum",
    "identical_optimum",
    "own_traffic_optimum",
    "partition_optimum",
    "shared_helper_optimum",
]


@dataclass(frozen=True)
class HelperSpec:
    """One helper machine: its time per job and its one-time switch before the first job."""

    job_ms: float
    switch_ms: float = 0.0


@dataclass(frozen=True)
class Split:
    """An optimal assignment: its makespan and how many jobs each machine ran."""

    makespan_ms: float
    owner_jobs: int
    helper_jobs: tuple[int, ...]


def _helper_finish(helper: HelperSpec, jobs: int) -> float:
    return 0.0 if jobs == 0 else helper.switch_ms + helper.job_ms * jobs


def identical_optimum(
    n: int, owner_ms: float, helpers: Sequence[HelperSpec], *, owner_min: int = 0
) -> Split:
    """Minimum makespan of ``n`` identical jobs released together at time 0.

    The owner must run at least ``owner_min`` of them (its pinned backend jobs, and every
    stream); each helper pays its switch once if it runs any. Exhaustive over every split, so
    exact for any number of helpers (O(n^helpers), small here).
    """
    if n < 0 or owner_min < 0:
        raise ValueError("job counts must not be negative")
    owner_min = min(owner_min, n)
    movable = n - owner_min
    best = Split(owner_ms * n, n, (0,) * len(helpers))
    for counts in itertools.product(range(movable + 1), repeat=len(helpers)):
        lent = sum(counts)
        if lent > movable:
            continue
        span = max(
            [owner_ms * (n - lent)]
            + [_helper_finish(h, k) for h, k in zip(helpers, counts, strict=True)]
        )
        if span < best.makespan_ms:
            best = Split(span, n - lent, tuple(counts))
    return best


def shared_helper_optimum(
    owners: Sequence[tuple[int, float]], helper: HelperSpec, *, owner_min: int = 0
) -> Split:
    """Minimum makespan when several owners, each with ``(n, per-job ms)`` released at 0,
    share one helper: the helper runs every job it takes from any owner back to back (one
    switch in total), and each owner keeps at least ``owner_min`` of its own jobs.

    ``owner_jobs`` of the result is the sum over owners; ``helper_jobs`` is per owner.
    """
    ranges = [range(max(0, n - min(owner_min, n)) + 1) for n, _ in owners]
    best: Split | None = None
    for counts in itertools.product(*ranges):
        span = max(
            [ms * (n - k) for (n, ms), k in zip(owners, counts, strict=True)]
            + [_helper_finish(helper, sum(counts))]
        )
        if best is None or span < best.makespan_ms:
            best = Split(span, sum(n for n, _ in owners) - sum(counts), tuple(counts))
    assert best is not None
    return best


def own_traffic_optimum(
    n: int,
    owner_ms: float,
    helper: HelperSpec,
    own_releases_ms: Sequence[float],
    *,
    owner_min: int = 0,
) -> Split:
    """Minimum makespan of all the work when the helper must also run requests of its own.

    ``n`` identical owner jobs are released at 0; the helper additionally runs one own job
    (its ``job_ms`` long) per entry of ``own_releases_ms``, each released at that time. The
    makespan covers both the owner's burst and the helper's own jobs. On one machine with
    release dates, running jobs in release order as early as possible minimises the finish:
    it is the largest of (release of job j + the work released at or after it), with the lent
    jobs released at 0.
    """
    releases = sorted(own_releases_ms)
    best: Split | None = None
    for k in range(0, n - min(owner_min, n) + 1):
        # The lent jobs form one block, available once the switch is done.
        work = [(helper.switch_ms, k * helper.job_ms)] if k else []
        work = sorted(work + [(r, helper.job_ms) for r in releases])
        finish = 0.0
        for i, (release, _) in enumerate(work):
            finish = max(finish, release + sum(ms for _, ms in work[i:]))
        span = max(owner_ms * (n - k), finish)
        if best is None or span < best.makespan_ms:
            best = Split(span, n - k, (k,))
    assert best is not None
    return best


# Beyond this many movable jobs the subset search would take too long; whole-millisecond times
# use the dynamic programme instead, which has no such limit.
MAX_BRUTE_FORCE_JOBS = 18


def partition_optimum(
    owner_ms: Sequence[float], helper_ms: Sequence[float], switch_ms: float, pinned: Sequence[bool]
) -> Split:
    """Minimum makespan of jobs of different sizes, all released at 0, on the owner and one
    helper (two unrelated machines: job j takes ``owner_ms[j]`` on the owner and
    ``helper_ms[j]`` on the helper; ``pinned[j]`` keeps it on the owner). Order on a machine
    does not change its finish, so this is the best two-way partition.

    Exact either way: a dynamic programme over the owner's load when every time is a whole
    number of milliseconds (for each reachable owner load, the least helper load), otherwise
    a search over every subset of the movable jobs.
    """
    if not (len(owner_ms) == len(helper_ms) == len(pinned)):
        raise ValueError("one owner time, helper time and pinned flag per job")
    if all(float(t).is_integer() for t in (*owner_ms, *helper_ms, switch_ms)):
        return _partition_dp(
            [int(t) for t in owner_ms], [int(t) for t in helper_ms], int(switch_ms), pinned
        )
    return _partition_search(owner_ms, helper_ms, switch_ms, pinned)


def _partition_dp(
    owner_ms: Sequence[int], helper_ms: Sequence[int], switch_ms: int, pinned: Sequence[bool]
) -> Split:
    # owner load -> (least helper load, helper jobs at that load)
    front: dict[int, tuple[int, int]] = {0: (0, 0)}
    for a, b, stay in zip(owner_ms, helper_ms, pinned, strict=True):
        nxt: dict[int, tuple[int, int]] = {}
        for load, (helper_load, count) in front.items():
            options = [(load + a, helper_load, count)]
            if not stay:
                options.append((load, helper_load + b, count + 1))
            for key, hl, hc in options:
                seen = nxt.get(key)
                if seen is None or hl < seen[0]:
                    nxt[key] = (hl, hc)
        front = nxt
    best: Split | None = None
    for load, (helper_load, count) in front.items():
        span = max(load, helper_load + (switch_ms if count else 0))
        if best is None or span < best.makespan_ms:
            best = Split(float(span), len(owner_ms) - count, (count,))
    assert best is not None
    return best


def _partition_search(
    owner_ms: Sequence[float], helper_ms: Sequence[float], switch_ms: float, pinned: Sequence[bool]
) -> Split:
    movable = [j for j, stay in enumerate(pinned) if not stay]
    if len(movable) > MAX_BRUTE_FORCE_JOBS:
        raise ValueError(f"{len(movable)} movable jobs with fractional times: too many to search")
    kept = sum(t for t, stay in zip(owner_ms, pinned, strict=True) if stay)
    best: Split | None = None
    for mask in range(1 << len(movable)):
        lent = [movable[i] for i in range(len(movable)) if mask >> i & 1]
        owner = kept + sum(owner_ms[j] for j in movable if j not in lent)
        helper = sum(helper_ms[j] for j in lent) + (switch_ms if lent else 0.0)
        span = max(owner, helper)
        if best is None or span < best.makespan_ms:
            best = Split(span, len(owner_ms) - len(lent), (len(lent),))
    assert best is not None
    return best


@dataclass(frozen=True)
class ArrivalOptimum:
    """Separate optima of one arrival pattern: the best makespan and the best mean latency
    (each may come from a different schedule)."""

    makespan_ms: float
    mean_latency_ms: float


def _arrival_dp(
    releases: Sequence[float],
    owner_ms: float,
    helper: HelperSpec,
    owner_first: int,
    *,
    latency: bool,
) -> float:
    # State after the first j jobs: (owner free at, helper free at or -inf when unused, cost);
    # cost is the latest completion (makespan) or the sum of latencies. A state that is no
    # better in any coordinate than another is dropped: it can never lead to a better end.
    states: list[tuple[float, float, float]] = [(0.0, -math.inf, 0.0)]
    for j, release in enumerate(releases):
        nxt: list[tuple[float, float, float]] = []
        for owner_free, helper_free, cost in states:
            done = max(owner_free, release) + owner_ms
            nxt.append((done, helper_free, _cost(cost, done, release, latency)))
            if j >= owner_first:
                if helper_free == -math.inf:
                    start = release + helper.switch_ms
                else:
                    start = max(helper_free, release)
                done = start + helper.job_ms
                nxt.append((owner_free, done, _cost(cost, done, release, latency)))
        states = _pareto(nxt)
    best = min(cost for _, _, cost in states)
    return best / len(releases) if latency else best


def _cost(cost: float, done: float, release: float, latency: bool) -> float:
    return cost + (done - release) if latency else max(cost, done)


def _pareto(states: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    kept: list[tuple[float, float, float]] = []
    for state in sorted(set(states)):
        if not any(k[0] <= state[0] and k[1] <= state[1] and k[2] <= state[2] for k in kept):
            kept.append(state)
    return kept


def arrivals_optimum(
    releases_ms: Sequence[float], owner_ms: float, helper: HelperSpec, *, owner_first: int = 0
) -> ArrivalOptimum:
    """Optimal offline schedules of identical jobs released at ``releases_ms`` (ms after the
    first send) on the owner and one helper; the first ``owner_first`` jobs stay on the owner.

    With identical jobs, each machine may run its share in release order as early as possible
    without loss (an exchange argument, for both objectives), so a dynamic programme that
    assigns jobs in release order, keeping every non-dominated (owner free, helper free, cost)
    state, is exact. The makespan is measured from time 0 (the first release).
    """
    releases = sorted(releases_ms)
    if not releases:
        return ArrivalOptimum(0.0, 0.0)
    return ArrivalOptimum(
        makespan_ms=_arrival_dp(releases, owner_ms, helper, owner_first, latency=False),
        mean_latency_ms=_arrival_dp(releases, owner_ms, helper, owner_first, latency=True),
    )


def _self_check() -> None:
    """Values worked out by hand; a wrong optimum would make every ratio meaningless."""
    fast = HelperSpec(100)
    # 24 x 400 ms vs 100 ms: 5 on the owner (2000), 19 on the helper (1900).
    assert identical_optimum(24, 400, [fast]).makespan_ms == 2000
    # A 2 s switch: 12 on the owner (4800), 30 on the helper (2000 + 3000 = 5000); 29 gives 5200.
    assert identical_optimum(42, 400, [HelperSpec(100, 2000)], owner_min=2).makespan_ms == 5000
    # 4 jobs, 2 pinned: lending even one costs 2100 > 1600 alone.
    shallow = identical_optimum(4, 400, [HelperSpec(100, 2000)], owner_min=2)
    assert (shallow.makespan_ms, shallow.helper_jobs) == (1600, (0,))
    # Two helpers: 3 on the owner (1200), 14 at 100 ms (1400), 7 at 200 ms (1400) = 24.
    assert identical_optimum(24, 400, [fast, HelperSpec(200)]).makespan_ms == 1400
    # Streams pinned: 8 must stay on a 400 ms owner.
    assert identical_optimum(24, 400, [fast], owner_min=8).makespan_ms == 3200
    # Two owners of 24 x 400 ms and one 100 ms helper: 8 + 8 kept (3200), 32 lent (3200).
    assert shared_helper_optimum([(24, 400), (24, 400)], fast).makespan_ms == 3200
    # Own jobs at 0 and 250 on the helper: k = 16 gives owner 3200, helper 1800.
    assert own_traffic_optimum(20, 400, fast, [0, 250]).makespan_ms == 1800
    # Own job released at 5000: the helper cannot finish before 5100 whatever it lends.
    assert own_traffic_optimum(4, 400, fast, [5000]).makespan_ms == 5100
    # Sizes 3,3,2,2,2 on equal machines: 6 | 6. Pinning job 0 changes nothing.
    sizes = [3, 3, 2, 2, 2]
    assert partition_optimum(sizes, sizes, 0, [False] * 5).makespan_ms == 6
    assert partition_optimum(sizes, sizes, 0, [True] + [False] * 4).makespan_ms == 6
    # A faster helper (2,2,1,1,1) with a switch of 1: owner {3, 2} = 5 against helper
    # 1 + 2+1+1 = 5; every owner load of 4 or less leaves the helper 6.
    assert partition_optimum(sizes, [2, 2, 1, 1, 1], 1, [False] * 5).makespan_ms == 5
    # Every time halved is fractional, takes the subset search, and must halve the answer.
    halves = [t / 2 for t in sizes]
    assert partition_optimum(halves, [1, 1, 0.5, 0.5, 0.5], 0.5, [False] * 5).makespan_ms == 2.5
    # Releases 0, 5, 10; owner 10, helper 20; job 0 pinned. Best makespan 25 (j1 on the
    # helper 5-25, j2 on the owner 10-20); best mean latency (10 + 20 + 10) / 3.
    arrivals = arrivals_optimum([0, 5, 10], 10, HelperSpec(20), owner_first=1)
    assert arrivals.makespan_ms == 25
    assert math.isclose(arrivals.mean_latency_ms, 40 / 3)
    # A switch delays the helper's first job from its release: owner alone is better.
    assert arrivals_optimum([0, 0], 10, HelperSpec(1, 30)).makespan_ms == 20


_self_check()
