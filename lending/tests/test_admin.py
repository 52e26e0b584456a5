"""Lending admin pages render for a superuser, show the rows, and stay read-only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from lending.models import ImageLink, OffloadDecision
from lending.tests.factories import (
    ImageLinkFactory,
    LegacyRoutingGroupMemberFactory,
    OffloadDecisionFactory,
    OffloadSettingFactory,
    TextLinkFactory,
)

pytestmark = pytest.mark.django_db

T0_MS = 1_750_000_000_000


@pytest.fixture
def admin_client() -> Client:
    user = User.objects.create_superuser("root", "root@example.invalid", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def rows() -> None:
    ImageLinkFactory(
        owner_node_id="node-a",
        owner_model_id="sdxl",
        helper_node_id="node-b",
        helper_model_id="sdxl-b",
        restore_after_borrow=True,
    )
    TextLinkFactory(
        owner_node_id="node-c",
        owner_model_id="chat",
        helper_node_id="node-d",
        helper_model_id="chat-d",
        load_if_unloaded=False,
    )
    OffloadSettingFactory(key="offload_probe_idle", value="2s", updated_at=T0_MS)
    OffloadDecisionFactory(
        recorded_at=T0_MS,
        node_id="node-a",
        kind="plan",
        lane="image",
        owner_node_id="node-a",
        owner_model_id="sdxl",
        helper_node_id="node-b",
        helper_model_id="sdxl-b",
        outcome="granted",
    )
    OffloadDecisionFactory(
        recorded_at=T0_MS + 5, node_id="node-a", kind="helper", outcome="borrowed_returned"
    )
    LegacyRoutingGroupMemberFactory(
        lane="text", group_id="old-group-7", node_id="node-e", model_id="llama"
    )


@pytest.mark.parametrize(
    ("model", "cells"),
    [
        ("imagelink", ["node-a / <strong>sdxl</strong>", "node-b / <strong>sdxl-b</strong>"]),
        ("textlink", ["node-c / <strong>chat</strong>", "node-d / <strong>chat-d</strong>"]),
        ("offloadsetting", ["offload_probe_idle", "2s", "2025-06-15 15:06:40.000"]),
        ("offloaddecision", ["granted", "borrowed_returned", "2025-06-15 15:06:40.005"]),
        ("legacyroutinggroupmember", ["old-group-7", "llama"]),
    ],
)
def test_each_changelist_renders_its_rows(
    admin_client: Client, rows: None, model: str, cells: list[str]
) -> None:
    response = admin_client.get(f"/admin/lending/{model}/")
    assert response.status_code == 200
    page = response.content.decode()
    for cell in cells:
        assert cell in page


def test_the_decision_filters_narrow_the_list(admin_client: Client, rows: None) -> None:
    granted_cell = '<td class="field-outcome">granted</td>'
    assert granted_cell in admin_client.get("/admin/lending/offloaddecision/").content.decode()
    response = admin_client.get("/admin/lending/offloaddecision/?kind=helper")
    assert response.status_code == 200
    page = response.content.decode()
    assert '<td class="field-outcome">borrowed_returned</td>' in page
    assert granted_cell not in page


def test_link_flags_filter_the_list(admin_client: Client, rows: None) -> None:
    response = admin_client.get("/admin/lending/textlink/?load_if_unloaded__exact=1")
    assert response.status_code == 200
    assert "node-c" not in response.content.decode()


def test_a_decision_opens_read_only_and_cannot_be_added(admin_client: Client, rows: None) -> None:
    decision = OffloadDecision.objects.get(outcome="granted")
    assert admin_client.get(
        f"/admin/lending/offloaddecision/{decision.pk}/change/"
    ).status_code == (200)
    assert admin_client.get("/admin/lending/offloaddecision/add/").status_code == 403


def test_links_cannot_be_edited_outside_the_lending_api(admin_client: Client, rows: None) -> None:
    link = ImageLink.objects.get()
    response = admin_client.post(
        f"/admin/lending/imagelink/{link.pk}/change/", {"restore_after_borrow": ""}
    )
    assert response.status_code == 403
    assert ImageLink.objects.get().restore_after_borrow is True
