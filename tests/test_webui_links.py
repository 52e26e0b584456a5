"""Links made and removed in the Lending tab (headless Chromium) on a real three-node cluster."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import require_chromium
from tests.harness import REPO, Cluster, ModelSpec, sim_weights, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    wide = ModelSpec("wide", {"contextsize": 4096, "parallel": 2}, {"model_param": sim_weights()})
    c = start_cluster(
        tmp_path_factory.mktemp("webui-links"),
        [],
        {
            "o": [text_model("big", base_ms=5, output_ms_per_token=30)],
            "h": [text_model("fast", base_ms=5, output_ms_per_token=2), wide],
        },
        master_sections={"cluster": {"offload_probe_idle": "100ms"}},
    )
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def tab(cluster: Cluster, new_page: Callable[..., Any]) -> Any:
    page = new_page()
    page.goto(cluster.master.base_url + "/ui/lending")
    return page


@pytest.fixture
def unlinked(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, o/big's link removed after the test whatever it left: each test starts
    from no link at all."""
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


def lent_rows(cluster: Cluster) -> list[dict[str, Any]]:
    with cluster.master.client() as client:
        doc = client.get("/router/v1/site/offload/decisions", params={"outcome": "lent"}).json()
        rows: list[dict[str, Any]] = doc["records"]
        return rows


def drive_backlog(cluster: Cluster, n: int = 6) -> None:
    def call() -> None:
        with cluster.slaves["o"].client() as oc:
            body = {"model": "big", "messages": [{"role": "user", "content": "x"}], "max_tokens": 8}
            oc.post("/v1/chat/completions", json=body).raise_for_status()

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def pick(tab: Any, lane: str, node: str, model: str) -> None:
    tab.wait_for_selector(f'#link-node option[value="{node}"]', state="attached")
    tab.select_option("#link-lane", lane)
    tab.select_option("#link-node", node)
    tab.select_option("#link-model", model)


def test_a_link_made_in_the_tab_asks_for_the_acknowledgement_lends_and_is_removed(
    unlinked: Cluster, tab: Any
) -> None:
    cluster = unlinked
    pick(tab, "text", "o", "big")
    fast = tab.locator('#link-candidates tr[data-candidate="h/fast"]')
    fast.wait_for()
    assert "different weights" in fast.inner_text()
    # An ineligible candidate is listed, greyed, with the reason, and cannot be ticked.
    wide = tab.locator('#link-candidates tr[data-candidate="h/wide"]')
    assert "ineligible" in (wide.get_attribute("class") or "")
    assert "ineligible:" in wide.inner_text()
    assert wide.locator('input[data-link$=":lends_to:selected"]').is_disabled()
    assert "lends to: none" in tab.locator("#link-editor .link-now").inner_text()

    fast.locator('input[data-link$=":lends_to:selected"]').check()
    tab.click("#link-save")
    # Different weights: the page asks first and sends nothing until the operator agrees.
    tab.wait_for_selector("#link-ack-box")
    assert "h/fast" in tab.locator("#link-ack-box").inner_text()
    assert tab.locator("#link-save-anyway").is_disabled()
    assert text_links(cluster) == []
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "links-acknowledge.png"), full_page=True)
    tab.check("#link-ack")
    tab.click("#link-save-anyway")
    tab.wait_for_selector('#links-all tr[data-link="text:o/big>h/fast"]')
    assert [(ln["owner_model_id"], ln["helper_model_id"]) for ln in text_links(cluster)] == [
        ("big", "fast")
    ]
    assert "lends to: h/fast" in tab.locator("#link-editor .link-now").inner_text()
    # The flags were the page's defaults: loading allowed, no restore.
    link = text_links(cluster)[0]
    assert link["load_if_unloaded"] is True and link["restore_after_borrow"] is False

    # It takes effect: a backlog on o lends to h.
    with cluster.master.client() as client:
        client.post("/router/v1/load", json={"model": "fast"}).raise_for_status()
    drive_backlog(cluster)
    wait_for(
        lambda: any(r.get("helper_model_id") == "fast" for r in lent_rows(cluster)), timeout=30
    )
    tab.wait_for_function(
        "[...document.querySelectorAll('#decisions tr.group')]"
        ".some(r => r.innerText.includes('lent'))",
        timeout=20000,
    )
    tab.screenshot(path=str(ARTIFACTS / "links-made.png"), full_page=True)

    # Removed from the table of every link (once agreed to): gone from the API and the page.
    tab.once("dialog", lambda dialog: dialog.accept())
    tab.click('#links-all tr[data-link="text:o/big>h/fast"] button.remove')
    tab.wait_for_selector('#links-all tr[data-link="text:o/big>h/fast"]', state="detached")
    assert text_links(cluster) == []
    assert "No links yet" in tab.locator("#links-all").inner_text()


def test_flags_set_in_the_tab_are_saved_and_a_same_weights_save_needs_no_acknowledgement(
    cluster: Cluster, tab: Any
) -> None:
    # h/fast borrows from o/big, with restore and without loading: set from h's side.
    pick(tab, "text", "h", "fast")
    big = tab.locator('#link-candidates tr[data-candidate="o/big"]')
    big.wait_for()
    big.locator('input[data-link$=":borrows_from:selected"]').check()
    big.locator('input[data-link$=":borrows_from:load_if_unloaded"]').uncheck()
    big.locator('input[data-link$=":borrows_from:restore_after_borrow"]').check()
    tab.click("#link-save")
    tab.check("#link-ack")
    tab.click("#link-save-anyway")
    tab.wait_for_selector('#links-all tr[data-link="text:o/big>h/fast"]')
    links = text_links(cluster)
    try:
        assert [
            (
                ln["owner_model_id"],
                ln["helper_model_id"],
                ln["load_if_unloaded"],
                ln["restore_after_borrow"],
            )
            for ln in links
        ] == [("big", "fast", False, True)]
        # Saving again changes a flag of an existing link: no acknowledgement is asked.
        big.locator('input[data-link$=":borrows_from:restore_after_borrow"]').uncheck()
        tab.click("#link-save")
        wait_for(lambda: text_links(cluster)[0]["restore_after_borrow"] is False)
        assert tab.locator("#link-ack-box").count() == 0
    finally:
        with cluster.master.client() as client:
            client.delete(
                "/router/v1/site/text-routing-groups", params={"node_id": "o", "model_id": "big"}
            ).raise_for_status()


def test_picking_another_model_clears_the_candidates_until_its_links_arrive(
    cluster: Cluster, tab: Any
) -> None:
    pick(tab, "text", "o", "big")
    tab.locator('#link-candidates tr[data-candidate="h/fast"]').wait_for()
    # h/fast's links are held back: until they come, o/big's candidates must not be on show
    # (a tick there would be lost when h/fast's table replaces them).
    held: list[Any] = []
    tab.route("**/text-routing-groups?node_id=h*", lambda route: held.append(route))
    tab.select_option("#link-node", "h")
    tab.select_option("#link-model", "fast")
    tab.wait_for_function("document.querySelector('#link-editor').innerText.includes('Loading')")
    assert tab.locator("#link-candidates").count() == 0
    assert "Loading the links of h/fast" in tab.locator("#link-editor").inner_text()
    for route in held:
        route.continue_()
    tab.unroute("**/text-routing-groups?node_id=h*")
    tab.locator('#link-candidates tr[data-candidate="o/big"]').wait_for()
