"""A model load shown while it runs, on the Nodes page and the Lending tab (headless Chromium)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.browser import require_chromium
from tests.harness import (
    CLUSTER_TOKEN,
    REPO,
    Cluster,
    ModelSpec,
    sim_weights,
    start_cluster,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
# Long enough that the page's 5 s refresh and a browser poll see it under way on a busy machine.
SLOW_LOAD_MS = 8000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    def slow(name: str) -> ModelSpec:
        weights = {"model_param": sim_weights(load_ms=SLOW_LOAD_MS)}
        return ModelSpec(name, {"contextsize": 4096, "parallel": 1}, weights)

    # slowload is loaded by the first test only, so its first load is never measured before.
    c = start_cluster(
        tmp_path_factory.mktemp("webui-loads"),
        [],
        {"s": [slow("slowload"), slow("slow2"), text_model("quick")]},
        master_sections={"cluster": {"scheduling_refresh_interval": "1s"}},
    )
    try:
        yield c
    finally:
        c.cleanup()


def chat(cluster: Cluster, model: str) -> None:
    with cluster.master.client() as client:
        body = {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        client.post("/v1/chat/completions", json=body).raise_for_status()


def measured_loads(cluster: Cluster) -> dict[str, float]:
    # The slave's own cost tables, as the master's planner reads them.
    headers = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
    doc = httpx.get(
        cluster.slaves["s"].base_url + "/router/v1/node/runtime-status", headers=headers
    ).json()
    costs = doc.get("costs") or {}
    return {row["config_filename"]: row["load_ms"] for row in costs.get("loads", [])}


def watch_load(new_page: Callable[..., Any], cluster: Cluster, url_path: str, selector: str) -> Any:
    tab = new_page()
    tab.goto(cluster.master.base_url + url_path)
    tab.wait_for_selector(selector)
    return tab


def shown(tab: Any, selector: str) -> None:
    """Wait for `selector` while the load runs, asking the page to refresh every half second
    rather than waiting for its 5 s timer (a busy machine may stretch that past the load)."""
    tab.wait_for_function(
        "sel => { refresh(); return document.querySelector(sel) !== null; }",
        arg=selector,
        polling=500,
        timeout=SLOW_LOAD_MS,
    )


def test_a_load_shows_its_model_elapsed_time_waiting_requests_and_then_its_expected_time(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    chat(cluster, "quick")
    tab = watch_load(new_page, cluster, "/ui/nodes", '.card[data-node="s"]')
    card = tab.locator('.card[data-node="s"]')
    # A first load: no load time measured yet, one client waiting on it.
    caller = threading.Thread(target=chat, args=(cluster, "slowload"))
    caller.start()
    try:
        load = card.locator('.load[data-loading="slowload"]')
        shown(tab, '.card[data-node="s"] .load[data-loading="slowload"]')
        text = load.inner_text()
        assert "loading slowload" in text and "1 waiting" in text, text
        assert "no load time measured yet" in text
        assert card.locator(".loaded-none").count() == 0  # never "Nothing loaded" now
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "nodes-loading-first.png"), full_page=True)
    finally:
        caller.join()
    # Loaded: the load row goes, the model is listed.
    card.locator('.load[data-loading="slowload"]').wait_for(state="detached", timeout=10000)
    card.locator("ul.runtimes li", has_text="slowload").wait_for(timeout=10000)

    # Once the node has measured that load, the next one shows its expected time as a bar.
    chat(cluster, "quick")
    wait_for(lambda: any(k.startswith("slowload") for k in measured_loads(cluster)), timeout=30)
    caller = threading.Thread(target=chat, args=(cluster, "slowload"))
    caller.start()
    try:
        bar = card.locator('.load[data-loading="slowload"] .bar')
        shown(tab, '.card[data-node="s"] .load[data-loading="slowload"] .bar')
        expected = float(bar.get_attribute("data-expected-ms") or 0)
        assert SLOW_LOAD_MS <= expected < SLOW_LOAD_MS * 3, expected
        assert "expected" in card.locator('.load[data-loading="slowload"]').inner_text()
        tab.screenshot(path=str(ARTIFACTS / "nodes-loading-expected.png"), full_page=True)
    finally:
        caller.join()


def test_the_lending_tab_shows_a_load_on_the_nodes_row(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    chat(cluster, "quick")
    tab = watch_load(new_page, cluster, "/ui/lending", "#nodes tbody tr:nth-child(2)")
    caller = threading.Thread(target=chat, args=(cluster, "slow2"))
    caller.start()
    try:
        load = tab.locator('#nodes tr .load[data-loading="slow2"]')
        shown(tab, '#nodes tr .load[data-loading="slow2"]')
        assert "1 waiting" in load.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "lending-loading.png"))
    finally:
        caller.join()


def test_node_state_reports_the_load_under_way_to_scripts(cluster: Cluster) -> None:
    chat(cluster, "quick")
    caller = threading.Thread(target=chat, args=(cluster, "slow2"))
    caller.start()
    try:

        def load_seen() -> dict[str, Any] | None:
            with cluster.master.client() as client:
                state = client.get("/router/v1/site/nodes/state", params={"node_id": "s"}).json()
            for backend in state["backends"]:
                if backend.get("load"):
                    found: dict[str, Any] = backend["load"]
                    return found
            return None

        load = wait_for(load_seen, timeout=SLOW_LOAD_MS / 1000)
        assert load["model_id"] == "slow2" and load["waiting"] == 1
        assert 0 <= load["elapsed_ms"] < SLOW_LOAD_MS * 2
    finally:
        caller.join()
