"""The audit log in headless Chromium: writes made in the Django admin (a form and the bulk
delete) are recorded under the admin user's name, and the Lending tab's audit panel shows
them, filtered, with the state before and after, at phone width."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import require_chromium
from tests.harness import REPO, ModelSpec, RouterNode, sim_weights, start_node, text_model
from tests.test_webui_admin import PASSWORD, manage

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    eye = ModelSpec(
        "eye",
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(vision=True), "mmproj": sim_weights(vision=True)},
    )
    n = start_node(tmp_path_factory.mktemp("webui-audit"), [text_model("plain"), eye])
    try:
        manage(
            n,
            "createsuperuser",
            "--noinput",
            "--username",
            "auditor",
            "--email",
            "auditor@example.org",
            env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD},
        )
        yield n
    finally:
        n.cleanup()


def audit(node: RouterNode, **params: Any) -> list[dict[str, Any]]:
    with node.client() as client:
        rows: list[dict[str, Any]] = client.get("/router/v1/site/audit", params=params).json()[
            "rows"
        ]
        return rows


def log_in(tab: Any, node: RouterNode) -> None:
    tab.goto(node.base_url + "/admin/login/")
    tab.fill("#id_username", "auditor")
    tab.fill("#id_password", PASSWORD)
    tab.click("input[type=submit]")
    tab.wait_for_selector("#site-name")


def test_admin_writes_are_recorded_under_the_admin_user_bulk_delete_included(
    node: RouterNode, new_page: Callable[..., Any]
) -> None:
    tab = new_page()
    log_in(tab, node)
    # A refused form saves nothing and records nothing.
    tab.goto(node.base_url + "/admin/guardians/guardiansetting/add/")
    tab.select_option("#id_scope", "model")
    tab.fill("#id_key", "plain")
    tab.fill("#id_guardian_id", "plain")
    tab.click("input[name=_save]")
    tab.wait_for_selector(".errorlist")
    assert audit(node, actor="auditor") == []

    tab.goto(node.base_url + "/admin/guardians/guardiansetting/add/")
    tab.select_option("#id_scope", "model")
    tab.fill("#id_key", "plain")
    tab.fill("#id_guardian_id", "eye")
    tab.click("input[name=_save]")
    tab.wait_for_selector(".messagelist .success")
    (created,) = audit(node, actor="auditor")
    assert created["action"] == "guardian.create"
    assert created["before"] is None
    assert created["after"] == {"scope": "model", "scope_id": "plain", "guardian_id": "eye"}

    tab.goto(node.base_url + "/admin/guardians/guardiansetting/")
    tab.check("input[name=_selected_action]")
    tab.select_option("select[name=action]", "delete_selected")
    tab.click("button[name=index]")
    tab.click("input[type=submit]")
    tab.wait_for_selector(".messagelist .success")
    deleted, _ = audit(node, actor="auditor")
    assert (deleted["action"], deleted["after"]) == ("guardian.delete", None)
    assert deleted["before"] == created["after"]
    assert deleted["request_id"] and deleted["request_id"] != created["request_id"]

    # The log itself is read-only in the admin.
    tab.goto(node.base_url + "/admin/access/auditentry/")
    assert tab.locator("#result_list tbody tr").count() >= 2
    assert tab.locator(".object-tools a.addlink").count() == 0


def test_the_audit_panel_shows_filters_and_opens_rows_at_phone_width(
    node: RouterNode, new_page: Callable[..., Any]
) -> None:
    with node.client() as client:
        for value in ("2s", "3s"):
            saved = client.post(
                "/router/v1/site/offload/settings", json={"values": {"offload_probe_idle": value}}
            )
            assert saved.status_code == 200
    tab = new_page(viewport=PHONE)
    tab.goto(node.base_url + "/ui/lending")
    rows = tab.locator("#audit-rows tbody tr.group")
    rows.first.wait_for()
    assert rows.count() >= 2
    assert "settings.update" in rows.first.inner_text()
    assert "config key" in rows.first.inner_text()

    tab.select_option("#audit-action", "settings.update")
    tab.wait_for_function(
        "[...document.querySelectorAll('#audit-rows tbody tr.group')]"
        ".every(r => r.innerText.includes('settings.update'))"
    )
    rows.first.click()
    after = tab.locator("#audit-rows pre[data-state=after]")
    after.wait_for()
    assert '"offload_probe_idle": "3s"' in after.inner_text()
    assert (
        '"offload_probe_idle": "2s"'
        in tab.locator("#audit-rows pre[data-state=before]").inner_text()
    )

    # Readable on a phone: nothing spills past the screen's width, an open row included.
    width = tab.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], width
    ARTIFACTS.mkdir(exist_ok=True)
    tab.locator("#audit").screenshot(path=str(ARTIFACTS / "lending-audit-390.png"))

    tab.fill("#audit-actor", "nobody")
    tab.dispatch_event("#audit-actor", "change")
    tab.wait_for_selector("#audit-rows tbody td.muted")
