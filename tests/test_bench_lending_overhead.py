"""The lending bench: its overhead per lent job on hand-made timestamps (no cluster), and the
burst gap it shares with the impact replay."""

from __future__ import annotations

import pytest

from bench.lending_overhead import LentJob, overhead, overhead_cell


def job(sent: float, lent: float, start: float, end: float, done: float) -> LentJob:
    return LentJob("h", sent_ms=sent, lent_ms=lent, start_ms=start, end_ms=end, done_ms=done)


def test_idle_counts_only_a_free_helper_with_the_job_already_waiting() -> None:
    jobs = [
        # Sent at 0, lent at 40, started at 50: the helper sat free for 50 ms of it.
        job(0, 40, 50, 150, 155),
        # Lent while the first ran, started 2 ms after it ended: 2 ms.
        job(0, 60, 152, 252, 258),
        # Sent after the helper was free again (nothing to do meanwhile), started 10 ms later.
        job(300, 305, 310, 410, 413),
    ]

    doc = overhead(jobs, started_wall_ms=0.0)

    assert doc["idle_per_job_ms"] == pytest.approx((50 + 2 + 10) / 3, abs=0.05)
    assert (doc["to_helper_p50_ms"], doc["to_helper_max_ms"]) == (5.0, 10.0)
    assert (doc["back_p50_ms"], doc["back_max_ms"]) == (5.0, 6.0)
    assert doc["service_p50_ms"] == 100.0
    assert (doc["first_lent_after_ms"], doc["first_start_after_ms"]) == (40.0, 50.0)
    assert overhead_cell(doc) == "21 ms (to 5 / back 5; job 100)"


def test_a_run_without_lent_jobs_shows_a_dash() -> None:
    assert overhead_cell(overhead([], started_wall_ms=0.0)) == "-"


def test_the_bench_spaces_its_runs_by_the_gap_the_impact_replay_splits_bursts_at() -> None:
    from bench.lending_scenarios import BURST_GAP_SECS as bench_gap
    from lending.api.impact import BURST_GAP_SECS

    assert bench_gap == BURST_GAP_SECS


def test_the_optimum_of_a_run_sent_in_two_parts_starts_its_helper_at_the_second() -> None:
    from bench.lending_optimum import partition_optimum
    from bench.lending_scenarios import tail_release_ms
    from bench.lending_support import Answer, Run

    answers = [Answer(200, "A", sent, sent + 500) for sent in (0.0, 0.4, 14.6, 13.8, 15.2)]
    run = Run(0, answers, None)

    assert tail_release_ms(run, 2) == 14.0
    assert tail_release_ms(run, 0) == 0.0
    # Two pinned 100 ms jobs on the owner, three 50 ms jobs lent: 14 + 150 ms, not 150.
    release = tail_release_ms(run, 2)
    split = partition_optimum([100] * 5, [50] * 5, release, [True, True, False, False, False])
    assert split.makespan_ms == 200
    split = partition_optimum([100] * 5, [80] * 5, release, [True, True, False, False, False])
    assert split.makespan_ms == 254
