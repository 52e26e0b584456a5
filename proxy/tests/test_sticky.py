"""The sticky ID table: bounded and expiring."""

from __future__ import annotations

import pytest

from proxy.serving.sticky import Holder, StickyIds

A = Holder("node-a", "chat", "chat")
B = Holder("node-b", "chat", "chat-b")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_id_is_found_under_its_family_only() -> None:
    table = StickyIds()
    table.remember("responses", "resp_1", A)

    assert table.lookup("responses", "resp_1") == A
    assert table.lookup("sdcpp", "resp_1") is None


def test_the_least_recently_used_id_goes_first_past_the_capacity() -> None:
    table = StickyIds(capacity=2)
    table.remember("jobs", "1", A)
    table.remember("jobs", "2", A)
    assert table.lookup("jobs", "1") == A  # 1 is now the most recent
    table.remember("jobs", "3", B)

    assert len(table) == 2
    assert table.lookup("jobs", "2") is None
    assert table.lookup("jobs", "1") == A
    assert table.lookup("jobs", "3") == B


def test_an_id_expires_at_its_ttl_exactly() -> None:
    clock = Clock()
    table = StickyIds(ttl_secs=60.0, clock=clock)
    table.remember("jobs", "1", A)

    clock.now = 159.999
    assert table.lookup("jobs", "1") == A
    clock.now = 160.0
    assert table.lookup("jobs", "1") is None
    assert len(table) == 0


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        StickyIds(capacity=0)


def test_remembering_an_id_again_makes_it_the_most_recent() -> None:
    table = StickyIds(capacity=2)
    table.remember("jobs", "1", A)
    table.remember("jobs", "2", A)
    table.remember("jobs", "1", B)  # the same ID again, now held elsewhere
    table.remember("jobs", "3", A)

    assert len(table) == 2
    assert table.lookup("jobs", "2") is None
    assert table.lookup("jobs", "1") == B
    assert table.lookup("jobs", "3") == A


def test_remembering_an_id_again_restarts_its_ttl() -> None:
    clock = Clock()
    table = StickyIds(ttl_secs=60.0, clock=clock)
    table.remember("jobs", "1", A)
    clock.now = 130.0
    table.remember("jobs", "1", A)

    clock.now = 189.999
    assert table.lookup("jobs", "1") == A
    clock.now = 190.0
    assert table.lookup("jobs", "1") is None
