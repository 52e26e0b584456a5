"""What a new operator met on a text-only cluster (headless Chromium, real nodes): empty states
that say why, the link editor's Remove, Edit and flags, the icon, and the Nodes page's words
for lent work, running requests and unloads a link undoes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.browser import require_chromium
from tests.harness import REPO, Cluster, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
LINK = "text:o/big>h/fast"
LINK_ROW = f'#links-all tr[data-link="{LINK}"]'
FAST_ROW = 'section[data-node="h"] li[data-backend="text-runtime"]'


def link_body(load_if_unloaded: bool = True) -> dict[str, Any]:
    return {
        "anchor": {"node_id": "o", "model_id": "big"},
        "lends_to": [{"node_id": "h", "model_id": "fast", "load_if_unloaded": load_if_unloaded}],
        "acknowledge_different_weights": True,
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Text models only: no image model, none that reads images.
    c = start_cluster(
        tmp_path_factory.mktemp("webui-edges"),
        [],
        {
            "o": [text_model("big", base_ms=5, output_ms_per_token=30)],
            "h": [text_model("fast", base_ms=5, output_ms_per_token=20)],
        },
        master_sections={"cluster": {"offload_probe_idle": "100ms"}},
    )
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def linked(cluster: Cluster) -> Iterator[Cluster]:
    """o/big lends to h/fast (loading it if unloaded) for the test, whatever the test did."""
    with cluster.master.client() as client:
        client.post("/router/v1/site/text-routing-groups", json=link_body()).raise_for_status()
    yield cluster
    with cluster.master.client() as client:
        client.delete(
            "/router/v1/site/text-routing-groups", params={"node_id": "o", "model_id": "big"}
        ).raise_for_status()


def text_links(cluster: Cluster) -> list[dict[str, Any]]:
    with cluster.master.client() as client:
        links: list[dict[str, Any]] = client.get("/router/v1/site/text-routing-groups").json()[
            "links"
        ]
    return links


def lending_tab(cluster: Cluster, new_page: Callable[..., Any], **options: Any) -> Any:
    tab = new_page(**options)
    tab.goto(cluster.master.base_url + "/ui/lending")
    tab.wait_for_function("document.querySelector('#status').innerText.startsWith('updated')")
    return tab


def test_the_image_lane_says_the_cluster_has_no_image_model(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = lending_tab(cluster, new_page)
    tab.wait_for_selector('#link-node option[value="h"]', state="attached")
    assert tab.locator("#link-node").is_visible()
    tab.select_option("#link-lane", "image")
    note = tab.locator("#link-editor .lane-empty")
    note.wait_for()
    assert "No model of the image lane in the cluster" in note.inner_text()
    # No empty selects to open.
    assert not tab.locator("#link-node").is_visible()
    assert not tab.locator("#link-model").is_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    tab.locator("#links").screenshot(path=str(ARTIFACTS / "links-image-lane-empty.png"))
    tab.select_option("#link-lane", "text")
    tab.wait_for_selector("#link-candidates")
    assert tab.locator("#link-editor .lane-empty").count() == 0


def test_guardians_say_that_no_model_reads_images_and_offer_no_empty_choice(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = lending_tab(cluster, new_page)
    tab.wait_for_selector('#guardian-models tr[data-model="fast"]')
    note = tab.locator("#guardian-none")
    assert note.is_visible()
    assert "No model in the cluster reads images" in note.inner_text()
    selects = tab.locator("#guardians select")
    assert selects.count() == 1 + 3 + 2  # the cluster, three nodes, two text models
    assert selects.evaluate_all("ss => ss.every(s => s.disabled)")
    ARTIFACTS.mkdir(exist_ok=True)
    tab.locator("#guardians").screenshot(path=str(ARTIFACTS / "guardians-none-reads-images.png"))


def test_the_held_requests_table_says_when_none_is_held(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = lending_tab(cluster, new_page)
    row = tab.locator("#held tbody tr.none")
    row.wait_for()
    assert "No request is held now" in row.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    tab.locator("#held").screenshot(path=str(ARTIFACTS / "held-requests-none.png"))


def test_remove_asks_first_and_a_declined_remove_keeps_the_link(
    linked: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = lending_tab(linked, new_page)
    tab.wait_for_selector(LINK_ROW)
    asked: list[str] = []

    def decline(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    tab.once("dialog", decline)
    tab.click(f"{LINK_ROW} button.remove")
    wait_for(lambda: asked, timeout=10)
    assert "Remove the text link o/big \u2192 h/fast?" in asked[0]
    # Declined: nothing was sent, the link stays, on the server and on the page.
    tab.evaluate("refresh()")
    tab.wait_for_function("document.querySelector('#status').innerText.startsWith('updated')")
    assert [(ln["owner_model_id"], ln["helper_model_id"]) for ln in text_links(linked)] == [
        ("big", "fast")
    ]
    assert tab.locator(LINK_ROW).count() == 1

    tab.once("dialog", lambda dialog: dialog.accept())
    tab.click(f"{LINK_ROW} button.remove")
    tab.wait_for_selector(LINK_ROW, state="detached")
    assert text_links(linked) == []


def test_edit_clears_the_last_saved_message(linked: Cluster, new_page: Callable[..., Any]) -> None:
    tab = lending_tab(linked, new_page)
    tab.wait_for_selector('#link-node option[value="h"]', state="attached")
    tab.select_option("#link-node", "h")
    tab.select_option("#link-model", "fast")
    tab.wait_for_selector('#link-candidates tr[data-candidate="o/big"]')
    tab.click("#link-save")
    tab.wait_for_selector("#link-msg")
    assert "Saved" in tab.locator("#link-msg").inner_text()
    tab.click(f"{LINK_ROW} button.edit")
    tab.wait_for_function("document.getElementById('link-model').value === 'big'")
    tab.wait_for_selector('#link-candidates tr[data-candidate="h/fast"]')
    assert tab.locator("#link-msg").count() == 0
    ARTIFACTS.mkdir(exist_ok=True)
    tab.locator("#links").screenshot(path=str(ARTIFACTS / "links-edit-no-old-message.png"))


def test_a_flag_of_a_direction_not_picked_is_drawn_unticked(
    linked: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = lending_tab(linked, new_page)
    tab.wait_for_selector('#link-node option[value="o"]', state="attached")
    tab.select_option("#link-node", "o")
    tab.select_option("#link-model", "big")
    fast = tab.locator('#link-candidates tr[data-candidate="h/fast"]')
    fast.wait_for()

    def flag(direction: str, field: str) -> Any:
        return fast.locator(f'input[data-link$=":{direction}:{field}"]')

    # big lends to fast, loading it: ticked and editable.
    assert flag("lends_to", "load_if_unloaded").is_checked()
    assert flag("lends_to", "load_if_unloaded").is_enabled()
    # big does not borrow from fast: that direction's flags are off and say so.
    assert flag("borrows_from", "load_if_unloaded").is_disabled()
    assert not flag("borrows_from", "load_if_unloaded").is_checked()
    # Unpicking a direction unticks its flags on screen; picking it again brings them back.
    flag("lends_to", "selected").uncheck()
    assert flag("lends_to", "load_if_unloaded").is_disabled()
    assert not flag("lends_to", "load_if_unloaded").is_checked()
    ARTIFACTS.mkdir(exist_ok=True)
    tab.locator("#link-editor").screenshot(path=str(ARTIFACTS / "links-flags-unpicked.png"))
    flag("lends_to", "selected").check()
    assert flag("lends_to", "load_if_unloaded").is_checked()


def test_the_site_icon_is_served_and_a_page_view_logs_no_warning(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    answer = httpx.get(cluster.master.base_url + "/favicon.ico")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "image/x-icon"
    # An ICO directory of one image, a PNG.
    assert answer.content[:4] == b"\x00\x00\x01\x00" and b"PNG" in answer.content[:40]
    icons: list[int] = []
    tab = new_page()
    tab.on("response", lambda r: icons.append(r.status) if r.url.endswith("/favicon.ico") else None)
    before = len(cluster.master.lines)
    tab.goto(cluster.master.base_url + "/ui/nodes")
    tab.wait_for_function("document.querySelector('#status').innerText.startsWith('updated')")
    tab.goto(cluster.master.base_url + "/ui/lending")
    tab.wait_for_function("document.querySelector('#status').innerText.startsWith('updated')")
    assert all(status == 200 for status in icons), icons
    logged = cluster.master.lines[before:]
    assert not [line for line in logged if "favicon" in line or "Not Found" in line], logged


def frozen_nodes_page(cluster: Cluster, new_page: Callable[..., Any]) -> Any:
    """The Nodes page with its 5 s timer frozen: it redraws when the test says so or after an
    unload, so what it shows is what it drew."""
    tab = new_page()
    start = datetime(2026, 1, 1, 8, 0, 0)
    tab.clock.install(time=start)
    tab.clock.pause_at(start + timedelta(seconds=1))
    tab.goto(cluster.master.base_url + "/ui/nodes")
    return tab


def load_fast(cluster: Cluster) -> int:
    with cluster.master.client() as client:
        client.post("/router/v1/load", json={"model": "fast"}).raise_for_status()
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "h"}).json()
    text = next(b for b in state["backends"] if b["id"] == "text-runtime")
    generation: int = text["loaded_models"][0]["generation"]
    return generation


def test_an_unload_a_link_undoes_says_so_and_a_stale_press_says_what_changed(
    linked: Cluster, new_page: Callable[..., Any]
) -> None:
    c = linked
    generation = load_fast(c)
    tab = frozen_nodes_page(c, new_page)
    tab.wait_for_selector(FAST_ROW)
    line = tab.locator(FAST_ROW).inner_text()
    # The lane once, in words; no "text · text".
    assert "text lane" in line and "text \u00b7 text" not in line, line
    notice = tab.locator('section[data-node="h"] .notice')

    tab.locator(FAST_ROW + " button.unload").click()
    tab.wait_for_function(
        "document.querySelector('section[data-node=\"h\"]').innerText.includes('Nothing loaded.')"
    )
    text = notice.inner_text()
    assert f"Unloaded fast (generation {generation})" in text
    assert "lending link from o/big may load it back" in text and "load if unloaded" in text
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "nodes-unload-link-reloads.png"), full_page=True)

    # fast is loaded again (as the link would load it for a backlog), and behind the page's
    # back unloaded and loaded once more: the page's Unload names a generation that is gone.
    again = load_fast(c)
    tab.evaluate("refresh()")
    tab.wait_for_selector(FAST_ROW)
    with c.master.client() as client:
        body = {
            "node_id": "h",
            "backend_id": "text-runtime",
            "runtime_id": "text",
            "expected_generation": again,
        }
        client.post("/router/v1/site/nodes/unload", json=body).raise_for_status()
    newest = load_fast(c)
    tab.locator(FAST_ROW + " button.unload").click()
    tab.wait_for_selector('section[data-node="h"] .notice.err')
    text = notice.inner_text()
    assert f"this page showed fast at generation {again}" in text, text
    assert f"fast was loaded again (generation {newest})" in text, text
    assert "lending link from o/big may have loaded it back" in text, text
    assert "press Unload again" in text
    tab.screenshot(path=str(ARTIFACTS / "nodes-unload-stale-explained.png"), full_page=True)


def test_lent_work_names_whose_it_is_and_active_requests_are_counted_per_model(
    linked: Cluster, new_page: Callable[..., Any]
) -> None:
    c = linked
    load_fast(c)
    done: list[int] = []

    def call() -> None:
        with c.slaves["o"].client(timeout=120) as oc:
            body = {
                "model": "big",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 100,
            }
            done.append(oc.post("/v1/chat/completions", json=body).status_code)

    tab = frozen_nodes_page(c, new_page)
    tab.wait_for_selector(FAST_ROW)
    assert tab.locator('section[data-node="h"] .active-none').count() == 1
    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        # Ask the page to redraw until h runs work o lent it.
        tab.wait_for_function(
            "sel => { refresh(); return document.querySelector(sel) !== null; }",
            arg=FAST_ROW + ".borrowed .badge.lent",
            polling=300,
            timeout=60_000,
        )
        badge = tab.locator(FAST_ROW + " .badge.lent").inner_text()
        assert badge in ("lent work of o/big", "lent work of another node"), badge
        tab.wait_for_function(
            "sel => { refresh(); const b = document.querySelector(sel);"
            " return b !== null && b.innerText === 'lent work of o/big'; }",
            arg=FAST_ROW + " .badge.lent",
            polling=300,
            timeout=60_000,
        )
        active = tab.locator('section[data-node="h"] ul.active li[data-model="fast"]')
        active.wait_for()
        assert "running" in active.inner_text() and "text lane" in active.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "nodes-lent-work-named.png"), full_page=True)
    finally:
        for t in threads:
            t.join()
    assert done == [200] * 8
