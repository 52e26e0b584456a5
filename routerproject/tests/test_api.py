"""The shared management-API rules: strict body fields, field-named errors, the admin-key gate."""

from __future__ import annotations

from typing import Any

import pytest

from guardians.api.serializers import GuardiansUpdateSerializer
from lending.api.serializers import LinkSerializer, LinkSetSerializer
from lending.links import LINK_FIELDS
from registry.api.serializers import RuntimeUnloadSerializer, UnloadSerializer
from routerproject.api import admin_key_required, admin_key_valid, validated
from routerproject.errors import RouterError

ANCHOR = {"node_id": "a", "model_id": "m"}


def refusal(serializer: Any) -> tuple[str | None, str]:
    with pytest.raises(RouterError) as caught:
        validated(serializer)
    assert caught.value.status == 400
    return caught.value.param, caught.value.message


def test_a_list_entry_at_fault_is_named_with_its_index_and_field() -> None:
    body = {"anchor": ANCHOR, "lends_to": [{"node_id": "b", "model_id": "x"}, {"node_id": "c"}]}
    assert refusal(LinkSetSerializer(data=body)) == (
        "lends_to[1].model_id",
        "lends_to[1].model_id is required",
    )


def test_a_list_entry_that_is_not_an_object_is_named_by_its_index() -> None:
    body = {"anchor": ANCHOR, "borrows_from": ["b/x"]}
    assert refusal(LinkSetSerializer(data=body)) == (
        "borrows_from[0]",
        "borrows_from[0] must be an object with node_id and model_id",
    )


@pytest.mark.parametrize("flag", ["yes", 1, "true"])
def test_only_json_true_or_false_is_a_flag(flag: Any) -> None:
    body = {"anchor": ANCHOR, "lends_to": [{**ANCHOR, "load_if_unloaded": flag}]}
    assert refusal(LinkSetSerializer(data=body)) == (
        "lends_to[0].load_if_unloaded",
        "lends_to[0].load_if_unloaded must be true or false",
    )


def test_a_null_flag_means_its_default() -> None:
    body = {"anchor": ANCHOR, "lends_to": [{**ANCHOR, "restore_after_borrow": None}]}
    (target,) = validated(LinkSetSerializer(data=body))["lends_to"]
    assert (target["load_if_unloaded"], target["restore_after_borrow"]) == (True, False)


@pytest.mark.parametrize("generation", ["3", True, 2.0, -1])
def test_a_generation_is_a_json_integer_of_zero_or_more(generation: Any) -> None:
    body = {"node_id": "n", "backend_id": "b", "runtime_id": "r", "expected_generation": generation}
    assert refusal(RuntimeUnloadSerializer(data=body)) == (
        "expected_generation",
        "expected_generation must be a non-negative integer",
    )


def test_a_number_is_not_a_node_id() -> None:
    body = {"node_id": 7, "backend_id": "b", "runtime_id": "r", "expected_generation": 1}
    assert refusal(RuntimeUnloadSerializer(data=body)) == (
        "node_id",
        "node_id must be a non-empty string",
    )


def test_a_body_that_is_not_an_object_is_refused_without_a_field() -> None:
    assert refusal(UnloadSerializer(data=["model"])) == (
        None,
        "request body must be a JSON object",
    )


def test_a_map_entry_at_fault_is_named_with_its_key() -> None:
    assert refusal(GuardiansUpdateSerializer(data={"models": {"chat": ""}})) == (
        "models.chat",
        "models.chat must be a model ID or null",
    )


def test_a_field_outside_the_body_is_refused_by_name() -> None:
    param, _ = refusal(GuardiansUpdateSerializer(data={"cluster": None, "node": {}}))
    assert param == "node"


def test_the_link_answer_has_the_link_services_own_fields() -> None:
    assert tuple(LinkSerializer().fields) == LINK_FIELDS


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"Bearer k2", True),
        (b"Bearer  k1 ", True),
        (b"Bearer k3", False),
        (b"k1", False),
        (None, False),
    ],
)
def test_an_admin_key_is_one_of_the_configured_ones(header: bytes | None, expected: bool) -> None:
    assert admin_key_valid(header, ["k1", "k2"]) is expected


def test_without_admin_keys_every_request_passes() -> None:
    assert admin_key_valid(None, [])


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/router/v1/models", True),
        ("POST", "/router/v1/site/routing-groups", True),
        ("GET", "/router/v1/docs", True),
        # Methods a route does not serve, and paths that are no route, go on to their 404.
        ("PUT", "/router/v1/models", False),
        ("HEAD", "/router/v1/models", False),
        ("OPTIONS", "/router/v1/site/guardians", False),
        ("GET", "/router/v1/nothing-here", False),
        # The schema is public; nothing outside /router/v1/ is the management API.
        ("GET", "/router/v1/schema", False),
        ("GET", "/ui/nodes", False),
    ],
)
def test_the_admin_key_is_required_exactly_for_what_a_management_view_serves(
    method: str, path: str, expected: bool
) -> None:
    assert admin_key_required(path, method) is expected
