"""The pages on a phone and the small things around them (headless Chromium, real cluster):
390 px without horizontal scroll, links both ways, `/` on each role, Reset all asks first, and
a loaded image model under the ID clients use."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.browser import require_chromium
from tests.harness import REPO, Cluster, ModelSpec, sim_weights, start_cluster, text_model

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pic = ModelSpec("pic", {}, {"sdmodel": sim_weights(base_ms=5)})
    c = start_cluster(
        tmp_path_factory.mktemp("webui-layout"),
        [text_model("chat-with-a-rather-long-model-name")],
        {"s": [text_model("notes"), pic]},
    )
    try:
        with c.master.client() as client:
            link = {
                "anchor": {"node_id": "master", "model_id": "chat-with-a-rather-long-model-name"},
                "lends_to": [{"node_id": "s", "model_id": "notes"}],
                "acknowledge_different_weights": True,
            }
            client.post("/router/v1/site/text-routing-groups", json=link).raise_for_status()
        yield c
    finally:
        c.cleanup()


@pytest.mark.parametrize(
    ("path", "ready"),
    [
        ("/ui/nodes", '.card[data-node="s"]'),
        ("/ui/lending", "#links-all tr[data-link]"),
        ("/ui/recipes", '#kinds select[data-kind="text"]'),
    ],
)
def test_each_page_fits_a_390_px_phone_without_horizontal_scroll(
    cluster: Cluster, new_page: Callable[..., Any], path: str, ready: str
) -> None:
    tab = new_page(viewport=PHONE)
    tab.goto(cluster.master.base_url + path)
    tab.wait_for_selector(ready)
    if path == "/ui/lending":
        tab.wait_for_selector("#decisions tbody tr")
    widths = tab.evaluate(
        "[document.documentElement.scrollWidth, document.body.scrollWidth, innerWidth]"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    name = path.strip("/").replace("/", "-")
    tab.screenshot(path=str(ARTIFACTS / f"{name}-390px.png"), full_page=True)
    # What sticks out (outside the panels that scroll on purpose), to name it when it fails.
    offenders = tab.evaluate(
        "[...document.querySelectorAll('body *')]"
        ".filter(e => e.getBoundingClientRect().right > innerWidth)"
        ".filter(e => !e.closest('.scroll') && !e.closest('.log-panel'))"
        ".map(e => `${e.tagName}#${e.id}.${e.className}`).slice(0, 15)"
    )
    assert widths[0] <= PHONE["width"] and widths[1] <= PHONE["width"], (widths, offenders)
    # Every button can be reached: none starts beyond the right edge.
    offscreen = tab.evaluate(
        "[...document.querySelectorAll('button')].filter(b => b.offsetParent !== null)"
        ".filter(b => b.getBoundingClientRect().left >= innerWidth && !b.closest('.scroll'))"
        ".map(b => b.textContent)"
    )
    assert offscreen == []


def test_the_pages_link_to_each_other_and_root_opens_the_nodes_page(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = new_page()
    tab.goto(cluster.master.base_url + "/")
    assert tab.url.endswith("/ui/nodes")
    tab.click("text=Lending tab")
    tab.wait_for_url("**/ui/lending")
    tab.click("text=Nodes page")
    tab.wait_for_url("**/ui/nodes")


def test_a_slaves_root_says_it_has_no_pages_and_points_to_its_master(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    slave = cluster.slaves["s"]
    doc = httpx.get(slave.base_url + "/", follow_redirects=False).json()
    assert doc["role"] == "slave" and doc["master_url"] == cluster.master.base_url
    assert doc["webui"] == cluster.master.base_url + "/ui/nodes"
    tab = new_page()
    tab.goto(slave.base_url + "/")
    assert "is a slave node" in tab.locator("h1").inner_text()
    tab.click("#master-link")
    tab.wait_for_url(cluster.master.base_url + "/ui/nodes")
    # A standalone or master root is a redirect for scripts too.
    answer = httpx.get(cluster.master.base_url + "/", follow_redirects=False)
    assert answer.status_code == 302 and answer.headers["location"] == "/ui/nodes"


def test_reset_all_asks_first_and_does_nothing_when_declined(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    settings = cluster.master.base_url + "/router/v1/site/offload/settings"

    def override() -> Any:
        entries = httpx.get(settings).json()["entries"]
        return next(e for e in entries if e["key"] == "offload_probe_idle").get("override")

    httpx.post(settings, json={"values": {"offload_probe_idle": "7s"}}).raise_for_status()
    try:
        tab = new_page()
        tab.goto(cluster.master.base_url + "/ui/lending")
        tab.wait_for_selector('input[data-key="offload_probe_idle"]')
        asked: list[str] = []

        def decline(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.dismiss()

        tab.once("dialog", decline)
        tab.click("#reset-all")
        tab.wait_for_function("document.querySelector('#status').innerText.startsWith('updated')")
        assert asked and "Reset all lending settings?" in asked[0]
        assert override() == "7s"

        tab.once("dialog", lambda dialog: dialog.accept())
        tab.click("#reset-all")
        tab.wait_for_function(
            "document.querySelector('#settings-msg').innerText === 'all settings reset'"
        )
        assert override() is None
    finally:
        httpx.delete(settings)


def test_a_loaded_image_model_is_shown_under_the_id_clients_use(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    with cluster.master.client() as client:
        records = client.get("/router/v1/models").json()["models"]
        image_id = next(r["public_image_id"] for r in records if r.get("has_image"))
        assert image_id != "pic"
        client.post("/router/v1/load", json={"model": image_id}).raise_for_status()
    try:
        tab = new_page()
        tab.goto(cluster.master.base_url + "/ui/nodes")
        row = tab.locator('.card[data-node="s"] ul.runtimes li[data-runtime="image"]')
        row.wait_for()
        assert row.locator("b").inner_text() == image_id
        assert "(pic here)" in row.inner_text()
        tab.goto(cluster.master.base_url + "/ui/lending")
        cell = tab.locator("#nodes tbody tr", has_text=image_id)
        cell.wait_for()
    finally:
        # The phone tests draw the Nodes page as the fixture left it, with nothing loaded.
        with cluster.master.client() as client:
            client.post("/router/v1/unload", json={"model": image_id}).raise_for_status()
