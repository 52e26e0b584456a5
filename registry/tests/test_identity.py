from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from registry.identity import (
    Assignment,
    IdentityKey,
    MergedView,
    deserialize_assignments,
    forget_node,
    identity_of,
    merge,
    serialize_assignments,
)

MASTER = "master"
MASTER_URL = "http://127.0.0.1:5001"


def rec(
    local_id: str,
    node_id: str,
    model: str = "m",
    *,
    config: str | None = None,
    source: str | None = None,
    image_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A ModelRecord shaped like ModelConfig.to_record(); `model` names the weights identity."""
    record: dict[str, Any] = {"public_id": local_id, "local_id": local_id}
    if image_id is not None:
        record["image_id"] = image_id
        record["public_image_id"] = image_id
    record.update(
        {
            "filename": f"{local_id}.kcpps",
            "created": 1_700_000_000,
            "size": 1234,
            "has_llm": True,
            "has_image": image_id is not None,
            "model_hash": "" if model == "" else f"mh-{model}",
            "config_hash": (f"ch-{model}" if model else "") if config is None else config,
            "capabilities": {"llm": True, "context": 4096},
            "options": {"contextsize": 4096, "gpulayers": 99},
            "backend_mode": "kobold",
            "source": source or ("master" if node_id == MASTER else "slave"),
            "node_id": node_id,
            "node_url": MASTER_URL if node_id == MASTER else f"http://{node_id}.lan:5001",
            "available": True,
            "loaded": False,
        }
    )
    record.update(extra)
    return record


def run(
    local: Sequence[Mapping[str, Any]],
    remote: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    previous: Mapping[IdentityKey, Assignment] | None = None,
) -> MergedView:
    return merge(local, remote or {}, previous=previous or {})


def ids(view: MergedView) -> dict[tuple[str, str], str]:
    """(node_id, local_id) → public id; fails if a config shows up under two public ids."""
    found: dict[tuple[str, str], str] = {}
    for record in view.records:
        key = (record["node_id"], record["local_id"])
        assert found.setdefault(key, record["public_id"]) == record["public_id"]
    return found


# --- identity_of -------------------------------------------------------------------------


def test_identity_is_the_model_hash_and_config_hash_joined_by_a_colon() -> None:
    assert identity_of({"model_hash": "abc", "config_hash": "def"}) == "abc:def"


def test_identity_with_only_one_hash_empty_is_still_a_content_identity() -> None:
    assert identity_of({"model_hash": "", "config_hash": "def", "node_id": "a"}) == ":def"


def test_identity_without_any_hash_is_unique_to_the_node_and_config() -> None:
    record = {"model_hash": "", "config_hash": "", "node_id": "a", "local_id": "x"}
    assert identity_of(record) == "unknown:a:x"
    assert identity_of(record | {"node_id": "b"}) != identity_of(record)


def test_identity_treats_missing_hashes_as_empty() -> None:
    assert identity_of({"node_id": "a", "local_id": "x"}) == "unknown:a:x"


# --- merging and suffixing ---------------------------------------------------------------


def test_records_with_the_same_hashes_become_replicas_under_one_public_id() -> None:
    view = run([rec("x", MASTER, "A")], {"b": [rec("x", "b", "A")], "a": [rec("x", "a", "A")]})

    assert ids(view) == {(MASTER, "x"): "x", ("a", "x"): "x", ("b", "x"): "x"}
    assert [r["node_id"] for r in view.by_public_id["x"]] == ["a", "b", MASTER]
    assert list(view.by_public_id) == ["x"]


def test_conflicting_hashes_get_suffixes_2_and_3_in_node_order() -> None:
    view = run(
        [rec("x", MASTER, "M")],
        {"c": [rec("x", "c", "C")], "b": [rec("x", "b", "B")], "d": [rec("x", "d", "B")]},
    )

    assert ids(view) == {
        (MASTER, "x"): "x",
        ("b", "x"): "x-2",
        ("c", "x"): "x-3",
        ("d", "x"): "x-2",
    }
    assert sorted(view.by_public_id) == ["x", "x-2", "x-3"]


def test_suffixes_do_not_depend_on_the_order_slaves_are_listed_in() -> None:
    # B's replicas are on b and d: its rank is its smallest node, b, whichever came in first.
    expected = {
        (MASTER, "x"): "x",
        ("b", "x"): "x-2",
        ("c", "x"): "x-3",
        ("d", "x"): "x-2",
    }
    snapshots = {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "C")], "d": [rec("x", "d", "B")]}
    for order in (["d", "c", "b"], ["c", "d", "b"], ["b", "c", "d"]):
        view = run([rec("x", MASTER, "M")], {node: snapshots[node] for node in order})
        assert ids(view) == expected, order


def test_a_different_config_hash_alone_is_a_conflict() -> None:
    view = run([rec("x", MASTER, "A")], {"b": [rec("x", "b", "A", config="ch-other")]})

    assert ids(view) == {(MASTER, "x"): "x", ("b", "x"): "x-2"}


def test_configs_with_different_local_ids_never_merge_even_with_equal_hashes() -> None:
    view = run([rec("x", MASTER, "A")], {"b": [rec("y", "b", "A")]})

    assert ids(view) == {(MASTER, "x"): "x", ("b", "y"): "y"}


def test_records_without_hashes_are_never_merged() -> None:
    view = run(
        [rec("x", MASTER, "")],
        {"a": [rec("x", "a", "")], "b": [rec("x", "b", "")]},
    )

    assert ids(view) == {(MASTER, "x"): "x", ("a", "x"): "x-2", ("b", "x"): "x-3"}
    assert all(len(replicas) == 1 for replicas in view.by_public_id.values())


def test_records_without_hashes_keep_their_suffix_when_another_node_joins() -> None:
    first = run([rec("x", MASTER, "")], {"b": [rec("x", "b", "")]})
    second = run(
        [rec("x", MASTER, "")],
        {"a": [rec("x", "a", "")], "b": [rec("x", "b", "")]},
        first.assignments,
    )

    assert ids(second) == {(MASTER, "x"): "x", ("b", "x"): "x-2", ("a", "x"): "x-3"}


def test_the_master_keeps_the_bare_id_when_slaves_sort_before_it() -> None:
    view = run([rec("x", "zz-master", "M")], {"aa": [rec("x", "aa", "A")]})

    assert ids(view) == {("zz-master", "x"): "x", ("aa", "x"): "x-2"}


def test_a_local_record_keeps_the_bare_id_on_a_standalone_node_too() -> None:
    view = run([rec("x", "zz", "M", source="local")], {"aa": [rec("x", "aa", "A")]})

    assert ids(view)[("zz", "x")] == "x"
    assert view.by_public_id["x"][0]["source"] == "local"


def test_a_slave_claiming_to_be_the_master_does_not_take_the_bare_id() -> None:
    view = run([rec("x", "zz", "M")], {"aa": [rec("x", "aa", "A", source="master")]})

    assert ids(view) == {("zz", "x"): "x", ("aa", "x"): "x-2"}


def test_local_records_from_several_nodes_rank_by_their_smallest_node_in_any_order() -> None:
    local = [rec("x", "zz", "A"), rec("x", "mm", "B"), rec("x", "aa", "A")]

    for order in (local, local[::-1], [local[1], local[0], local[2]]):
        assert ids(run(order)) == {("aa", "x"): "x", ("zz", "x"): "x", ("mm", "x"): "x-2"}


def test_a_remote_record_is_filed_under_the_node_that_sent_it() -> None:
    view = run([rec("x", MASTER, "M")], {"b": [rec("x", MASTER, "B")]})

    assert ids(view) == {(MASTER, "x"): "x", ("b", "x"): "x-2"}
    assert view.by_public_id["x-2"][0]["node_id"] == "b"


def test_a_slave_alone_gets_the_bare_id() -> None:
    view = run([], {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "C")]})

    assert ids(view) == {("b", "x"): "x", ("c", "x"): "x-2"}


# --- stability across membership changes and restarts ------------------------------------


def test_a_new_slave_that_sorts_first_does_not_shift_an_existing_suffix() -> None:
    before = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")]})
    assert ids(before)[("b", "x")] == "x-2"

    after = run(
        [rec("x", MASTER, "M")],
        {"a": [rec("x", "a", "A")], "b": [rec("x", "b", "B")]},
        before.assignments,
    )

    assert ids(after) == {(MASTER, "x"): "x", ("b", "x"): "x-2", ("a", "x"): "x-3"}


def test_the_reference_order_would_have_shifted_that_suffix_without_a_table() -> None:
    # Guards the test above: with no history, node order alone decides.
    view = run([rec("x", MASTER, "M")], {"a": [rec("x", "a", "A")], "b": [rec("x", "b", "B")]})

    assert ids(view) == {(MASTER, "x"): "x", ("a", "x"): "x-2", ("b", "x"): "x-3"}


def test_a_node_that_leaves_and_rejoins_gets_its_old_suffix_back() -> None:
    full = {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "C")]}
    first = run([rec("x", MASTER, "M")], full)
    assert ids(first)[("b", "x")] == "x-2"

    without_b = run([rec("x", MASTER, "M")], {"c": full["c"]}, first.assignments)
    assert ids(without_b) == {(MASTER, "x"): "x", ("c", "x"): "x-3"}
    assert without_b.assignments[("b", "x", "mh-B:ch-B")].public_id == "x-2"

    back = run([rec("x", MASTER, "M")], full, without_b.assignments)
    assert ids(back) == ids(first)
    assert back.assignments == first.assignments


def test_a_suffix_of_a_departed_node_is_not_given_to_a_newcomer() -> None:
    first = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")]})
    newcomer = run([rec("x", MASTER, "M")], {"n": [rec("x", "n", "N")]}, first.assignments)
    assert ids(newcomer) == {(MASTER, "x"): "x", ("n", "x"): "x-3"}

    both = run(
        [rec("x", MASTER, "M")],
        {"b": [rec("x", "b", "B")], "n": [rec("x", "n", "N")]},
        newcomer.assignments,
    )
    assert ids(both) == {(MASTER, "x"): "x", ("b", "x"): "x-2", ("n", "x"): "x-3"}


def test_forgetting_a_removed_node_frees_its_suffix() -> None:
    first = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")]})
    table = forget_node(first.assignments, node_id="b")

    assert [key[0] for key in table] == [MASTER]
    newcomer = run([rec("x", MASTER, "M")], {"n": [rec("x", "n", "N")]}, table)
    assert ids(newcomer)[("n", "x")] == "x-2"


def test_a_departed_nodes_bare_id_goes_to_the_next_model_that_needs_it() -> None:
    first = run([], {"b": [rec("x", "b", "B")]})
    later = run([rec("x", MASTER, "M")], {}, first.assignments)
    assert ids(later) == {(MASTER, "x"): "x"}
    # b's entry is dropped: its id now names another model.
    assert ("b", "x", "mh-B:ch-B") not in later.assignments

    back = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")]}, later.assignments)
    assert ids(back) == {(MASTER, "x"): "x", ("b", "x"): "x-2"}


def test_a_newcomer_with_the_model_of_a_departed_node_gets_that_models_id() -> None:
    first = run(
        [rec("x", MASTER, "M")],
        {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "C")]},
    )
    assert ids(first)[("c", "x")] == "x-3"

    view = run(
        [rec("x", MASTER, "M")],
        {"b": [rec("x", "b", "B")], "d": [rec("x", "d", "C")]},
        first.assignments,
    )
    assert ids(view)[("d", "x")] == "x-3"

    back = run(
        [rec("x", MASTER, "M")],
        {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "C")], "d": [rec("x", "d", "C")]},
        view.assignments,
    )
    assert ids(back) == {
        (MASTER, "x"): "x",
        ("b", "x"): "x-2",
        ("c", "x"): "x-3",
        ("d", "x"): "x-3",
    }


def test_an_existing_public_id_outranks_the_masters_claim_to_the_bare_id() -> None:
    first = run([], {"b": [rec("x", "b", "B")]})
    later = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")]}, first.assignments)

    assert ids(later) == {("b", "x"): "x", (MASTER, "x"): "x-2"}


def test_editing_the_masters_config_keeps_its_bare_id() -> None:
    first = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")]})
    edited = run(
        [rec("x", MASTER, "M", config="ch-edited")], {"b": [rec("x", "b", "B")]}, first.assignments
    )

    assert ids(edited) == {(MASTER, "x"): "x", ("b", "x"): "x-2"}
    assert (MASTER, "x", "mh-M:ch-M") not in edited.assignments


def test_editing_a_slaves_config_keeps_its_suffix() -> None:
    remote = {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "C")]}
    first = run([rec("x", MASTER, "M")], remote)
    edited = run(
        [rec("x", MASTER, "M")],
        {"b": [rec("x", "b", "B2")], "c": [rec("x", "c", "C")]},
        first.assignments,
    )

    assert ids(edited) == {(MASTER, "x"): "x", ("b", "x"): "x-2", ("c", "x"): "x-3"}


def test_an_edited_config_does_not_take_the_id_of_a_replica_that_is_offline() -> None:
    first = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "B")]})
    assert ids(first)[("b", "x")] == "x-2"

    edited = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B2")]}, first.assignments)
    assert ids(edited) == {(MASTER, "x"): "x", ("b", "x"): "x-3"}

    back = run(
        [rec("x", MASTER, "M")],
        {"b": [rec("x", "b", "B2")], "c": [rec("x", "c", "B")]},
        edited.assignments,
    )
    assert ids(back) == {(MASTER, "x"): "x", ("b", "x"): "x-3", ("c", "x"): "x-2"}


def test_a_departed_real_config_keeps_its_name_from_generated_ids() -> None:
    first = run([rec("x", MASTER, "M")], {"z": [rec("x-2", "z", "R")]})
    view = run([rec("x", MASTER, "M")], {"a": [rec("x", "a", "A")]}, first.assignments)

    assert ids(view) == {(MASTER, "x"): "x", ("a", "x"): "x-3"}


def test_a_config_that_becomes_a_replica_joins_the_existing_model() -> None:
    first = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "C")]})
    view = run(
        [rec("x", MASTER, "M")],
        {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "B")]},
        first.assignments,
    )

    assert ids(view) == {(MASTER, "x"): "x", ("b", "x"): "x-2", ("c", "x"): "x-2"}


def test_restarting_with_the_returned_table_reproduces_the_view_exactly() -> None:
    local = [
        rec("x", MASTER, "M"),
        rec("y", MASTER, ""),
        rec("img", MASTER, "I", image_id="img-sd"),
    ]
    remote = {
        "a": [rec("x", "a", "A"), rec("y", "a", ""), rec("img", "a", "J", image_id="img-sd")],
        "b": [rec("x", "b", "M"), rec("x-2", "b", "R")],
    }
    first = run(local, remote)
    again = run(local, remote, first.assignments)
    stored = deserialize_assignments(
        json.loads(json.dumps(serialize_assignments(again.assignments)))
    )
    after_restart = run(local, remote, stored)

    assert again == first
    assert after_restart == first


def test_the_returned_table_holds_every_key_in_the_view() -> None:
    view = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B"), rec("y", "b", "")]})

    assert view.assignments == {
        (MASTER, "x", "mh-M:ch-M"): Assignment(MASTER, "x", "mh-M:ch-M", "x"),
        ("b", "x", "mh-B:ch-B"): Assignment("b", "x", "mh-B:ch-B", "x-2"),
        ("b", "y", "unknown:b:y"): Assignment("b", "y", "unknown:b:y", "y"),
    }


# --- generated ids never collide ---------------------------------------------------------


def test_a_real_config_named_like_a_suffix_is_never_shadowed() -> None:
    view = run(
        [rec("x", MASTER, "M"), rec("x-2", MASTER, "R")],
        {"a": [rec("x", "a", "A")], "b": [rec("x", "b", "B")]},
    )

    assert ids(view) == {
        (MASTER, "x"): "x",
        (MASTER, "x-2"): "x-2",
        ("a", "x"): "x-3",
        ("b", "x"): "x-4",
    }


def test_a_real_config_on_a_slave_named_like_a_suffix_is_never_shadowed() -> None:
    view = run([rec("x", MASTER, "M")], {"a": [rec("x", "a", "A")], "z": [rec("x-2", "z", "R")]})

    assert ids(view) == {(MASTER, "x"): "x", ("a", "x"): "x-3", ("z", "x-2"): "x-2"}


def test_a_real_config_that_appears_later_takes_its_name_from_a_generated_id() -> None:
    first = run([rec("x", MASTER, "M")], {"a": [rec("x", "a", "A")]})
    assert ids(first)[("a", "x")] == "x-2"

    later = run(
        [rec("x", MASTER, "M")],
        {"a": [rec("x", "a", "A")], "z": [rec("x-2", "z", "R")]},
        first.assignments,
    )

    assert ids(later) == {(MASTER, "x"): "x", ("a", "x"): "x-3", ("z", "x-2"): "x-2"}
    assert later.assignments[("a", "x", "mh-A:ch-A")].public_id == "x-3"


def test_suffixes_of_a_config_named_like_a_suffix_stay_apart_from_the_base() -> None:
    view = run(
        [rec("x", MASTER, "M"), rec("x-2", MASTER, "R")],
        {"a": [rec("x", "a", "A"), rec("x-2", "a", "S")]},
    )

    assert ids(view) == {
        (MASTER, "x"): "x",
        (MASTER, "x-2"): "x-2",
        ("a", "x"): "x-3",
        ("a", "x-2"): "x-2-2",
    }


def test_a_departed_nodes_id_taken_by_a_real_config_is_dropped_from_the_table() -> None:
    first = run([rec("x", MASTER, "M")], {"a": [rec("x", "a", "A")]})
    later = run([rec("x", MASTER, "M"), rec("x-2", MASTER, "R")], {}, first.assignments)

    assert ids(later) == {(MASTER, "x"): "x", (MASTER, "x-2"): "x-2"}
    assert ("a", "x", "mh-A:ch-A") not in later.assignments


def test_a_corrupt_table_giving_one_id_to_two_models_resolves_by_rank() -> None:
    table = {
        ("b", "x", "mh-B:ch-B"): Assignment("b", "x", "mh-B:ch-B", "x-2"),
        ("c", "x", "mh-C:ch-C"): Assignment("c", "x", "mh-C:ch-C", "x-2"),
    }
    view = run(
        [rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")], "c": [rec("x", "c", "C")]}, table
    )

    assert ids(view) == {(MASTER, "x"): "x", ("b", "x"): "x-2", ("c", "x"): "x-3"}


@pytest.mark.parametrize("stale", ["y", "x-1", "x-02", "x-abc", "x-", "x-²"])
def test_a_previous_id_that_does_not_belong_to_the_config_is_ignored(stale: str) -> None:
    table = {("b", "x", "mh-B:ch-B"): Assignment("b", "x", "mh-B:ch-B", stale)}
    view = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B")]}, table)

    assert ids(view) == {(MASTER, "x"): "x", ("b", "x"): "x-2"}


# --- public image ids --------------------------------------------------------------------


def test_an_image_id_with_the_local_prefix_gets_the_public_prefix() -> None:
    view = run(
        [rec("same", MASTER, "M", image_id="same-dream")],
        {"b": [rec("same", "b", "B", image_id="same-dream")]},
    )

    assert [r["public_image_id"] for r in view.by_public_id["same"]] == ["same-dream"]
    assert [r["public_image_id"] for r in view.by_public_id["same-2"]] == ["same-2-dream"]
    assert sorted(view.by_public_image_id) == ["same-2-dream", "same-dream"]


def test_an_unprefixed_image_id_is_unchanged_under_the_bare_id() -> None:
    view = run([rec("x", MASTER, "M", image_id="dream")])

    assert view.records[0]["public_image_id"] == "dream"


def test_an_unprefixed_image_id_gets_the_suffixed_public_id_prepended() -> None:
    view = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B", image_id="dream")]})

    assert view.by_public_id["x-2"][0]["public_image_id"] == "x-2-dream"
    assert view.by_public_image_id == {"x-2-dream": view.by_public_id["x-2"]}


def test_a_record_without_an_image_id_has_no_public_image_id() -> None:
    stale = rec("x", "b", "B") | {"public_image_id": "x-leftover"}
    view = run([rec("x", MASTER, "M")], {"b": [stale]})

    assert all("public_image_id" not in r for r in view.records)
    assert view.by_public_image_id == {}


def test_a_public_image_id_sent_by_a_slave_is_recomputed() -> None:
    sent = rec("x", "b", "B", image_id="x-dream") | {"public_image_id": "x-dream"}
    view = run([rec("x", MASTER, "M")], {"b": [sent]})

    assert view.by_public_id["x-2"][0]["public_image_id"] == "x-2-dream"


# --- records -----------------------------------------------------------------------------


def test_records_are_copied_and_every_other_field_is_carried_through() -> None:
    local = [rec("x", MASTER, "M", benchmark={"tps": 12.5}, served_names=["alias"])]
    remote = {"b": [rec("x", "b", "B", image_id="x-dream", available=False, asset_state="ok")]}
    local_before = copy.deepcopy(local)
    remote_before = copy.deepcopy(remote)

    view = run(local, remote)

    assert local == local_before
    assert remote == remote_before
    by_node = {r["node_id"]: r for r in view.records}
    assert by_node[MASTER] == local_before[0] | {"public_id": "x"}
    assert by_node["b"] == remote_before["b"][0] | {
        "public_id": "x-2",
        "public_image_id": "x-2-dream",
    }
    assert by_node[MASTER] is not local[0]


def test_records_are_sorted_by_public_id_then_node_and_local_id() -> None:
    view = run(
        [rec("b", MASTER, "M"), rec("a", MASTER, "M")],
        {"n2": [rec("a", "n2", "M")], "n1": [rec("b", "n1", "O"), rec("a", "n1", "M")]},
    )

    assert [(r["public_id"], r["node_id"]) for r in view.records] == [
        ("a", MASTER),
        ("a", "n1"),
        ("a", "n2"),
        ("b", MASTER),
        ("b-2", "n1"),
    ]


def test_alias_records_of_one_config_share_its_public_id() -> None:
    primary = rec("x", "b", "B")
    alias = rec("x", "b", "B", served_names=["chat"], alias_of="x")
    view = run([rec("x", MASTER, "M")], {"b": [alias, primary]})

    assert sorted(str(r.get("alias_of")) for r in view.by_public_id["x-2"]) == ["None", "x"]
    assert run([rec("x", MASTER, "M")], {"b": [primary, alias]}) == view


def test_a_record_without_a_local_id_is_rejected() -> None:
    bad = rec("x", "b", "B") | {"local_id": ""}

    with pytest.raises(ValueError, match="'b'"):
        run([], {"b": [bad]})


def test_the_view_does_not_depend_on_input_order() -> None:
    local = [rec(f"m{i}", MASTER, "M") for i in range(6)]
    remote = {
        node: [rec(f"m{i}", node, "M" if (i + j) % 3 == 0 else f"{node}{i % 2}") for i in range(6)]
        + [rec("m0", node, "M", served_names=[f"alias-{node}"], alias_of="m0")]
        + [rec("e", node, "")]
        for j, node in enumerate(["n3", "n1", "n2", "n0"])
    }
    table = run(local, {k: v for k, v in remote.items() if k != "n1"}).assignments
    expected = run(local, remote, table)

    rng = random.Random(7)
    for _ in range(20):
        shuffled_local = rng.sample(local, len(local))
        nodes = rng.sample(list(remote), len(remote))
        shuffled_remote = {node: rng.sample(remote[node], len(remote[node])) for node in nodes}
        assert run(shuffled_local, shuffled_remote, table) == expected


# --- persistence -------------------------------------------------------------------------


def test_the_table_survives_a_json_round_trip() -> None:
    view = run([rec("x", MASTER, "M")], {"b": [rec("x", "b", "B"), rec("y", "b", "")]})
    rows = serialize_assignments(view.assignments)

    assert rows == sorted(rows, key=lambda row: (row["node_id"], row["local_id"], row["identity"]))
    assert rows[0] == {"node_id": "b", "local_id": "x", "identity": "mh-B:ch-B", "public_id": "x-2"}
    assert deserialize_assignments(json.loads(json.dumps(rows))) == view.assignments


def test_an_empty_table_serializes_to_an_empty_list() -> None:
    assert serialize_assignments({}) == []
    assert deserialize_assignments([]) == {}


@pytest.mark.parametrize(
    "row",
    [
        {"node_id": "b", "local_id": "x", "identity": "i"},
        {"node_id": "b", "local_id": "x", "identity": "i", "public_id": 2},
        ["b", "x", "i", "x-2"],
    ],
)
def test_a_malformed_row_is_rejected(row: Any) -> None:
    with pytest.raises(ValueError, match="row 0"):
        deserialize_assignments([row])


def test_a_duplicate_row_is_rejected() -> None:
    row = {"node_id": "b", "local_id": "x", "identity": "i", "public_id": "x-2"}

    with pytest.raises(ValueError, match="duplicate"):
        deserialize_assignments([row, row | {"public_id": "x-3"}])


# --- scale -------------------------------------------------------------------------------

NODE_COUNT = 50
MODELS_PER_NODE = 40


def large_cluster() -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Model j exists in j % 5 + 1 variants; node i runs variant i % (j % 5 + 1)."""
    local = [
        rec(f"m{j:02}", MASTER, f"{j}-v0", image_id=f"m{j:02}-sd") for j in range(MODELS_PER_NODE)
    ]
    remote = {
        f"n{i:02}": [
            rec(f"m{j:02}", f"n{i:02}", f"{j}-v{i % (j % 5 + 1)}", image_id=f"m{j:02}-sd")
            for j in range(MODELS_PER_NODE)
        ]
        for i in range(NODE_COUNT)
    }
    return local, remote


def test_fifty_nodes_of_forty_models_merge_into_the_expected_public_ids() -> None:
    local, remote = large_cluster()
    view = run(local, remote)

    assert len(view.records) == (NODE_COUNT + 1) * MODELS_PER_NODE
    for j in range(MODELS_PER_NODE):
        variants = j % 5 + 1
        base = f"m{j:02}"
        # Variant v first appears on node n0v, so node order gives it suffix v + 1.
        expected = {base} | {f"{base}-{v + 1}" for v in range(1, variants)}
        assert {r["public_id"] for r in view.records if r["local_id"] == base} == expected
        assert len(view.by_public_id[base]) == 1 + sum(
            1 for i in range(NODE_COUNT) if i % variants == 0
        )
        for i in range(NODE_COUNT):
            v = i % variants
            key = (f"n{i:02}", base, f"mh-{j}-v{v}:ch-{j}-v{v}")
            assert view.assignments[key].public_id == (base if v == 0 else f"{base}-{v + 1}")
    assert view.by_public_image_id["m04-5-sd"] == view.by_public_id["m04-5"]
    assert len(view.assignments) == (NODE_COUNT + 1) * MODELS_PER_NODE


def test_fifty_nodes_keep_their_ids_when_a_node_sorting_first_joins() -> None:
    local, remote = large_cluster()
    before = run(local, remote)
    newcomer = [rec(f"m{j:02}", "a-new", "fresh") for j in range(MODELS_PER_NODE)]

    after = run(local, {"a-new": newcomer} | remote, before.assignments)

    before_ids = ids(before)
    after_ids = ids(after)
    assert {k: v for k, v in after_ids.items() if k[0] != "a-new"} == before_ids
    for j in range(MODELS_PER_NODE):
        assert after_ids[("a-new", f"m{j:02}")] == f"m{j:02}-{j % 5 + 2}"
