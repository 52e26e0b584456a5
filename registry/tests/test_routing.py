"""The rotation among replicas of one public ID: local idle, then remotes, then local busy."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from registry.affinity import AffinityTable, fingerprints
from registry.cluster import Replica
from registry.ports import RoutingNode
from registry.routing import Kind, choose

MODEL = "chat-model"


@dataclass
class FakeCluster:
    counters: dict[str, int] = field(default_factory=dict)

    def next_rr(self, key: str, *, advance: bool = True) -> int:
        turn = self.counters.get(key, 0)
        if advance:
            self.counters[key] = turn + 1
        return turn


@dataclass
class FakeNode:
    """A node `here` with one local replica, beside remote ones."""

    cache_affinity: bool = False
    affinity: AffinityTable = field(
        default_factory=lambda: AffinityTable(max_entries=100, ttl=600.0, clock=lambda: 0.0)
    )
    cluster: FakeCluster = field(default_factory=FakeCluster)
    busy: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def lane_ready(self, cfg: Any, lane: str) -> bool:
        return True

    def replica_generation(self, node_id: str, local_id: str, lane: str) -> int | None:
        return 1

    def prompt_cost(self, node_id: str, local_id: str, lane: str) -> tuple[float, float] | None:
        return None


RECORD = {"has_llm": True, "has_image": True}


def local() -> Replica:
    return Replica(MODEL, "here", "m1", "", True, RECORD, cfg=cast(Any, object()))


def remote(node_id: str, available: bool = True) -> Replica:
    return Replica(MODEL, node_id, "m1", f"http://{node_id}", available, RECORD)


def pick(node: FakeNode, replicas: list[Replica], prompt: str = "", kind: Kind = "llm") -> str:
    doc = {"messages": [{"role": "user", "content": prompt * 300}]}
    prefix = fingerprints(doc) if prompt else ()
    return choose(cast(RoutingNode, node), MODEL, kind, replicas, prefix).node_id


@pytest.mark.parametrize("cache_affinity", [False, True])
def test_an_idle_local_replica_goes_first(cache_affinity: bool) -> None:
    node = FakeNode(cache_affinity=cache_affinity)

    assert [pick(node, [remote("a"), local()], f"q{i} ") for i in range(3)] == ["here"] * 3


@pytest.mark.parametrize("cache_affinity", [False, True])
def test_a_busy_local_replica_gives_way_to_the_remotes_in_turn(cache_affinity: bool) -> None:
    node = FakeNode(cache_affinity=cache_affinity)
    node.busy[("here", "m1", "text")] = 1
    replicas = [local(), remote("a"), remote("b")]

    assert [pick(node, replicas, f"q{i} ") for i in range(4)] == ["a", "b", "a", "b"]


def test_a_busy_local_replica_serves_when_no_remote_is_available() -> None:
    node = FakeNode()
    node.busy[("here", "m1", "text")] = 3

    assert pick(node, [remote("a", available=False), local()]) == "here"


def test_busy_on_another_lane_leaves_the_local_replica_idle() -> None:
    node = FakeNode()
    node.busy[("here", "m1", "text")] = 1

    assert pick(node, [remote("a"), local()], kind="image") == "here"
    assert pick(node, [remote("a"), local()], kind="llm") == "a"


def test_a_request_the_idle_local_replica_takes_leaves_the_remotes_turn_alone() -> None:
    node = FakeNode(cache_affinity=True)
    replicas = [local(), remote("a"), remote("b")]

    assert pick(node, replicas, "first ") == "here"
    node.busy[("here", "m1", "text")] = 1

    assert pick(node, replicas, "second ") == "a"
