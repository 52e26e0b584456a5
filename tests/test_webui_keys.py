"""The Keys page in headless Chromium against the real key API (contract §8): create (the secret
shown once, with a copy button), list, edit models, limits and expiry, revoke after a
confirmation; and the page on a 390 px phone."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.browser import require_chromium
from tests.harness import REPO, Cluster, start_cluster, text_model

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
API = "/router/v1/site/api-keys"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("webui-keys"), [text_model("chat"), text_model("draw")], {}
    )
    try:
        yield c
    finally:
        c.cleanup()


def listed(c: Cluster) -> dict[str, dict[str, Any]]:
    with c.master.client() as client:
        doc = client.get(API).json()
    rows = doc if isinstance(doc, list) else doc.get("keys", doc.get("results", []))
    return {k["name"]: k for k in rows}


def create(tab: Any, name: str, *, models: str = "", rpm: str = "") -> str:
    """Create a key through the form; returns the secret the page shows once."""
    tab.fill("#f-name", name)
    tab.fill("#f-models", models)
    tab.fill("#f-rpm", rpm)
    tab.click("#save")
    tab.wait_for_selector("#new-secret:not([hidden])")
    secret: str = tab.inner_text("#secret")
    return secret


def models_seen(c: Cluster, secret: str) -> tuple[int, list[str]]:
    resp = httpx.get(
        c.master.base_url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}
    )
    ids = [m["id"] for m in resp.json().get("data", [])] if resp.status_code == 200 else []
    return resp.status_code, ids


def test_a_new_keys_secret_is_shown_once_with_a_copy_button(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    name = f"bot-{uuid.uuid4().hex[:6]}"
    tab = new_page(viewport=DESKTOP, permissions=["clipboard-read", "clipboard-write"])
    tab.goto(cluster.master.base_url + "/ui/keys")
    secret = create(tab, name, models="chat", rpm="60")
    assert secret.startswith("rk-")
    assert "you will not see it again" in tab.inner_text("#new-secret")
    tab.click("#copy")
    tab.wait_for_selector("#copied:has-text('copied')")
    assert tab.evaluate("navigator.clipboard.readText()") == secret
    # The key works at once, for its one model.
    assert models_seen(cluster, secret) == (200, ["chat"])
    row = tab.locator(f'#keys tr[data-key="{name}"]')
    row.wait_for()
    prefix = listed(cluster)[name]["key_prefix"]
    assert secret.startswith(prefix) and prefix in row.inner_text()
    assert "60 req/min" in row.inner_text() and "chat" in row.inner_text()
    tab.click("#dismiss")
    assert tab.is_hidden("#new-secret")
    # Gone from the page: reloading or reading the DOM cannot show it again.
    assert secret not in tab.content()
    tab.reload()
    tab.wait_for_selector(f'#keys tr[data-key="{name}"]')
    assert secret not in tab.content()


def test_a_key_is_edited_in_place(cluster: Cluster, new_page: Callable[..., Any]) -> None:
    name = f"edit-{uuid.uuid4().hex[:6]}"
    tab = new_page(viewport=DESKTOP)
    tab.goto(cluster.master.base_url + "/ui/keys")
    create(tab, name)
    tab.click("#dismiss")
    tab.click(f'#keys tr[data-key="{name}"] button.edit')
    assert tab.input_value("#f-name") == name and tab.is_disabled("#f-name")
    tab.fill("#f-models", "draw, chat")
    tab.fill("#f-tpm", "5000")
    tab.fill("#f-conc", "2")
    soon = (datetime.now() + timedelta(days=3)).replace(second=0, microsecond=0)
    tab.fill("#f-expires", soon.strftime("%Y-%m-%dT%H:%M"))
    tab.click("#save")
    # "Created …" from above is an `.ok` result too: wait for this save's own.
    tab.wait_for_selector(f"#result .ok:has-text('Saved {name}.')")
    key = listed(cluster)[name]
    assert sorted(key["models"]) == ["chat", "draw"]
    assert (key["tpm"], key["max_concurrent"], key["rpm"]) == (5000, 2, None)
    expires = datetime.fromisoformat(key["expires_at"].replace("Z", "+00:00"))
    assert expires == soon.astimezone(UTC)
    row = tab.inner_text(f'#keys tr[data-key="{name}"]')
    assert "5000 tok/min" in row and "2 at once" in row
    assert tab.inner_text("#form-title") == "New key"  # the form is back to creating


def test_revoking_asks_first_and_the_key_stops_working(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    name = f"gone-{uuid.uuid4().hex[:6]}"
    tab = new_page(viewport=DESKTOP)
    tab.goto(cluster.master.base_url + "/ui/keys")
    secret = create(tab, name)
    tab.click("#dismiss")
    asked: list[str] = []

    def answer(accept: bool) -> Callable[[Any], None]:
        def handle(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        return handle

    tab.once("dialog", answer(False))
    tab.click(f'#keys tr[data-key="{name}"] button.revoke')
    assert asked and name in asked[0]
    assert listed(cluster)[name].get("revoked_at") in (None, "")
    tab.once("dialog", answer(True))
    tab.click(f'#keys tr[data-key="{name}"] button.revoke')
    tab.wait_for_selector(f'#keys tr[data-key="{name}"][data-state="revoked"]', timeout=10_000)
    assert models_seen(cluster, secret)[0] == 401


def test_the_page_fits_a_390_px_phone_without_horizontal_scroll(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport=PHONE)
    tab.goto(cluster.master.base_url + "/ui/keys")
    create(tab, f"phone-{uuid.uuid4().hex[:6]}-with-a-long-name", models="chat, draw", rpm="10")
    tab.wait_for_selector("#keys tbody tr")
    widths = tab.evaluate(
        "[document.documentElement.scrollWidth, document.body.scrollWidth, innerWidth]"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "ui-keys-390px.png"), full_page=True)
    offenders = tab.evaluate(
        "[...document.querySelectorAll('body *')]"
        ".filter(e => e.getBoundingClientRect().right > innerWidth)"
        ".map(e => `${e.tagName}#${e.id}.${e.className}`).slice(0, 15)"
    )
    assert widths[0] <= PHONE["width"] and widths[1] <= PHONE["width"], (widths, offenders)
    assert offenders == []
