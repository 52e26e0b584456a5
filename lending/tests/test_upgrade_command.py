"""`manage.py upgrade_routing_groups`: symmetric groups become one-way links, idempotently."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from lending.models import ImageLink, LegacyRoutingGroupMember, TextLink
from lending.tests.factories import LegacyRoutingGroupMemberFactory

pytestmark = pytest.mark.django_db

LinkRow = tuple[str, str, str, str, bool, bool]


def run(*args: str) -> str:
    out = StringIO()
    call_command("upgrade_routing_groups", *args, stdout=out)
    return out.getvalue()


def write(tmp_path: Path, doc: Any) -> str:
    path = tmp_path / "groups.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return str(path)


def links(model: type[ImageLink] | type[TextLink]) -> set[LinkRow]:
    return set(
        model.objects.values_list(
            "owner_node_id",
            "owner_model_id",
            "helper_node_id",
            "helper_model_id",
            "load_if_unloaded",
            "restore_after_borrow",
        )
    )


def member(node_id: str, model_id: str, restore: bool | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"node_id": node_id, "model_id": model_id}
    if restore is not None:
        doc["restore_after_borrow"] = restore
    return doc


IMAGE_FILE = {
    "image": [
        {"members": [member("a", "sdxl", True), member("b", "sdxl-b"), member("b", "flux")]},
    ]
}


def legacy(lane: str, group_id: str, node_id: str, model_id: str, restore: bool = False) -> None:
    LegacyRoutingGroupMemberFactory(
        lane=lane,
        group_id=group_id,
        node_id=node_id,
        model_id=model_id,
        restore_after_borrow=restore,
    )


def test_file_groups_and_legacy_rows_become_links_in_both_directions(tmp_path: Path) -> None:
    legacy("text", "g1", "a", "chat")
    legacy("text", "g1", "c", "chat-c", restore=True)
    legacy("text", "g2", "a", "chat")  # a group of one yields nothing

    output = run("--from", write(tmp_path, IMAGE_FILE))

    # Restore is set where the HELPER member had it; loading is always allowed.
    assert links(ImageLink) == {
        ("a", "sdxl", "b", "sdxl-b", True, False),
        ("b", "sdxl-b", "a", "sdxl", True, True),
        ("a", "sdxl", "b", "flux", True, False),
        ("b", "flux", "a", "sdxl", True, True),
    }
    assert links(TextLink) == {
        ("a", "chat", "c", "chat-c", True, True),
        ("c", "chat-c", "a", "chat", True, False),
    }
    assert LegacyRoutingGroupMember.objects.count() == 0
    assert "image: 4 links created, 0 skipped (already linked), 1 same-node pair ignored" in output
    assert "text: 2 links created, 0 skipped" in output
    assert "legacy routing-group rows: 3 converted and removed" in output
    assert "routing groups upgraded: 6 links created, 0 skipped" in output


def test_a_second_run_creates_nothing_and_leaves_links_as_they_are(tmp_path: Path) -> None:
    path = write(tmp_path, IMAGE_FILE)
    run("--from", path)
    # An operator cleared loading on one direction after the upgrade; a rerun keeps that.
    ImageLink.objects.filter(owner_node_id="b", owner_model_id="flux").update(
        load_if_unloaded=False
    )
    before = links(ImageLink)

    output = run("--from", path)

    assert links(ImageLink) == before
    assert ImageLink.objects.count() == 4
    assert "image: 0 links created, 4 skipped" in output
    assert "routing groups upgraded: 0 links created, 4 skipped" in output


def test_a_dry_run_reports_but_writes_nothing(tmp_path: Path) -> None:
    legacy("text", "g1", "a", "chat")
    legacy("text", "g1", "c", "chat-c")

    output = run("--from", write(tmp_path, IMAGE_FILE), "--dry-run")

    assert ImageLink.objects.count() == 0
    assert TextLink.objects.count() == 0
    assert LegacyRoutingGroupMember.objects.count() == 2
    assert "image: 4 links would be created" in output
    assert "legacy routing-group rows: 2 would be removed" in output
    assert "nothing was written" in output


def test_members_on_the_same_node_never_link_to_each_other(tmp_path: Path) -> None:
    doc = {"text": [{"members": [member("a", "chat"), member("a", "chat-2")]}]}
    output = run("--from", write(tmp_path, doc))
    assert TextLink.objects.count() == 0
    assert "text: 0 links created, 0 skipped (already linked), 1 same-node pair ignored" in output


def test_without_a_file_only_the_legacy_rows_are_converted() -> None:
    legacy("image", "g", "a", "sd", restore=True)
    legacy("image", "g", "b", "sd")
    output = run("--no-input")
    assert links(ImageLink) == {
        ("a", "sd", "b", "sd", True, False),
        ("b", "sd", "a", "sd", True, True),
    }
    assert "image: 2 links created" in output


def test_a_member_listed_in_two_groups_keeps_restore_if_either_group_had_it(
    tmp_path: Path,
) -> None:
    doc = {
        "image": [
            {"members": [member("a", "sd"), member("b", "sd", True)]},
            {"members": [member("a", "sd"), member("b", "sd", False)]},
        ]
    }
    run("--from", write(tmp_path, doc))
    assert links(ImageLink) == {
        ("a", "sd", "b", "sd", True, True),
        ("b", "sd", "a", "sd", True, False),
    }


def test_it_accepts_the_config_option_that_manage_py_reads() -> None:
    output = run("--config", "ignored.yaml")
    assert "routing groups upgraded: 0 links created, 0 skipped" in output


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ("{oops", "invalid JSON at line 1"),
        ([], "must hold a JSON object"),
        ({"audio": []}, "unknown lane 'audio'"),
        ({"image": {"members": []}}, "image: must be a list of groups"),
        ({"image": [{"nodes": []}]}, 'image[0]: must be an object with a "members" list'),
        ({"text": [{"members": ["a/chat"]}]}, "text[0].members[0]: must be an object"),
        (
            {"text": [{"members": [member("a", "chat"), {"node_id": "b"}]}]},
            "text[0].members[1].model_id: must be a non-empty string",
        ),
        (
            {"text": [{"members": [member("a", "chat"), member("b", "chat", "yes")]}]},  # type: ignore[arg-type]
            "text[0].members[1].restore_after_borrow: must be true or false",
        ),
    ],
)
def test_a_malformed_file_is_refused_naming_the_problem_and_nothing_is_written(
    tmp_path: Path, doc: Any, problem: str
) -> None:
    legacy("image", "g", "a", "sd")
    legacy("image", "g", "b", "sd")
    good_first = {"image": [{"members": [member("x", "sd"), member("y", "sd")]}]}
    if isinstance(doc, dict) and "text" in doc:
        doc = {**good_first, **doc}
    with pytest.raises(CommandError) as caught:
        run("--from", write(tmp_path, doc))
    assert problem in str(caught.value)
    assert ImageLink.objects.count() == 0
    assert TextLink.objects.count() == 0
    assert LegacyRoutingGroupMember.objects.count() == 2


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="cannot read"):
        run("--from", str(tmp_path / "absent.json"))
