"""Prefix fingerprints, the affinity table and the cache-affine choice among replicas."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from registry import affinity
from registry.affinity import (
    BLOCK_BYTES,
    LEVELS_KEPT,
    MIN_SAVING_MS,
    AffinityTable,
    Fingerprint,
    ReplicaKey,
    fingerprints,
    prefers_cached,
)
from registry.cluster import Replica
from registry.ports import RoutingNode
from registry.routing import choose

MODEL = "chat-model"
SYSTEM = {"role": "system", "content": "You answer briefly. " * 40}


def conversation(turns: int, tag: str = "c") -> list[dict[str, str]]:
    messages = [SYSTEM]
    for i in range(turns):
        if i:
            messages.append({"role": "assistant", "content": f"answer {tag} {i} " * 30})
        messages.append({"role": "user", "content": f"question {tag} {i} " * 30})
    return messages


def body(turns: int, tag: str = "c") -> dict[str, Any]:
    return {"model": MODEL, "messages": conversation(turns, tag)}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
    """The replica-choice view of a master with two remote replicas."""

    affinity: AffinityTable
    cache_affinity: bool = True
    cluster: FakeCluster = field(default_factory=FakeCluster)
    busy: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    recipes: dict[str, Any] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=lambda: {"a": 1, "b": 1})
    cost: tuple[float, float] | None = None

    def lane_ready(self, cfg: Any, lane: str) -> bool:
        return True

    def replica_generation(self, node_id: str, local_id: str, lane: str) -> int | None:
        return self.generations.get(node_id)

    def prompt_cost(self, node_id: str, local_id: str, lane: str) -> tuple[float, float] | None:
        return self.cost


def replica(node_id: str, available: bool = True) -> Replica:
    record = {"has_llm": True}
    return Replica(MODEL, node_id, "m1", f"http://{node_id}", available, record)


def make_node(**kw: Any) -> FakeNode:
    return FakeNode(affinity=AffinityTable(max_entries=1000, ttl=600.0, clock=Clock()), **kw)


def pick(node: FakeNode, doc: dict[str, Any], replicas: list[Replica] | None = None) -> str:
    found = replicas if replicas is not None else [replica("a"), replica("b")]
    chosen = choose(cast(RoutingNode, node), MODEL, "llm", found, fingerprints(doc))
    return chosen.node_id


# Fingerprints ----------------------------------------------------------------------------


def test_a_turn_shares_the_fingerprint_of_the_whole_previous_turn() -> None:
    turn1, turn2 = fingerprints(body(1)), fingerprints(body(2))
    assert turn1[-1] in turn2
    # The longest shared boundary covers turn 1's messages; turn 2 goes further.
    assert turn2[-1].prefix_bytes > turn1[-1].prefix_bytes
    assert fingerprints(body(2, tag="other"))[-1] != turn2[-1]


def test_fingerprints_keep_digests_and_sizes_only() -> None:
    prints = fingerprints(body(3))
    assert 0 < len(prints) <= LEVELS_KEPT
    for fp in prints:
        assert set(fp._fields) == {"digest", "prefix_bytes"}
        assert len(fp.digest) == 16
        assert b"question" not in fp.digest


def test_the_work_per_request_is_bounded() -> None:
    long_chat = {"messages": [{"role": "user", "content": str(i)} for i in range(5000)]}
    prints = fingerprints(long_chat)
    assert len(prints) == LEVELS_KEPT
    # Past MAX_LEVELS messages nothing more is hashed: the longest print stops there.
    capped = {"messages": long_chat["messages"][: affinity.MAX_LEVELS]}
    assert prints[-1] == fingerprints(capped)[-1]


def test_a_completion_prompt_is_fingerprinted_in_whole_blocks() -> None:
    text = "x" * (BLOCK_BYTES * 3 + 100)
    prints = fingerprints({"prompt": text})
    assert [fp.prefix_bytes for fp in prints] == [BLOCK_BYTES, 2 * BLOCK_BYTES, 3 * BLOCK_BYTES]
    assert fingerprints({"prompt": "x" * (BLOCK_BYTES - 1)}) == []
    assert fingerprints({"prompt": ["token", "list"]}) == []


# The table -------------------------------------------------------------------------------


def test_the_table_stays_within_its_bound_under_100k_conversations() -> None:
    node = make_node()
    node.affinity.max_entries = 500
    for i in range(100_000):
        pick(node, {"messages": [{"role": "user", "content": f"conversation {i}"}]})
        assert len(node.affinity) <= 500
    assert len(node.affinity) == 500
    # The newest conversation is still known, the oldest was evicted.
    newest = fingerprints({"messages": [{"role": "user", "content": "conversation 99999"}]})
    oldest = fingerprints({"messages": [{"role": "user", "content": "conversation 0"}]})
    table = node.affinity
    assert table.lookup(MODEL, "text", newest, lambda key: 1) is not None
    assert table.lookup(MODEL, "text", oldest, lambda key: 1) is None


def test_an_entry_expires_after_the_ttl() -> None:
    clock = Clock()
    table = AffinityTable(max_entries=10, ttl=60.0, clock=clock)
    prints = [Fingerprint(b"d" * 16, 4000)]
    table.remember(MODEL, "text", prints, ReplicaKey("a", "m1"), 1)
    clock.now += 59.9
    assert table.lookup(MODEL, "text", prints, lambda key: 1) is not None
    clock.now += 0.1
    assert table.lookup(MODEL, "text", prints, lambda key: 1) is None
    assert len(table) == 0


def test_a_node_going_down_drops_its_entries() -> None:
    table = AffinityTable(max_entries=10, ttl=60.0)
    table.remember(MODEL, "text", [Fingerprint(b"a" * 16, 400)], ReplicaKey("a", "m1"), 1)
    table.remember(MODEL, "text", [Fingerprint(b"b" * 16, 400)], ReplicaKey("b", "m1"), 1)
    assert table.drop_node("a") == 1
    assert len(table) == 1


# The choice ------------------------------------------------------------------------------


def test_with_the_setting_off_replicas_keep_their_rotation() -> None:
    node = make_node(cache_affinity=False)
    chosen = [pick(node, body(turn)) for turn in range(1, 7)]
    assert chosen == ["a", "b", "a", "b", "a", "b"]
    assert len(node.affinity) == 0
    assert node.affinity.stats() == {}


def test_prompts_with_no_shared_prefix_follow_the_rotation_exactly() -> None:
    def unrelated(i: int) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": f"{i:06d} unrelated " * 300}]}

    on, off = make_node(), make_node(cache_affinity=False)
    with_affinity = [pick(on, unrelated(i)) for i in range(8)]
    assert with_affinity == [pick(off, unrelated(i)) for i in range(8)]
    assert on.affinity.stats()[MODEL] == {"hits": 0, "misses": 8, "overrides": 0}


def test_turn_n_plus_1_lands_where_turn_n_ran() -> None:
    node = make_node()
    first = pick(node, body(1, "x"))
    other = pick(node, body(1, "y"))
    assert first != other  # new conversations still rotate
    for turn in range(2, 7):
        assert pick(node, body(turn, "x")) == first
        assert pick(node, body(turn, "y")) == other
    assert node.affinity.stats()[MODEL] == {"hits": 10, "misses": 2, "overrides": 0}


def test_a_turn_sent_back_to_its_cache_takes_no_turn_of_the_rotation() -> None:
    node = make_node()
    placed = []
    for tag in "uvwxyz":
        placed.append(pick(node, body(1, tag)))
        # Its second turn goes back to its cache before the next conversation starts.
        assert pick(node, body(2, tag)) == placed[-1]
    # New conversations alternate: a turn steered by the cache left the counter alone.
    assert placed == ["a", "b", "a", "b", "a", "b"]


def test_a_pick_the_cache_is_passed_over_for_takes_its_turn() -> None:
    node = make_node(cost=(100.0, 2.0))
    short = {"messages": [{"role": "user", "content": "hi"}]}
    assert pick(node, short) == "a"
    assert pick(node, short) == "b"  # an override: the rotation's pick, its turn taken
    assert pick(node, body(1, "new")) == "a"


def test_identical_short_single_shots_keep_rotating_when_priced() -> None:
    node = make_node(cost=(100.0, 2.0))
    short = {"messages": [{"role": "user", "content": "hi"}]}
    # The cached prefix saves 2 ms/token x a few tokens, under MIN_SAVING_MS: rotation wins.
    assert [pick(node, short) for _ in range(4)] == ["a", "b", "a", "b"]
    # Each repeat finds the previous one's replica and passes it over.
    assert node.affinity.stats()[MODEL] == {"hits": 0, "misses": 1, "overrides": 3}


def _busy_case(busy_on_cached: int) -> tuple[FakeNode, str, str]:
    node = make_node(cost=(100.0, 2.0))
    cached = pick(node, body(1, "x"))
    node.busy[(cached, "m1", "text")] = busy_on_cached
    return node, cached, pick(node, body(2, "x"))


def test_a_busy_cached_replica_loses_to_an_idle_one_when_the_saving_is_smaller() -> None:
    matched = fingerprints(body(1, "x"))[-1].tokens
    request = fingerprints(body(2, "x"))[-1].tokens
    saving = 2.0 * matched
    job = 100.0 + 2.0 * (request - matched)
    # The exact crossing: n jobs in flight wait n x job; the saving is fixed.
    crossing = int(saving // job)
    assert crossing >= 1
    node, cached, chosen = _busy_case(crossing)
    assert chosen == cached and crossing * job < saving
    node, cached, chosen = _busy_case(crossing + 1)
    assert chosen != cached and (crossing + 1) * job > saving
    assert node.affinity.stats()[MODEL]["overrides"] == 1


def test_the_rule_in_exact_numbers() -> None:
    def stays(cached: int, uncached: int, cost: tuple[float, float] | None, busy: int = 1) -> bool:
        return prefers_cached(
            cached_tokens=cached,
            uncached_tokens=uncached,
            cost=cost,
            cached_busy=busy + 2,
            other_busy=2,
        )

    # Priced at 100 ms + 2 ms a token: 500 cached tokens save 1000 ms, and the extra wait
    # (one job: 100 + 2 x uncached) must be strictly below it.
    assert stays(500, 449, (100.0, 2.0))
    assert not stays(500, 450, (100.0, 2.0))
    # It is the difference of waits that counts: two jobs more wait twice as long.
    assert stays(500, 199, (100.0, 2.0), busy=2)
    assert not stays(500, 200, (100.0, 2.0), busy=2)
    # Savings under the threshold rotate even with nothing in flight.
    assert MIN_SAVING_MS == 50.0
    assert stays(100, 0, (0.0, 0.5), busy=0)
    assert not stays(99, 0, (0.0, 0.5), busy=0)
    # Unpriced: counted in prompt tokens, one job more waits its uncached prompt.
    assert stays(1000, 999, None)
    assert not stays(1000, 1000, None)
    assert stays(1000, 499, None, busy=2)
    assert not stays(1000, 500, None, busy=2)
    # With no extra wait it stays however little is cached.
    assert stays(1, 10_000, None, busy=0)
    assert stays(1, 10_000, None, busy=-1)


def test_affinity_is_dropped_when_the_model_is_switched() -> None:
    node = make_node()
    cached = pick(node, body(1, "x"))
    node.generations[cached] += 1  # its runtime loaded another model and came back
    chosen = pick(node, body(2, "x"))
    stats = node.affinity.stats()[MODEL]
    assert stats["misses"] == 2 and stats["hits"] == 0
    # The new holder is remembered under the new generation.
    assert pick(node, body(3, "x")) == chosen


def test_affinity_is_dropped_when_the_node_goes_down() -> None:
    node = make_node()
    cached = pick(node, body(1, "x"))
    other = "b" if cached == "a" else "a"
    down = [replica(cached, available=False), replica(other)]
    assert pick(node, body(2, "x"), down) == other
    assert node.affinity.stats()[MODEL]["misses"] == 2
    # Back up, the conversation stays where its cache now is.
    assert pick(node, body(3, "x")) == other


@pytest.mark.parametrize("ready", [True, False])
def test_a_replica_that_is_not_loaded_holds_no_cache(ready: bool) -> None:
    node = make_node()
    cached = pick(node, body(1, "x"))
    if not ready:
        del node.generations[cached]
    expected = cached if ready else ("b" if cached == "a" else "a")
    assert pick(node, body(2, "x")) == expected


def test_the_match_names_the_replica_chosen_for_its_cache_and_the_prefix_it_holds() -> None:
    node = make_node()
    first = pick(node, body(1, "x"))
    match = affinity.PrefixMatch()
    doc = body(2, "x")
    chosen = choose(
        cast(RoutingNode, node),
        MODEL,
        "llm",
        [replica("a"), replica("b")],
        fingerprints(doc),
        match,
    )
    assert chosen.node_id == first
    held = fingerprints(body(1, "x"))[-1].prefix_bytes
    assert match.replica == ReplicaKey(first, "m1")
    assert match.bytes_on(first, "m1") == held
    assert match.bytes_on("b" if first == "a" else "a", "m1") == 0


def test_a_replica_chosen_over_the_cache_gets_no_match() -> None:
    node = make_node(cost=(100.0, 2.0))
    cached = pick(node, body(1, "x"))
    node.busy[(cached, "m1", "text")] = 50
    match = affinity.PrefixMatch()
    chosen = choose(
        cast(RoutingNode, node),
        MODEL,
        "llm",
        [replica("a"), replica("b")],
        fingerprints(body(2, "x")),
        match,
    )
    assert chosen.node_id != cached
    assert match.replica is None and match.bytes_on(chosen.node_id, "m1") == 0
