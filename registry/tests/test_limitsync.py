"""The master's side of the per-key limit exchange, on the fake clock: each node's report
taken, everyone else's sum answered, its own view updated; malformed reports refused whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from access import limits
from access.keys import KeyRecord, KeyTable, install_table, reset_for_tests, secret_hash
from access.limits import STALE_SECS, Limits
from registry.limitsync import has_limits, limits_answer, limits_view


class FakeClock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    install_table(
        KeyTable(
            [
                KeyRecord(name="k", key_hash=secret_hash("rk-k"), rpm=10),
                KeyRecord(name="j", key_hash=secret_hash("rk-j"), max_concurrent=3),
            ]
        )
    )
    fake = FakeClock()
    limits.reset_for_tests(fake)
    yield fake
    reset_for_tests()
    limits.reset_for_tests()


def test_the_master_answers_each_node_with_everyone_elses_sum(clock: FakeClock) -> None:
    master = limits.current_limiter()
    assert master.admit("k", Limits(rpm=10), 0).admitted
    assert limits_answer("s1", {"node_id": "s1", "keys": {"k": [2, 0, 1]}}) == {
        "keys": {"k": [1, 0, 1]}
    }
    answer = limits_answer("s2", {"node_id": "s2", "keys": {"k": [3, 0, 0], "j": [0, 0, 2]}})
    assert answer == {"keys": {"k": [3, 0, 2]}}
    # The master counts the slaves' too: 1 here, 2 + 3 there; in flight 1 here, 1 on s1.
    assert limits_view("master")["keys"]["k"] == {"here": [1, 0, 1], "cluster": [6, 0, 2]}
    assert limits_view("master")["keys"]["j"] == {"here": [0, 0, 0], "cluster": [0, 0, 2]}
    # A node that stopped reporting stops counting once its report is stale.
    clock.now += STALE_SECS + 0.01
    assert limits_answer("s2", {"node_id": "s2", "keys": {}}) == {"keys": {"k": [1, 0, 1]}}


def test_a_malformed_report_is_refused_and_changes_nothing(clock: FakeClock) -> None:
    limits_answer("s1", {"node_id": "s1", "keys": {"k": [2, 0, 0]}})
    bad_reports: tuple[object, ...] = (
        [],
        {"keys": []},
        {"keys": {"k": [1, 2]}},
        {"keys": {"k": [-1, 0, 0]}},
    )
    for bad in bad_reports:
        with pytest.raises(ValueError):
            limits_answer("s1", bad)
    assert limits_answer("s2", {"keys": {}}) == {"keys": {"k": [2, 0, 0]}}


def test_only_a_table_with_a_limited_key_is_worth_an_exchange() -> None:
    plain = KeyRecord(name="p", key_hash=secret_hash("rk-p"))
    assert not has_limits(KeyTable([plain]))
    for limited in ({"rpm": 1}, {"tpm": 1}, {"max_concurrent": 1}):
        record = KeyRecord(name="l", key_hash=secret_hash("rk-l"), **limited)  # type: ignore[arg-type]
        assert has_limits(KeyTable([plain, record]))
