"""Which live leases a plan keeps for owners with nothing held (lending/carry.py), exactly."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from lending.carry import OUTCOME_KEPT, REASON_NOTHING_HELD, kept_leases
from lending.decisions import OUTCOME_TEXT, REASON_TEXT
from lending.planner import Endpoint, Lease, LinkTarget
from lending.tests.factories import LeaseFactory

NOW = 100.0
EXPIRES = 112.5  # 12.5 s left


def endpoint(node: str, model: str, **fields: Any) -> Endpoint:
    base: dict[str, Any] = dict(
        node_id=node,
        model_id=model,
        config_filename=f"{model}.kcpps",
        loaded=True,
        accepting_borrowed=True,
        idle_for_ms=750.0,
        context_capacity=4096,
    )
    base.update(fields)
    return Endpoint(**base)


def lease(**overrides: Any) -> Lease:
    return LeaseFactory.build(
        **{
            "owner_model_id": "A",
            "helper_model_id": "B",
            "helper_slots": 2,
            "owner_job_ms": 400.0,
            "helper_service_ms": 100.0,
            **overrides,
        }
    )


KEY = ("text", "o", "A")


def owners(
    owner: Endpoint | None = None, helper: Endpoint | None = None, lane: str = "text"
) -> dict[str, list[tuple[Endpoint, list[LinkTarget]]]]:
    owner = owner or endpoint("o", "A", backlog_count=1)
    helper = helper or endpoint("h", "B")
    return {lane: [(owner, [LinkTarget(helper, True, False)])]}


def kept(**kwargs: Any) -> dict[tuple[str, str, str], Any]:
    args: dict[str, Any] = dict(
        held={KEY: (lease(), EXPIRES)}, planned={}, owners=owners(), now=NOW, trigger="completed"
    )
    args.update(kwargs)
    return kept_leases(**args)


def test_an_owner_with_nothing_held_keeps_its_lease_with_the_time_it_has_left() -> None:
    result = kept()

    assert list(result) == [KEY]
    entry = result[KEY]
    assert entry.lease == dataclasses.replace(lease(), ttl_ms=12_500)
    assert entry.expires == EXPIRES
    row = entry.row.as_fields()
    assert (row["outcome"], row["reason"], row["trigger"]) == (
        OUTCOME_KEPT,
        REASON_NOTHING_HELD,
        "completed",
    )
    assert (row["owner_node_id"], row["owner_model_id"]) == ("o", "A")
    assert (row["helper_node_id"], row["helper_model_id"], row["slots"]) == ("h", "B", 2)
    assert (row["pending_count"], row["backlog_count"], row["helper_idle_ms"]) == (0, 1, 750)
    assert (row["service_ms"], row["owner_job_ms"], row["switch_ms"]) == (100.0, 400.0, 0.0)
    # The operator's legend explains both.
    assert OUTCOME_KEPT in OUTCOME_TEXT and REASON_NOTHING_HELD in REASON_TEXT


@pytest.mark.parametrize(("backlog", "is_kept"), [(1, True), (0, False)])
def test_an_owner_that_has_gone_idle_loses_it(backlog: int, is_kept: bool) -> None:
    assert bool(kept(owners=owners(endpoint("o", "A", backlog_count=backlog)))) is is_kept


@pytest.mark.parametrize(("lendable", "is_kept"), [(0, True), (1, False)])
def test_an_owner_with_a_request_to_lend_is_the_planners_call(lendable: int, is_kept: bool) -> None:
    # Two streams held: nothing the plan could lend, so the lease stays; one lendable request
    # and the planner decided (here: no lease), so it ends.
    owner = endpoint("o", "A", pending_count=2, lendable_count=lendable, backlog_count=4)
    assert bool(kept(owners=owners(owner))) is is_kept


def test_an_owner_that_does_not_report_lendable_counts_every_held_request() -> None:
    owner = endpoint("o", "A", pending_count=1, lendable_count=None, backlog_count=2)
    assert kept(owners=owners(owner)) == {}


@pytest.mark.parametrize(("expires", "is_kept"), [(100.001, True), (100.0, False)])
def test_a_lease_is_kept_only_until_its_expiry(expires: float, is_kept: bool) -> None:
    result = kept(held={KEY: (lease(), expires)})
    assert bool(result) is is_kept
    if is_kept:
        assert result[KEY].lease.ttl_ms == 1


@pytest.mark.parametrize(
    "unkept",
    [
        {"probe": True},
        {"helper_service_ms": None},
        {"owner_job_ms": None},
    ],
)
def test_a_probe_or_a_lease_without_both_speeds_is_not_kept(unkept: dict[str, Any]) -> None:
    assert kept(held={KEY: (lease(**unkept), EXPIRES)}) == {}


def test_a_lease_granted_again_is_the_plans_not_a_kept_one() -> None:
    again = lease(helper_slots=1)
    assert kept(planned={KEY: (again, NOW + 30.0)}) == {}


@pytest.mark.parametrize(("lane", "is_kept"), [("text", False), ("image", True)])
def test_a_helper_node_another_owner_was_granted_in_this_lane_is_not_kept(
    lane: str, is_kept: bool
) -> None:
    # Another owner with held requests got a lease on h (another model of h, even): it comes
    # first. A lease in the other lane claims nothing here.
    other = lease(lane=lane, owner_node_id="o2", helper_model_id="B2")
    result = kept(planned={(lane, "o2", "A"): (other, NOW + 30.0)})
    assert bool(result) is is_kept


@pytest.mark.parametrize(
    "helper",
    [
        endpoint("h", "B", accepting_borrowed=False),
        endpoint("h", "B", eligible=False),
        endpoint("h", "B2"),  # no longer linked: the owner's targets name another model
    ],
)
def test_a_helper_that_cannot_take_the_work_ends_the_lease(helper: Endpoint) -> None:
    assert kept(owners=owners(helper=helper)) == {}


def test_an_owner_no_longer_planned_in_that_lane_ends_the_lease() -> None:
    assert kept(owners=owners(lane="image")) == {}
    assert kept(owners={}) == {}
