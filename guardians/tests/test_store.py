from __future__ import annotations

import pytest

from guardians.routing import is_image_refusal
from guardians.store import Change, Guardians, guardians_apply, guardians_load
from routerproject.errors import RouterError


def test_the_most_specific_scope_wins_and_a_model_never_guards_itself() -> None:
    g = Guardians(cluster="c", nodes={"n1": "n"}, models={"m": "x", "self": "self"})
    assert g.for_model("m", "n1") == "x"
    assert g.for_model("other", "n1") == "n"
    assert g.for_model("other", "n2") == "c"
    assert g.for_model("c", "n2") is None
    assert g.for_model("self", "n2") is None
    assert Guardians().for_model("m", "n1") is None


def test_a_pushed_snapshot_round_trips_and_a_malformed_one_is_refused() -> None:
    g = Guardians(cluster=None, nodes={"b": "x", "a": "y"}, models={"m": "x"})
    assert Guardians.from_dict(g.as_dict()) == g
    assert list(g.as_dict()["nodes"]) == ["a", "b"]
    for bad, param in (
        ({"cluster": 3}, "cluster"),
        ({"cluster": ""}, "cluster"),
        ({"nodes": {"a": None}}, "nodes"),
        ({"models": ["m"]}, "models"),
    ):
        with pytest.raises(RouterError) as err:
            Guardians.from_dict(bad)
        assert err.value.status == 400 and err.value.param == param


def test_only_a_400_or_500_that_says_not_supported_is_an_image_refusal() -> None:
    assert is_image_refusal(400, b'{"error":{"message":"Image input is NOT SUPPORTED"}}')
    assert is_image_refusal(500, b"image input not supported by this model")
    assert not is_image_refusal(400, b'{"error":{"message":"bad max_tokens"}}')
    assert not is_image_refusal(503, b"not supported")


@pytest.mark.django_db
def test_changes_are_written_together_and_null_clears() -> None:
    guardians_apply(
        [Change("cluster", "", "v"), Change("node", "n1", "w"), Change("model", "m", "v")]
    )
    assert guardians_load() == Guardians(cluster="v", nodes={"n1": "w"}, models={"m": "v"})
    guardians_apply([Change("node", "n1", "v"), Change("cluster", "", None)])
    assert guardians_load() == Guardians(cluster=None, nodes={"n1": "v"}, models={"m": "v"})
