"""The master's lease book, its event coalescing and the stall check, on the master's clock.

A real master node (no router process: its methods are called directly) with a fake clock in
place of the master's monotonic time and a fake node client in place of its calls to slaves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from lending import master as master_module
from lending.incremental import LanePlanner
from lending.master import MasterLending
from lending.planner import Endpoint, Lease, LinkTarget, PlanResult
from proxy.node import Node, build_node
from registry.httpclient import close_session
from registry.nodeclient import NodeCallError
from routerproject.config import load_config

TOKEN = "cluster-secret-for-master-book-tests"
HELPER_URLS = {"h": "http://127.0.0.1:9", "h2": "http://127.0.0.1:10"}
START_SECS = 100.0
STALL_TIMEOUT_SECS = 0.25
WAIT_SECS = 5.0


class FakeClock:
    """The master's monotonic clock; counts its reads so a test can tell the stall loop ran."""

    def __init__(self) -> None:
        self.now = START_SECS
        self.reads = 0
        self.read = asyncio.Event()

    def __call__(self) -> float:
        self.reads += 1
        self.read.set()
        return self.now


@dataclass
class FakeClient:
    """Answers the master's calls to slaves: runtime status, and the stall check's query."""

    borrowed: dict[str, Any] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    stall_asked: asyncio.Event = field(default_factory=asyncio.Event)
    grants: list[tuple[str, Any]] = field(default_factory=list)
    """(node, body) of every grant route call: the master's lease clears (its grants of
    leases are caught before they get here)."""

    async def call_ok(self, method: str, base_url: str, path: str, **kwargs: Any) -> Any:
        helper = next(node for node, url in HELPER_URLS.items() if url == base_url)
        if path == "/router/v1/node/offload/grant":
            self.grants.append((helper, kwargs.get("json")))
            return kwargs.get("json")
        if path == "/router/v1/node/offload/borrowed":
            self.asked.append(helper)
            self.stall_asked.set()
            answer = self.borrowed.get(helper, {"borrowed": 1})
            if isinstance(answer, Exception):
                raise answer
            return answer
        return {"node_id": helper}


@dataclass
class Site:
    node: Node
    master: MasterLending
    clock: FakeClock
    client: FakeClient
    grants: list[Lease]
    granted: asyncio.Event
    rows: list[dict[str, Any]]


def snapshot(node_id: str) -> dict[str, Any]:
    record = {
        "local_id": "fast",
        "model_hash": "a" * 64,
        "config_hash": "b" * 64,
        "filename": "fast.kcpps",
        "has_llm": True,
        "context_size": 4096,
    }
    return {
        "node_id": node_id,
        "node_url": HELPER_URLS[node_id],
        "models": [record],
        "protocol_version": 2,
    }


@pytest.fixture
async def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Site]:
    (tmp_path / "kcpps").mkdir()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": {
                    "role": "master",
                    "node_id": "master",
                    "token": TOKEN,
                    "public_url": "http://127.0.0.1:18996",
                    "slave_urls": list(HELPER_URLS.values()),
                    "store_dir": str(tmp_path / "store"),
                    "offload_lent_stall_timeout": f"{int(STALL_TIMEOUT_SECS * 1000)}ms",
                },
                "models": {"config_dir": str(tmp_path / "kcpps")},
                "backend": {"mode": "sim"},
            }
        )
    )
    node = build_node(load_config(config_path, environ={}))
    for node_id, url in HELPER_URLS.items():
        node.cluster.apply_poll(url, snapshot(node_id))
    rows: list[dict[str, Any]] = []
    monkeypatch.setattr(node.decisions, "record", lambda **fields: rows.append(fields))
    clock = FakeClock()
    monkeypatch.setattr(
        master_module, "time", SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter)
    )
    client = FakeClient()
    assert node.client is not None
    monkeypatch.setattr(node.client, "call_ok", client.call_ok)
    master = node.master
    assert master is not None
    grants: list[Lease] = []
    granted = asyncio.Event()

    async def grant(lease: Lease) -> None:
        grants.append(lease)
        granted.set()

    monkeypatch.setattr(master, "_grant", grant)
    try:
        yield Site(node, master, clock, client, grants, granted, rows)
    finally:
        await master.close()
        await node.client.aclose()
        await close_session()


def lease(
    *,
    lane: str = "text",
    owner: str = "o",
    model: str = "big",
    slots: int = 1,
    ttl_ms: int = 30_000,
) -> Lease:
    return Lease(
        lane=lane,
        owner_node_id=owner,
        owner_model_id=model,
        helper_node_id="h",
        helper_model_id="fast",
        load_helper_model=True,
        restore_helper_model=False,
        helper_slots=slots,
        probe=False,
        ttl_ms=ttl_ms,
        owner_job_ms=1000.0,
        helper_switch_ms=0.0,
        helper_service_ms=250.0,
    )


def planner_grants(monkeypatch: pytest.MonkeyPatch, by_lane: dict[str, list[Lease]]) -> None:
    """The next plans grant exactly these leases (the planner has tests of its own)."""

    def plan(self: LanePlanner, **_: Any) -> PlanResult:
        return PlanResult(leases=list(by_lane.get(self.lane, [])))

    monkeypatch.setattr(LanePlanner, "plan", plan)


# -- the lease book ---------------------------------------------------------------------------


async def test_a_plan_books_each_lease_until_its_ttl_on_the_masters_clock(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, image = lease(ttl_ms=30_000), lease(lane="image", model="pic", ttl_ms=10_000)
    planner_grants(monkeypatch, {"text": [text], "image": [image]})

    await site.master.plan("tick")

    assert site.master.book == {
        ("text", "o", "big"): (text, 130.0),
        ("image", "o", "pic"): (image, 110.0),
    }
    site.clock.now = 129.999
    assert site.master.lease_for("text", "o", "big") is text
    assert site.master.lease_for("image", "o", "big") is None  # each lane has its own leases
    assert site.master.lease_for("text", "o2", "big") is None
    site.clock.now = 105.0
    assert site.master.live_leases() == [
        {**image.to_wire(), "expires_in_ms": 5_000},
        {**text.to_wire(), "expires_in_ms": 25_000},
    ]
    site.clock.now = 130.0
    assert site.master.lease_for("text", "o", "big") is None
    assert site.master.live_leases() == []


async def test_each_plan_replaces_the_book_so_a_lease_not_granted_again_ends_at_once(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, other = lease(), lease(owner="o2")
    planner_grants(monkeypatch, {"text": [first, other]})
    await site.master.plan("enqueued")

    kept = lease(owner="o2", slots=2)
    planner_grants(monkeypatch, {"text": [kept]})
    await site.master.plan("completed")

    assert site.master.lease_for("text", "o", "big") is None
    assert site.master.lease_for("text", "o2", "big") is kept


async def test_the_asking_owner_gets_its_lease_as_the_answer_and_the_others_a_grant(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    asking, other = lease(), lease(owner="o2")
    planner_grants(monkeypatch, {"text": [asking, other]})

    answer = await site.master.on_event(
        {"lane": "text", "owner_node_id": "o", "model_id": "big", "trigger": "enqueued"}
    )
    await asyncio.wait_for(site.granted.wait(), WAIT_SECS)

    assert answer is asking
    assert site.grants == [other]


async def settled(site: Site) -> None:
    """Every grant or clear the last plan sent has been delivered."""
    pending = [t for t in site.master._tasks if not t.done()]
    if pending:
        await asyncio.wait_for(asyncio.gather(*pending), WAIT_SECS)


async def test_a_live_lease_a_plan_drops_is_cleared_at_its_owner_at_once(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped, kept = lease(owner="h2"), lease(owner="h", model="other")
    planner_grants(monkeypatch, {"text": [dropped, kept]})
    await site.master.plan("enqueued")
    await settled(site)
    assert site.client.grants == []

    planner_grants(monkeypatch, {"text": [kept]})
    await site.master.plan("completed")
    await settled(site)

    clear = {"lane": "text", "owner_node_id": "h2", "owner_model_id": "big", "cleared": True}
    assert site.client.grants == [("h2", clear)]


async def test_no_clear_for_the_asking_owner_a_lapsed_lease_or_one_granted_again(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    asking, lapsed, again = lease(owner="h2"), lease(owner="h", ttl_ms=1_000), lease(model="b2")
    planner_grants(monkeypatch, {"text": [asking, lapsed, again]})
    await site.master.plan("enqueued")
    site.clock.now += 1.0  # the 1 s lease has lapsed on the master's clock

    planner_grants(monkeypatch, {"text": [again]})
    answer = await site.master.on_event(
        {"lane": "text", "owner_node_id": "h2", "model_id": "big", "trigger": "completed"}
    )
    await settled(site)

    # The asker learns it from its answer; the lapsed one lapsed on the owner's clock too.
    assert answer is None
    assert site.client.grants == []


def owner_with_nothing_held(monkeypatch: pytest.MonkeyPatch, site: Site) -> None:
    """The plans see owner o's model big with nothing held, one job running, linked to h."""
    owner = Endpoint("o", "big", "big.kcpps", True, False, 0.0, 4096, backlog_count=1)
    helper = Endpoint("h", "fast", "fast.kcpps", True, True, 500.0, 4096)

    def built(key: tuple[str, str], statuses: Any) -> tuple[Endpoint, list[LinkTarget]] | None:
        return (owner, [LinkTarget(helper, True, False)]) if key == ("o", "big") else None

    monkeypatch.setattr(site.master._inputs["text"], "owner", built)


async def test_a_lease_of_an_owner_with_nothing_held_is_kept_until_its_expiry(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner_with_nothing_held(monkeypatch, site)
    planner_grants(monkeypatch, {"text": [lease()]})
    await site.master.plan("enqueued")
    site.clock.now += 10.0
    planner_grants(monkeypatch, {})

    answer = await site.master.on_event(
        {"lane": "text", "owner_node_id": "o", "model_id": "big", "trigger": "completed"}
    )
    await settled(site)

    # The owner is told the lease with the 20 s it has left, so both sides end it together.
    assert answer == dataclasses.replace(lease(), ttl_ms=20_000)
    assert site.master.book[("text", "o", "big")][1] == START_SECS + 30.0
    assert site.client.grants == []  # not cleared
    kept = [r for r in site.rows if r.get("outcome") == "kept"]
    assert [(r["kind"], r["reason"], r["trigger"]) for r in kept] == [
        ("plan", "nothing_held", "completed")
    ]
    site.clock.now = START_SECS + 30.0
    await site.master.plan("tick")
    assert site.master.lease_for("text", "o", "big") is None


# -- event coalescing ---------------------------------------------------------------------------


@dataclass
class FakePlans:
    """Stands in for `plan`: each one waits until the test lets it book its lease."""

    site: Site
    calls: list[tuple[str, tuple[str, str, str] | None]] = field(default_factory=list)
    gates: list[asyncio.Future[Lease | None]] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def plan(self, trigger: str, *, asking: tuple[str, str, str] | None = None) -> None:
        gate: asyncio.Future[Lease | None] = asyncio.get_running_loop().create_future()
        self.calls.append((trigger, asking))
        self.gates.append(gate)
        self.started.set()
        granted = await gate
        if granted is not None and asking is not None:
            self.site.master.book[asking] = (granted, self.site.clock() + 30.0)

    async def wait_calls(self, count: int) -> None:
        async with asyncio.timeout(WAIT_SECS):
            while len(self.calls) < count:
                self.started.clear()
                await self.started.wait()


def event(trigger: str | None, *, owner: str = "o", lane: str = "text") -> dict[str, Any]:
    body = {"lane": lane, "owner_node_id": owner, "model_id": "big"}
    if trigger is not None:
        body["trigger"] = trigger
    return body


async def test_events_of_one_owner_model_share_one_queued_plan_with_the_latest_trigger(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans = FakePlans(site)
    monkeypatch.setattr(site.master, "plan", plans.plan)
    key = ("text", "o", "big")
    first, second = lease(slots=1), lease(slots=2)

    asking = asyncio.ensure_future(site.master.on_event(event("enqueued")))
    await plans.wait_calls(1)
    later = [
        asyncio.ensure_future(site.master.on_event(event(trigger)))
        for trigger in ("completed", "lent_finished")
    ]
    other_owner = asyncio.ensure_future(site.master.on_event(event("enqueued", owner="o2")))
    await plans.wait_calls(2)
    assert plans.calls == [("enqueued", key), ("enqueued", ("text", "o2", "big"))]

    plans.gates[0].set_result(first)
    assert await asyncio.wait_for(asking, WAIT_SECS) is first
    await plans.wait_calls(3)
    assert plans.calls[2] == ("lent_finished", key)
    plans.gates[1].set_result(None)
    plans.gates[2].set_result(second)

    assert await asyncio.wait_for(asyncio.gather(*later), WAIT_SECS) == [second, second]
    assert await asyncio.wait_for(other_owner, WAIT_SECS) is None
    assert len(plans.calls) == 3


async def test_an_event_reads_its_lane_and_trigger_with_defaults(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans = FakePlans(site)
    monkeypatch.setattr(site.master, "plan", plans.plan)

    pending = asyncio.ensure_future(site.master.on_event(event(None, lane="video")))
    await plans.wait_calls(1)
    plans.gates[0].set_result(None)
    await asyncio.wait_for(pending, WAIT_SECS)

    assert plans.calls == [("enqueued", ("image", "o", "big"))]


async def test_a_failed_plan_fails_its_event_and_the_queued_ones_get_a_plan_of_their_own(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans = FakePlans(site)
    monkeypatch.setattr(site.master, "plan", plans.plan)
    granted = lease()

    asking = asyncio.ensure_future(site.master.on_event(event("enqueued")))
    await plans.wait_calls(1)
    queued = asyncio.ensure_future(site.master.on_event(event("completed")))
    await asyncio.sleep(0)  # one step: the event joins the queue behind the plan in flight
    assert ("text", "o", "big") in site.master._queued
    plans.gates[0].set_exception(RuntimeError("plan failed"))

    with pytest.raises(RuntimeError, match="plan failed"):
        await asyncio.wait_for(asking, WAIT_SECS)
    await plans.wait_calls(2)
    plans.gates[1].set_result(granted)
    assert await asyncio.wait_for(queued, WAIT_SECS) is granted


# -- the stall check ----------------------------------------------------------------------------


def relays(site: Site, helper: str, count: int) -> list[asyncio.Task[Any]]:
    """Lent requests relayed to `helper` that have not started answering."""
    tasks = [asyncio.ensure_future(asyncio.Event().wait()) for _ in range(count)]
    site.master.relays.setdefault(helper, set()).update(tasks)
    return tasks


async def outcome(task: asyncio.Task[Any]) -> str:
    await asyncio.wait([task], timeout=0.01)
    if not task.done():
        task.cancel()
        return "running"
    return "returned" if task.cancelled() else "finished"


async def test_a_helper_that_runs_no_borrowed_work_gives_back_every_request_lent_to_it(
    site: Site,
) -> None:
    lent_to_h, lent_to_h2 = relays(site, "h", 2), relays(site, "h2", 1)
    site.client.borrowed["h"] = {"borrowed": 0}
    site.clock.now = 107.0

    await site.master._check_stalled("h")

    assert site.client.asked == ["h"]
    assert [await outcome(t) for t in lent_to_h] == ["returned", "returned"]
    assert site.master.stalled >= set(lent_to_h)
    assert await outcome(lent_to_h2[0]) == "running"
    assert site.master.relay_changed["h"] == 107.0


@pytest.mark.parametrize(
    "answer",
    [
        {"borrowed": 1},
        {"borrowed": 3},
        NodeCallError("status", "404 Not Found", status=404),
    ],
    ids=["one", "several", "an_older_build"],
)
async def test_a_helper_still_running_borrowed_work_keeps_its_lent_requests(
    site: Site, answer: Any
) -> None:
    lent = relays(site, "h", 2)
    site.client.borrowed["h"] = answer
    site.clock.now = 107.0

    await site.master._check_stalled("h")

    assert [await outcome(t) for t in lent] == ["running", "running"]
    assert site.master.stalled == set()
    # The next question waits for another full stall timeout.
    assert site.master.relay_changed["h"] == 107.0


async def wait_loop_turns(site: Site, turns: int) -> None:
    # Each turn of the stall loop reads the clock once after its sleep.
    target = site.clock.reads + turns
    async with asyncio.timeout(WAIT_SECS):
        while site.clock.reads < target:
            site.clock.read.clear()
            await site.clock.read.wait()


async def test_the_helper_is_asked_only_after_its_lent_requests_show_no_change_for_the_timeout(
    site: Site,
) -> None:
    site.client.borrowed["h"] = {"borrowed": 0}
    (first,) = relays(site, "h", 1)
    finishing = asyncio.ensure_future(asyncio.Event().wait())
    site.master._relay_begin("h", finishing)  # at 100.0: the loop starts
    await wait_loop_turns(site, 3)
    assert site.client.asked == []

    # A lent request finishing is a change: the wait starts again from it.
    site.clock.now = 100.125
    site.master._relay_end("h", finishing)
    finishing.cancel()
    site.clock.now = 100.25
    await wait_loop_turns(site, 3)
    assert site.client.asked == []

    site.clock.now = 100.375
    await asyncio.wait_for(site.client.stall_asked.wait(), WAIT_SECS)
    assert site.client.asked == ["h"]
    assert await outcome(first) == "returned"


async def test_a_long_stall_timeout_is_still_checked_every_stall_check_interval(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    site.node.lending.apply_settings({"offload_lent_stall_timeout": "1h"}, source="test")
    config = site.node.config
    cluster = config.cluster.model_copy(update={"lending_stall_check_interval": 0.01})
    monkeypatch.setattr(site.node, "config", config.model_copy(update={"cluster": cluster}))
    (lent,) = relays(site, "h", 1)
    site.master._relay_begin("h", lent)

    # At a quarter of the hour (or the 5s default) three turns would outlast WAIT_SECS.
    await wait_loop_turns(site, 3)

    assert site.client.asked == []
