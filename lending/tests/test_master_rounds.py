"""Which nodes the master polls for a plan, and how concurrent events share a poll round.

A real master node (no router process: its methods are called directly) with a fake node
client that answers every runtime-status poll and records who was asked. Five slaves, each
with one text model ``m``: a and c both lend to b (so they claim the same helper), d lends to
e and shares nothing with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from lending.master import MasterLending
from lending.planner import Lease
from proxy.node import Node, build_node
from proxy.observe.metrics import exposition
from registry.httpclient import close_session
from routerproject.config import load_config

TOKEN = "cluster-secret-for-master-round-tests"
URLS = {node: f"http://127.0.0.1:{9100 + i}" for i, node in enumerate("abcde")}
LINKS = [("a", "b"), ("c", "b"), ("d", "e")]
WAIT_SECS = 10.0


@dataclass
class FakeClient:
    """Answers runtime-status polls (held at `gate` while it is clear) and logs them."""

    log: list[tuple[str, str]] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    polled: asyncio.Event = field(default_factory=asyncio.Event)
    statuses: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gate.set()

    async def call_ok(self, method: str, base_url: str, path: str, **kwargs: Any) -> Any:
        node = next(n for n, url in URLS.items() if url == base_url)
        if path != "/router/v1/node/runtime-status":
            return kwargs.get("json")
        self.log.append(("poll", node))
        self.polled.set()
        await self.gate.wait()
        status = {
            "node_id": node,
            "active_text_config": "m.kcpps",
            "accepting_borrowed_text": True,
            "idle_for_ms": 600_000,
            "text_queue": [
                {"model_id": "m", "pending_count": 3, "lendable_count": 3, "backlog_count": 3}
            ],
            "costs": {"models": [], "loads": [], "tokens": []},
        }
        self.statuses.append(status)
        return status

    def polls(self) -> list[str]:
        return [node for kind, node in self.log if kind == "poll"]


@dataclass
class Site:
    node: Node
    master: MasterLending
    client: FakeClient


def snapshot(node_id: str) -> dict[str, Any]:
    record = {
        "local_id": "m",
        "model_hash": node_id * 64,
        "config_hash": "b" * 64,
        "filename": "m.kcpps",
        "has_llm": True,
        "context_size": 4096,
    }
    return {
        "node_id": node_id,
        "node_url": URLS[node_id],
        "models": [record],
        "protocol_version": 2,
    }


def event(owner: str) -> dict[str, Any]:
    return {"lane": "text", "owner_node_id": owner, "model_id": "m", "trigger": "enqueued"}


@asynccontextmanager
async def master_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, poll: str | None
) -> AsyncIterator[Site]:
    (tmp_path / "kcpps").mkdir()
    cluster: dict[str, Any] = {
        "role": "master",
        "node_id": "master",
        "token": TOKEN,
        "public_url": "http://127.0.0.1:18997",
        "slave_urls": list(URLS.values()),
        "store_dir": str(tmp_path / "store"),
    }
    if poll is not None:
        cluster["lending_event_poll"] = poll
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": cluster,
                "models": {"config_dir": str(tmp_path / "kcpps")},
                "backend": {"mode": "sim"},
            }
        )
    )
    node = build_node(load_config(config_path, environ={}))
    for node_id, url in URLS.items():
        node.cluster.apply_poll(url, snapshot(node_id))
    links = [
        {
            "owner_node_id": owner,
            "owner_model_id": "m",
            "helper_node_id": helper,
            "helper_model_id": "m",
            "load_if_unloaded": True,
            "restore_after_borrow": False,
        }
        for owner, helper in LINKS
    ]
    node.lending.set_links({"text": links, "image": []})
    monkeypatch.setattr(node.decisions, "record", lambda **fields: None)
    client = FakeClient()
    assert node.client is not None
    monkeypatch.setattr(node.client, "call_ok", client.call_ok)
    master = node.master
    assert master is not None

    async def grant(lease: Lease) -> None:
        return None

    monkeypatch.setattr(master, "_grant", grant)
    try:
        yield Site(node, master, client)
    finally:
        client.gate.set()
        await master.close()
        await node.client.aclose()
        await close_session()


SiteFactory = Callable[[str | None], AbstractAsyncContextManager[Site]]


@pytest.fixture
def make_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SiteFactory:
    return lambda poll: master_site(tmp_path, monkeypatch, poll)


@pytest.mark.parametrize("poll", [None, "all"])
async def test_by_default_an_event_polls_every_node(make_site: SiteFactory, poll: str) -> None:
    async with make_site(poll) as site:
        lease = await site.master.on_event(event("a"))

        assert sorted(site.client.polls()) == ["a", "b", "c", "d", "e"]
        assert lease is not None and lease.helper_node_id == "b"


@pytest.mark.parametrize(
    ("owner", "polled"),
    [
        # The owner, its helper b, and c, which links to b too (they claim the same node).
        ("a", ["a", "b", "c"]),
        ("c", ["a", "b", "c"]),
        ("d", ["d", "e"]),
    ],
)
async def test_under_linked_an_event_polls_only_the_nodes_its_plan_can_involve(
    make_site: SiteFactory, owner: str, polled: list[str]
) -> None:
    async with make_site("linked") as site:
        await site.master.plan("tick")
        assert sorted(site.client.polls()) == ["a", "b", "c", "d", "e"]
        before = dict(site.master.last_statuses)
        site.client.log.clear()

        await site.master.on_event(event(owner))

        assert sorted(site.client.polls()) == polled
        # The nodes left out keep the status the last round saw, the very same answer.
        for node in "abcde":
            if node not in polled:
                assert site.master.last_statuses[node] is before[node]
            else:
                assert site.master.last_statuses[node] is not before[node]


async def test_under_linked_the_tick_still_polls_every_node(make_site: SiteFactory) -> None:
    async with make_site("linked") as site:
        await site.master.on_event(event("d"))
        assert sorted(site.client.polls()) == ["a", "b", "c", "d", "e"]  # nothing seen yet
        site.client.log.clear()
        await site.master.on_event(event("d"))
        assert sorted(site.client.polls()) == ["d", "e"]
        site.client.log.clear()

        await site.master.plan("tick")

        assert sorted(site.client.polls()) == ["a", "b", "c", "d", "e"]


async def test_events_that_arrive_during_a_round_share_the_next_round(
    make_site: SiteFactory,
) -> None:
    async with make_site(None) as site:
        client = site.client
        client.gate.clear()
        first = asyncio.ensure_future(site.master.on_event(event("a")))
        await asyncio.wait_for(client.polled.wait(), WAIT_SECS)
        client.log.extend([("event", "c"), ("event", "d")])
        later = [asyncio.ensure_future(site.master.on_event(event(o))) for o in "cd"]
        # Callbacks run in the order they were scheduled: both events join a round before the
        # polls of the round in flight are answered.
        asyncio.get_running_loop().call_soon(client.gate.set)

        answers = await asyncio.wait_for(asyncio.gather(first, *later), WAIT_SECS)

        # a and d get a probe of their helper; c finds b claimed by a (the deeper backlog ties,
        # and the node id decides).
        assert [answer is not None for answer in answers] == [True, False, True]
        # Three owners' events, two rounds: the two that came during the first share the next,
        # and every poll of that one began after both had arrived.
        assert site.master.rounds == 2
        assert len(client.polls()) == 10
        after = client.log[client.log.index(("event", "d")) + 1 :]
        assert sorted(node for _, node in after) == list("abcde")
        scraped = exposition(site.node).decode()
        assert "router_cluster_plan_rounds_total 2.0" in scraped
        assert "router_cluster_plan_compute_seconds_total" in scraped
