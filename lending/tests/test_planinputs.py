"""The master's plan inputs, rebuilt only where they changed, equal what a fresh build gives.

``reference_owners`` builds a lane's owners from scratch, link by link, the way the master
did before it kept anything between plans (less the owners with nothing to lend, which the
planner passes over); ``LaneInputs`` must give the same owners, targets in the same order,
after any sequence of status, link and record changes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from lending.links import lane_endpoints, pair_ineligible_reason
from lending.planinputs import CostCache, LaneInputs, endpoint_of
from lending.planner import Endpoint, LinkTarget
from lending.pricing import CostTable, Lane

SEEDS = 200
STEPS = 8

Owners = dict[tuple[str, str], tuple[Endpoint, list[LinkTarget]]]


def reference_owners(
    lane: Lane,
    records: Sequence[Mapping[str, Any]],
    links: Sequence[Mapping[str, Any]],
    statuses: Mapping[str, Mapping[str, Any]],
    *,
    every: bool = False,
) -> Owners:
    endpoints = lane_endpoints(records, lane)
    owners: Owners = {}
    for link in links:
        owner = (link["owner_node_id"], link["owner_model_id"])
        helper = (link["helper_node_id"], link["helper_model_id"])
        if owner not in endpoints or helper not in endpoints:
            continue
        if owner[0] not in statuses or helper[0] not in statuses:
            continue
        if pair_ineligible_reason(lane, endpoints[owner], endpoints[helper]):
            continue
        made = endpoint_of(lane, endpoints[helper].record, helper[1], statuses[helper[0]])
        target = LinkTarget(
            made, bool(link["load_if_unloaded"]), bool(link["restore_after_borrow"])
        )
        if owner not in owners:
            mine = endpoint_of(lane, endpoints[owner].record, owner[1], statuses[owner[0]])
            owners[owner] = (mine, [])
        owners[owner][1].append(target)
    if every:
        return owners
    # The planner passes over an owner with nothing to lend: LaneInputs leaves it out.
    return {key: item for key, item in owners.items() if (item[0].lendable_count or 0) > 0}


def _record(rng: random.Random, node: str, model: str) -> dict[str, Any]:
    record: dict[str, Any] = {
        "node_id": node,
        "local_id": model,
        "filename": f"{model}.kcpps",
        "has_llm": True,
        "context_size": rng.choice([2048, 8192]),
        "has_multimodal": rng.random() < 0.1,
    }
    if rng.random() < 0.1:
        record["text_ineligible_reason"] = "serves requests in parallel"
    if rng.random() < 0.05:
        record["disabled"] = True
    return record


def _status(rng: random.Random, node: str, models: Sequence[str]) -> dict[str, Any]:
    return {
        "node_id": node,
        "active_text_config": f"{rng.choice(models)}.kcpps" if rng.random() < 0.7 else "",
        "accepting_borrowed_text": rng.random() < 0.8,
        "idle_for_ms": rng.choice([0, 1_000, 600_000]),
        "text_queue": [
            {"model_id": m, "pending_count": n, "lendable_count": n, "backlog_count": n}
            for m in models
            if (n := rng.choice([0, 0, 2, 9]))
        ],
        "costs": {
            "models": [],
            "loads": [{"config_filename": f"{models[0]}.kcpps", "load_ms": rng.choice([1.0, 2.0])}],
            "tokens": [],
        },
    }


def _link(rng: random.Random, nodes: Sequence[str], models: Sequence[str]) -> dict[str, Any]:
    owner, helper = rng.sample(list(nodes), 2)
    return {
        "owner_node_id": owner,
        "owner_model_id": rng.choice(models),
        "helper_node_id": helper,
        "helper_model_id": rng.choice(models),
        "load_if_unloaded": rng.random() < 0.5,
        "restore_after_borrow": rng.random() < 0.5,
    }


def _by_key(owners: list[tuple[Endpoint, list[LinkTarget]]]) -> Owners:
    return {(e.node_id, e.model_id): (e, targets) for e, targets in owners}


def test_kept_inputs_equal_a_fresh_build_after_any_changes() -> None:
    rebuilt_some = 0
    for seed in range(SEEDS):
        rng = random.Random(seed)
        nodes = [f"n{i}" for i in range(rng.randint(2, 8))]
        models = ["m", "q"][: rng.randint(1, 2)]
        records = [_record(rng, node, model) for node in nodes for model in models]
        links = [_link(rng, nodes, models) for _ in range(rng.randint(1, 3 * len(nodes)))]
        statuses = {node: _status(rng, node, models) for node in nodes}
        inputs = LaneInputs("text")
        for _ in range(STEPS):
            inputs.index(records, links)
            kept = _by_key(inputs.owners(statuses))
            assert kept == reference_owners("text", records, links, statuses), seed
            # Any owner, with nothing to lend too, one at a time (a lease it keeps is weighed
            # with it).
            every = reference_owners("text", records, links, statuses, every=True)
            for key, item in every.items():
                assert inputs.owner(key, statuses) == item, seed
            what = rng.random()
            statuses = dict(statuses)
            node = rng.choice(nodes)
            if what < 0.5:
                statuses[node] = _status(rng, node, models)
                rebuilt_some += 1
            elif what < 0.6:
                statuses.pop(node, None)  # silent: plans skip it
            elif what < 0.7:
                links = [dict(link) for link in links]  # the same links, new objects
            elif what < 0.8:
                links = [*links, _link(rng, nodes, models)]
            elif what < 0.85:
                records = [dict(r) for r in records]
                records[rng.randrange(len(records))] = _record(rng, node, rng.choice(models))
            elif what < 0.9:
                # A field the planner does not read (a model loaded): the same owners result.
                records = [dict(r) for r in records]
                records[rng.randrange(len(records))]["loaded"] = rng.random() < 0.5
    assert rebuilt_some > SEEDS


def test_an_owner_outside_the_change_keeps_its_very_endpoint() -> None:
    rng = random.Random(3)
    nodes = ["a", "b", "c", "d"]
    records = [{**_record(rng, n, "m"), "has_multimodal": False} for n in nodes]
    for record in records:
        record.pop("text_ineligible_reason", None)
        record.pop("disabled", None)
    links = [_link(rng, ["a", "b"], ["m"]), _link(rng, ["c", "d"], ["m"])]
    statuses = {node: _status(rng, node, ["m"]) for node in nodes}
    inputs = LaneInputs("text")
    inputs.index(records, links)
    first = _by_key(inputs.owners(statuses))
    owner_cd = links[1]["owner_node_id"]
    changed = {**statuses, "a": _status(rng, "a", ["m"])}
    inputs.index(records, [dict(link) for link in links])
    second = _by_key(inputs.owners(changed))
    assert second[(owner_cd, "m")][0] is first[(owner_cd, "m")][0]
    assert second[(owner_cd, "m")][1] is first[(owner_cd, "m")][1]
    assert inputs.neighbourhood((owner_cd, "m")) == {"c", "d"}


def test_the_cost_table_is_the_same_object_while_no_node_publishes_other_costs() -> None:
    rng = random.Random(5)
    statuses = {node: _status(rng, node, ["m"]) for node in "abc"}
    cache = CostCache()
    first = cache.table(statuses)
    assert isinstance(first, CostTable) and len(first.loads) == 3
    # New status documents with the same costs (the next poll round): the table is kept.
    again = {node: {**status, "costs": dict(status["costs"])} for node, status in statuses.items()}
    assert cache.table(again) is first
    other = {**again, "b": _status(random.Random(99), "b", ["m"])}
    other["b"]["costs"]["loads"][0]["load_ms"] = 7.0
    changed = cache.table(other)
    assert changed is not first and changed is not None and changed.loads[("b", "m.kcpps")] == 7.0
    assert cache.table({"a": {"node_id": "a"}}) is None
