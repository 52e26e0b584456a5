"""Per-key limits on the fake clock: the sliding minute by the second, tokens reserved then
charged, requests in flight, the other nodes' sums, forgetting revoked keys, the wire form."""

from __future__ import annotations

import pytest

from access.keys import KeyRecord, KeyTable, secret_hash
from access.limits import (
    CONCURRENT,
    MAX_WIRE_KEYS,
    REQUESTS,
    STALE_SECS,
    TOKENS,
    WINDOW_SECS,
    Ledger,
    Limiter,
    Limits,
    add_counts,
    counts_from_wire,
    counts_to_wire,
)


class FakeClock:
    def __init__(self, now: float = 10.5) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def limiter(now: float = 10.5) -> tuple[Limiter, FakeClock]:
    clock = FakeClock(now)
    return Limiter(clock), clock


def table(*names: str) -> KeyTable:
    return KeyTable(KeyRecord(name=n, key_hash=secret_hash(f"rk-{n}"), rpm=10) for n in names)


def test_rpm_admits_the_limit_then_refuses_with_the_seconds_until_the_oldest_leaves() -> None:
    lim, _ = limiter(10.5)
    limits = Limits(rpm=3)
    remaining = [lim.admit("k", limits, 0).remaining_requests for _ in range(3)]
    assert remaining == [2, 1, 0]
    refused = lim.admit("k", limits, 0)
    assert not refused.admitted
    assert refused.refused_by == REQUESTS
    assert refused.remaining_requests == 0
    # Second 10 leaves the window at 10 + 60 + 1 = 71: 60.5 s from 10.5, rounded up.
    assert refused.retry_after_secs == 61
    assert refused.ticket is None


def test_a_request_counts_for_at_least_a_minute_and_leaves_at_the_next_second() -> None:
    lim, clock = limiter(10.9)
    assert lim.admit("k", Limits(rpm=1), 0).admitted
    clock.now = 10.9 + WINDOW_SECS  # exactly a minute later: still in the window
    assert not lim.admit("k", Limits(rpm=1), 0).admitted
    clock.now = 70.99
    assert not lim.admit("k", Limits(rpm=1), 0).admitted
    clock.now = 71.0
    assert lim.admit("k", Limits(rpm=1), 0).admitted


def test_refused_requests_are_not_counted() -> None:
    lim, clock = limiter(0.0)
    assert lim.admit("k", Limits(rpm=1), 0).admitted
    for _ in range(5):
        assert not lim.admit("k", Limits(rpm=1), 0).admitted
    clock.now = 61.0
    assert lim.admit("k", Limits(rpm=1), 0).admitted
    assert lim.report()["k"][0] == 1


def test_retry_after_covers_just_the_excess_of_this_nodes_own_counts() -> None:
    lim, clock = limiter(0.2)
    limits = Limits(rpm=3)
    lim.admit("k", limits, 0)  # second 0
    clock.now = 5.2
    lim.admit("k", limits, 0)  # second 5
    lim.admit("k", limits, 0)
    clock.now = 20.0
    refused = lim.admit("k", limits, 0)
    # One request must go: the one of second 0, gone at 61.
    assert refused.retry_after_secs == 41
    # Two counted elsewhere as well: three must go, the last of them at 5 + 61 = 66.
    lim.take_remote({"k": (2, 0, 0)})
    assert lim.admit("k", limits, 0).retry_after_secs == 46


def test_tpm_reserves_the_estimate_and_admits_up_to_the_limit_exactly() -> None:
    lim, _ = limiter()
    limits = Limits(tpm=100)
    first = lim.admit("k", limits, 40)
    second = lim.admit("k", limits, 20)
    third = lim.admit("k", limits, 40)  # 60 + 40 = 100: still within
    assert [first.remaining_tokens, second.remaining_tokens, third.remaining_tokens] == [60, 40, 0]
    refused = lim.admit("k", limits, 1)
    assert refused.refused_by == TOKENS
    assert refused.remaining_tokens == 0


def test_tokens_charged_at_the_end_replace_the_reservation() -> None:
    lim, clock = limiter(3.0)
    limits = Limits(tpm=100)
    ticket = lim.admit("k", limits, 80).ticket
    assert lim.report()["k"] == (1, 80, 1)
    # The backend said 30; the edge gives the reservation back when the request ends.
    lim.charge("k", 30)
    lim.release(ticket)
    assert lim.report()["k"] == (1, 30, 0)
    assert lim.admit("k", limits, 70).admitted
    assert not lim.admit("k", limits, 1).admitted
    clock.now = 3.0 + WINDOW_SECS + 1
    assert lim.admit("k", limits, 1).remaining_tokens == 29  # 70 still reserved


def test_a_request_bigger_than_tpm_runs_alone_but_not_beside_others() -> None:
    lim, _ = limiter()
    limits = Limits(tpm=100)
    big = lim.admit("k", limits, 500)
    assert big.admitted
    assert big.remaining_tokens == 0
    assert not lim.admit("k", limits, 500).admitted
    lim.release(big.ticket)
    assert lim.admit("k", limits, 500).admitted


def test_max_concurrent_counts_requests_in_flight_and_a_release_frees_one_slot_once() -> None:
    lim, _ = limiter()
    limits = Limits(max_concurrent=2)
    one = lim.admit("k", limits, 0).ticket
    assert lim.admit("k", limits, 0).admitted
    refused = lim.admit("k", limits, 0)
    assert (refused.refused_by, refused.retry_after_secs) == (CONCURRENT, 1)
    lim.release(one)
    lim.release(one)  # twice (an error path and the finally): one slot, not two
    assert lim.in_flight("k") == 1
    assert lim.admit("k", limits, 0).admitted
    assert not lim.admit("k", limits, 0).admitted


def test_rpm_is_checked_before_tpm_and_tpm_before_concurrency() -> None:
    lim, _ = limiter()
    everything = Limits(rpm=1, tpm=10, max_concurrent=1)
    assert lim.admit("k", everything, 10).admitted
    assert lim.admit("k", everything, 10).refused_by == REQUESTS
    assert lim.admit("k", Limits(tpm=10, max_concurrent=1), 10).refused_by == TOKENS
    assert lim.admit("k", Limits(tpm=20, max_concurrent=1), 10).refused_by == CONCURRENT


def test_keys_count_apart() -> None:
    lim, _ = limiter()
    assert lim.admit("a", Limits(rpm=1), 0).admitted
    assert lim.admit("b", Limits(rpm=1), 0).admitted
    assert not lim.admit("a", Limits(rpm=1), 0).admitted


def test_the_other_nodes_sum_adds_to_this_nodes_counts_until_it_goes_stale() -> None:
    lim, clock = limiter(100.0)
    lim.take_remote({"k": (2, 50, 1)})
    decision = lim.admit("k", Limits(rpm=3, tpm=60, max_concurrent=2), 10)
    assert decision.admitted
    assert (decision.remaining_requests, decision.remaining_tokens) == (0, 0)
    assert lim.admit("k", Limits(max_concurrent=2), 0).refused_by == CONCURRENT
    clock.now = 100.0 + STALE_SECS  # still fresh
    assert not lim.admit("k", Limits(max_concurrent=2), 0).admitted
    clock.now = 100.01 + STALE_SECS  # the master went quiet: this node counts alone
    assert lim.admit("k", Limits(max_concurrent=2), 0).admitted


def test_the_report_is_this_nodes_own_counts_and_drops_idle_keys() -> None:
    lim, clock = limiter(0.0)
    lim.take_remote({"k": (9, 9, 9)})
    ticket = lim.admit("k", Limits(rpm=20), 7).ticket
    lim.admit("j", Limits(rpm=5), 0)
    assert lim.report() == {"k": (1, 7, 1), "j": (1, 0, 1)}
    lim.release(ticket)
    clock.now = 61.0
    assert lim.report() == {"j": (0, 0, 1)}
    assert lim.report() == {"j": (0, 0, 1)}


def test_buckets_stay_bounded_by_the_window() -> None:
    lim, clock = limiter(0.0)
    for second in range(500):
        clock.now = float(second)
        lim.admit("k", Limits(rpm=10_000), 0)
    assert lim.report()["k"][0] == WINDOW_SECS + 1
    assert len(lim._usage["k"].buckets) == WINDOW_SECS + 1


def test_a_key_that_leaves_the_table_drops_its_counters() -> None:
    lim, _ = limiter()
    lim.follow(table("a", "b"))
    ticket = lim.admit("a", Limits(rpm=1), 5).ticket
    lim.take_remote({"a": (1, 0, 0), "b": (1, 0, 0), "ghost": (1, 0, 0)})
    assert lim._remote.keys() == {"a", "b"}
    lim.follow(table("b"))
    assert "a" not in lim._usage
    assert lim._remote.keys() == {"b"}
    lim.release(ticket)  # the request of a revoked key ends: nothing to crash on
    lim.charge("a", 100)  # nor its usage, reported late by a backend
    assert "a" not in lim._usage
    lim.follow(table("a", "b"))  # made again under the same name: a fresh count
    assert lim.admit("a", Limits(rpm=1), 0).admitted


def test_the_ledger_sums_fresh_reports_but_the_askers_own() -> None:
    clock = FakeClock(0.0)
    ledger = Ledger(clock)
    ledger.take("s1", {"k": (1, 10, 1)})
    clock.now = 2.0
    ledger.take("s2", {"k": (2, 20, 0), "j": (1, 1, 1)})
    assert ledger.totals() == {"k": (3, 30, 1), "j": (1, 1, 1)}
    assert ledger.totals(excluding="s2") == {"k": (1, 10, 1)}
    clock.now = STALE_SECS  # s1's report is exactly at the limit: still counted
    assert ledger.totals(excluding="s2") == {"k": (1, 10, 1)}
    clock.now = STALE_SECS + 0.01
    assert ledger.totals() == {"k": (2, 20, 0), "j": (1, 1, 1)}
    assert add_counts({"k": (1, 2, 3)}, {"k": (1, 1, 1)}) == {"k": (2, 3, 4)}


def test_headers_name_each_limit_the_key_has() -> None:
    lim, _ = limiter()
    both = lim.admit("k", Limits(rpm=60, tpm=1000), 30)
    assert both.headers() == [
        (b"x-ratelimit-limit-requests", b"60"),
        (b"x-ratelimit-remaining-requests", b"59"),
        (b"x-ratelimit-limit-tokens", b"1000"),
        (b"x-ratelimit-remaining-tokens", b"970"),
    ]
    assert lim.admit("j", Limits(max_concurrent=1), 30).headers() == []


def test_the_wire_form_round_trips_and_refuses_what_is_not_counts() -> None:
    counts = {"k": (1, 2, 3)}
    assert counts_from_wire(counts_to_wire(counts)) == counts
    assert counts_from_wire({}) == {}
    bad_reports: tuple[object, ...] = (
        [],
        {"k": [1, 2]},
        {"k": [1, 2, -1]},
        {"k": [1, True, 3]},
        {"k": [1.0, 2, 3]},
        {"k": "1,2,3"},
        {str(i): [0, 0, 0] for i in range(MAX_WIRE_KEYS + 1)},
    )
    for bad in bad_reports:
        with pytest.raises(ValueError):
            counts_from_wire(bad)


def test_charging_nothing_or_no_key_counts_nothing() -> None:
    lim, _ = limiter()
    lim.charge(None, 10)
    lim.charge("k", 0)
    lim.charge("k", -5)
    assert lim.report() == {}


def test_only_keys_with_tpm_are_charged_tokens() -> None:
    lim, _ = limiter()
    lim.follow(
        KeyTable(
            [
                KeyRecord(name="metered", key_hash=secret_hash("rk-m"), tpm=1000),
                KeyRecord(name="counted", key_hash=secret_hash("rk-c"), rpm=1000),
            ]
        )
    )
    lim.charge("metered", 12)
    lim.charge("counted", 12)
    lim.charge("ghost", 12)
    assert lim.report() == {"metered": (0, 12, 0)}


def test_the_view_shows_this_nodes_counts_and_the_clusters_while_the_sum_is_fresh() -> None:
    lim, clock = limiter(0.0)
    lim.admit("k", Limits(rpm=9), 4)
    lim.take_remote({"k": (2, 3, 1), "j": (1, 0, 0)})
    assert lim.view() == {
        "k": {"here": (1, 4, 1), "cluster": (3, 7, 2)},
        "j": {"here": (0, 0, 0), "cluster": (1, 0, 0)},
    }
    clock.now = STALE_SECS + 0.01
    assert lim.view() == {"k": {"here": (1, 4, 1), "cluster": (1, 4, 1)}}
