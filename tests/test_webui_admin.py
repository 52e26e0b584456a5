"""The admin under `runrouter`, in headless Chromium: its static files, a login made with
`createsuperuser --config`, and a guardian form that validates as the site API does."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import require_chromium
from tests.harness import (
    REPO,
    ModelSpec,
    RouterNode,
    sim_weights,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
PASSWORD = "a-long-admin-password-9"


def vision_model(name: str) -> ModelSpec:
    return ModelSpec(
        name,
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(vision=True), "mmproj": sim_weights(vision=True)},
    )


def manage(node: RouterNode, *args: str, env: dict[str, str] | None = None) -> str:
    """Run a manage.py command against the node's own config (and database)."""
    full = dict(os.environ)
    full.pop("ROUTER_CONFIG", None)
    full.pop("DATABASE_URL", None)
    if node.db is not None:
        full["DATABASE_URL"] = node.db.url
    full.update(env or {})
    done = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args, "--config", str(node.config_path)],
        cwd=str(REPO),
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    root = tmp_path_factory.mktemp("webui-admin")
    n = start_node(root, [text_model("plain"), text_model("other"), vision_model("eye")])
    try:
        manage(
            n,
            "createsuperuser",
            "--noinput",
            "--username",
            "operator",
            "--email",
            "operator@example.org",
            env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD},
        )
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def admin(node: RouterNode, new_page: Callable[..., Any]) -> Any:
    """A page logged in to the admin, in a context of its own: its session is this test's."""
    tab = new_page()
    tab.goto(node.base_url + "/admin/login/")
    tab.fill("#id_username", "operator")
    tab.fill("#id_password", PASSWORD)
    tab.click("input[type=submit]")
    tab.wait_for_selector("#site-name")
    return tab


def test_createsuperuser_takes_the_config_option_and_writes_the_nodes_own_database(
    node: RouterNode,
) -> None:
    # The user made by the fixture is in the database this node's config names: the admin
    # login below works only with it, and `changepassword --config` finds it there too.
    out = manage(
        node,
        "shell",
        "-c",
        "from django.contrib.auth.models import User; "
        "print(list(User.objects.values_list('username', 'is_superuser')))",
    )
    assert "('operator', True)" in out


def test_the_admin_loads_its_styles_and_scripts_from_the_router(
    node: RouterNode, admin: Any
) -> None:
    statics: dict[str, int] = {}
    admin.on(
        "response", lambda r: statics.__setitem__(r.url, r.status) if "/static/" in r.url else None
    )
    # goto returns on the load event: every stylesheet and script of the page is fetched. The
    # wait is then for their response events, which Playwright hands over on a round trip.
    admin.goto(node.base_url + "/admin/guardians/guardiansetting/add/")
    fetched = admin.evaluate(
        "performance.getEntriesByType('resource').map(e => e.name)"
        ".filter(u => u.includes('/static/'))"
    )
    wait_for(lambda: admin.evaluate("true") and set(fetched) <= set(statics))
    assert any(u.endswith("/static/admin/css/base.css") for u in statics), statics
    assert any(u.endswith(".js") for u in statics), statics
    assert all(status in (200, 304) for status in statics.values()), statics
    # Django's stylesheet took effect: the header bar has the admin's colours, not the
    # browser's defaults.
    background = admin.evaluate(
        "getComputedStyle(document.querySelector('#header')).backgroundColor"
    )
    assert background not in ("rgba(0, 0, 0, 0)", "transparent")
    ARTIFACTS.mkdir(exist_ok=True)
    admin.screenshot(path=str(ARTIFACTS / "admin-guardian-add.png"), full_page=True)


def guardians(node: RouterNode) -> dict[str, Any]:
    with node.client() as client:
        doc: dict[str, Any] = client.get("/router/v1/site/guardians").json()
        return doc


def add_guardian(admin: Any, node: RouterNode, scope: str, key: str, guardian: str) -> None:
    admin.goto(node.base_url + "/admin/guardians/guardiansetting/add/")
    admin.select_option("#id_scope", scope)
    admin.fill("#id_key", key)
    admin.fill("#id_guardian_id", guardian)
    admin.click("input[name=_save]")
    admin.wait_for_load_state("load")


def test_the_guardian_admin_refuses_what_the_api_refuses_and_publishes_what_it_saves(
    node: RouterNode, admin: Any
) -> None:
    # A text-only model as guardian: the API's message, on the guardian field; nothing saved.
    add_guardian(admin, node, "model", "plain", "other")
    error = admin.locator(".field-guardian_id .errorlist").inner_text()
    assert 'guardian "other" is not a multimodal text model' in error
    ARTIFACTS.mkdir(exist_ok=True)
    admin.screenshot(path=str(ARTIFACTS / "admin-guardian-refused.png"), full_page=True)
    assert guardians(node)["models"] == {}
    # An unknown model as the key: the key field is at fault.
    add_guardian(admin, node, "model", "nosuch", "eye")
    assert (
        "is not a text model in this cluster" in admin.locator(".field-key .errorlist").inner_text()
    )
    # A cluster guardian with a key is refused too: the API has no such setting.
    add_guardian(admin, node, "cluster", "plain", "eye")
    assert "no key" in admin.locator(".field-key .errorlist").inner_text()
    assert guardians(node)["cluster"] is None
    # A multimodal guardian is saved and in force at once, as a POST to the API would be.
    add_guardian(admin, node, "model", "plain", "eye")
    assert admin.locator(".messagelist .success").count() == 1
    doc = guardians(node)
    assert doc["models"] == {"plain": "eye"} and doc["effective"]["plain"] == "eye"
    # Deleting it in the admin takes it out of force as well.
    admin.goto(node.base_url + "/admin/guardians/guardiansetting/")
    admin.check("input[name=_selected_action]")
    admin.select_option("select[name=action]", "delete_selected")
    admin.click("button[name=index]")
    admin.click("input[type=submit]")
    admin.wait_for_selector(".messagelist .success")
    assert guardians(node)["models"] == {} and "plain" not in guardians(node)["effective"]
