"""The WebUI at 300 nodes (headless Chromium, a real master, 300 emulated slaves).

The Nodes page groups the nodes by what they do (loading, busy, lending, down, idle) with
counts, folds the idle ones into one line, pages the cards, filters by state and model and
searches; its first paint comes within 2 s and it fits a 390 px phone. The Lending tab's link
picker searches, and its timeline charts the nodes that lent or borrowed, the others on a line.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from playwright.sync_api import expect

from bench import slaves
from bench.slaves import EmulatedSlave, SlaveFarm
from tests.browser import require_chromium
from tests.emulated import EmulatedCluster, emulated_cluster, poll
from tests.harness import REPO
from tests.test_openapi import assert_matches

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
NODES = 300
FIRST_PAINT_LIMIT_MS = 2000.0
# Which emulated slaves do what (the master itself is idle): the rest are idle.
BUSY = [f"emu{i:04d}" for i in range(10, 30)]
LENDING = [f"emu{i:04d}" for i in range(30, 40)]
LOADING = [f"emu{i:04d}" for i in range(40, 45)]
DOWN = [f"emu{i:04d}" for i in range(45, 50)]
IDLE_COUNT = NODES + 1 - len(BUSY) - len(LENDING) - len(LOADING) - len(DOWN)


def _lending_state(slave: EmulatedSlave) -> dict[str, Any]:
    """A helper running a request another node lent it."""
    state = EmulatedSlave.state(slave)
    model = state["backends"][0]["loaded_models"][0]
    model.update(borrowed=True, active=1)
    state["backends"][0]["active"] = 1
    return state


def _loading_state(slave: EmulatedSlave) -> dict[str, Any]:
    """A text runtime loading the slave's second model."""
    state = EmulatedSlave.state(slave)
    runtime = state["backends"][0]
    name = slave.model_names[1]
    load = {"model_id": name, "elapsed_ms": 1500, "waiting": 1, "expected_ms": 2000.0}
    runtime.update(lifecycle_state="loading", loading=name, load=load, loaded_models=[])
    return state


def _set_states(cluster: EmulatedCluster) -> None:
    """Give the emulated slaves the states above; a down one answers its polls with a 500."""
    by_id = cluster.farm.farm.by_id
    for node_id in BUSY:
        by_id[node_id].active = 2
    for node_id in LENDING:
        slave = by_id[node_id]
        setattr(slave, "state", lambda s=slave: _lending_state(s))  # noqa: B010
    for node_id in LOADING:
        slave = by_id[node_id]
        setattr(slave, "state", lambda s=slave: _loading_state(s))  # noqa: B010
    DOWN_NOW.update(DOWN)

    def down_seen() -> bool:
        nodes = cluster.state()["cluster"]["nodes"]
        return {n["node_id"] for n in nodes if not n["healthy"]} == set(DOWN)

    poll(down_seen, 60, "the master sees the down slaves as down")


# Emulated slaves that answer their health polls with a 503 (filled once the master is up:
# it waits for every slave to be healthy before the test starts).
DOWN_NOW: set[str] = set()


async def _polled(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    """The emulator's `node/models`, or a 503 from a slave that is down."""
    if slave.node_id in DOWN_NOW:
        return slaves.error(503, "this emulated slave is down", "backend_error")
    return await slaves.on_models(farm, slave, request)


async def _lending_timeline(
    farm: SlaveFarm, slave: EmulatedSlave, request: web.Request
) -> web.Response:
    """The emulator's timeline, where a lending helper spent its last interval on borrowed work."""
    answer = await slaves.on_timeline(farm, slave, request)
    if slave.node_id not in LENDING:
        return answer
    doc = json.loads(answer.text or "{}")
    doc["node"]["borrowed_ms"][-1] = doc["step_ms"] // 2
    return web.json_response(doc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCluster]:
    routes = dict(slaves.ROUTES)
    slaves.ROUTES["offload/timeline"] = (routes["offload/timeline"][0], _lending_timeline)
    slaves.ROUTES["models"] = (routes["models"][0], _polled)
    try:
        with emulated_cluster(tmp_path_factory.mktemp("webui-scale"), NODES) as c:
            _set_states(c)
            yield c
    finally:
        slaves.ROUTES.update(routes)
        DOWN_NOW.clear()


def _open_nodes(new_page: Callable[..., Any], cluster: EmulatedCluster, viewport: Any) -> Any:
    tab = new_page(viewport=viewport)
    tab.goto(cluster.master_url + "/ui/nodes")
    tab.wait_for_function("window.fullPaintMs !== undefined", timeout=60_000)
    return tab


def _cards(tab: Any) -> list[str]:
    ids: list[str] = tab.eval_on_selector_all(".card", "cs => cs.map(c => c.dataset.node)")
    return ids


def _groups(tab: Any) -> list[str]:
    groups: list[str] = tab.eval_on_selector_all(".group", "gs => gs.map(g => g.dataset.group)")
    return groups


def test_every_nodes_state_comes_in_one_answer_and_other_values_are_refused(
    cluster: EmulatedCluster,
) -> None:
    url = cluster.master_url + "/router/v1/site/nodes/state"
    doc = httpx.get(url, params={"nodes": "all"}, timeout=60).json()
    states = {s["node_id"]: s for s in doc["node_states"]}
    assert len(states) == NODES - len(DOWN)
    assert states[LENDING[0]]["backends"][0]["loaded_models"][0]["borrowed"] is True
    assert [e["node_id"] for e in doc["node_errors"]] == DOWN
    assert all(e["error"] == "node is not healthy" for e in doc["node_errors"])
    assert len(doc["cluster"]["nodes"]) == NODES
    assert_matches("/router/v1/site/nodes/state", "GET", 200, doc)
    # Without the parameter the answer is as it was: the master's state and the cluster list.
    plain = httpx.get(url, timeout=60).json()
    assert "node_states" not in plain and "node_errors" not in plain
    refused = httpx.get(url, params={"nodes": "some"}, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "nodes"


def test_the_nodes_page_paints_300_nodes_within_2_s_and_fits_a_phone(
    cluster: EmulatedCluster, new_page: Callable[..., Any]
) -> None:
    figures = []
    for _ in range(3):
        tab = _open_nodes(new_page, cluster, PHONE)
        figures.append(tab.evaluate("({first: window.firstPaintMs, full: window.fullPaintMs})"))
        # One page at a time, each load on a quiet master: the page's inventory (asked after
        # the states, a fan-out to every node) is answered before the next load starts.
        tab.wait_for_selector(".card .mem", timeout=60_000)
        tab.context.close()
    tab = _open_nodes(new_page, cluster, PHONE)
    first = statistics.median(f["first"] for f in figures)
    full = statistics.median(f["full"] for f in figures)
    ARTIFACTS.mkdir(exist_ok=True)
    result = {"nodes": NODES, "loads": figures, "first_paint_ms": first, "full_paint_ms": full}
    Path(ARTIFACTS / "webui-300-nodes.json").write_text(json.dumps(result, indent=1))
    assert first <= FIRST_PAINT_LIMIT_MS, result
    # The fullest view: the idle nodes shown, a page of 50 cards and the pager.
    tab.click("#show-idle")
    tab.wait_for_selector(".pager")
    tab.screenshot(path=str(ARTIFACTS / "webui-300-nodes-390.png"))
    width = tab.evaluate("[document.documentElement.scrollWidth, document.body.scrollWidth]")
    assert max(width) <= PHONE["width"], width


def test_the_nodes_page_groups_by_state_with_counts_and_folds_the_idle_ones(
    cluster: EmulatedCluster, new_page: Callable[..., Any]
) -> None:
    tab = _open_nodes(new_page, cluster, DESKTOP)
    buttons = tab.eval_on_selector_all("#tools .states button", "bs => bs.map(b => b.textContent)")
    assert buttons == [
        f"All {NODES + 1}",
        f"Loading {len(LOADING)}",
        f"Busy {len(BUSY)}",
        f"Lending {len(LENDING)}",
        f"Down {len(DOWN)}",
        f"Idle {IDLE_COUNT}",
    ]
    assert _groups(tab) == ["loading", "busy", "lending", "down"]
    assert _cards(tab) == LOADING + BUSY + LENDING + DOWN
    assert tab.inner_text(f'.card[data-node="{LOADING[0]}"] .load b') == (
        f"loading {LOADING[0]}-m1"
    )
    assert tab.inner_text(".idle-line") == f"{IDLE_COUNT} idle nodes — show"
    tab.screenshot(path=str(ARTIFACTS / "webui-300-nodes-groups.png"), full_page=True)
    tab.click("#show-idle")
    listed = len(LOADING + BUSY + LENDING + DOWN) + IDLE_COUNT
    pages = -(-listed // 50)
    assert tab.inner_text(".pager .muted") == f"Page 1 of {pages} · 1\u201350 of {listed}"
    assert len(_cards(tab)) == 50
    assert _groups(tab) == ["loading", "busy", "lending", "down", "idle"]
    for _ in range(pages - 1):
        tab.click(".pager .next")
    last = _cards(tab)
    assert len(last) == listed - 50 * (pages - 1)
    assert last[-1] == "emu0299" and _groups(tab) == ["idle"]
    assert tab.is_disabled(".pager .next") and not tab.is_disabled(".pager .prev")


def test_the_nodes_page_filters_by_state_and_model_and_searches(
    cluster: EmulatedCluster, new_page: Callable[..., Any]
) -> None:
    tab = _open_nodes(new_page, cluster, DESKTOP)
    tab.click('#tools button[data-state="busy"]')
    assert _cards(tab) == BUSY and _groups(tab) == ["busy"]
    assert tab.query_selector(".idle-line") is None
    assert tab.get_attribute('#tools button[data-state="busy"]', "aria-pressed") == "true"
    tab.click('#tools button[data-state=""]')
    # The model list comes with the first refresh's extras.
    tab.wait_for_selector('#f-model option[value="emu0077-m1"]', state="attached")
    tab.select_option("#f-model", "emu0077-m1")
    assert _cards(tab) == ["emu0077"] and _groups(tab) == ["idle"]
    tab.select_option("#f-model", "")
    # A search shows what matches, idle nodes included, by node ID, model or URL.
    tab.fill("#f-search", "emu0123")
    assert _cards(tab) == ["emu0123"]
    port = cluster.farm.farm.by_id["emu0200"].port
    tab.fill("#f-search", f":{port}")
    assert _cards(tab) == ["emu0200"]
    tab.fill("#f-search", "emu003")
    assert _cards(tab) == LENDING
    tab.fill("#f-search", "no-such-node")
    assert _cards(tab) == []
    assert tab.inner_text(".none") == "No node matches these filters."
    assert tab.inner_text("#shown") == f"0 of {NODES + 1} nodes"


def test_the_link_pickers_search_narrows_300_nodes_to_the_matches(
    cluster: EmulatedCluster, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport=PHONE)
    tab.goto(cluster.master_url + "/ui/lending")
    tab.wait_for_function("document.querySelectorAll('#link-node option').length >= 300")

    def options(select: str) -> list[str]:
        values: list[str] = tab.eval_on_selector_all(
            f"{select} option", "os => os.map(o => o.value)"
        )
        return values

    tab.fill("#link-search", "emu0123")
    assert options("#link-node") == ["emu0123"]
    assert options("#link-model") == ["emu0123-m0", "emu0123-m1"]
    assert tab.inner_text("#link-search-note") == "2 models on 1 node match"
    tab.wait_for_selector("#link-editor :text('emu0123-m0')")
    tab.fill("#link-search", "m1")
    assert len(options("#link-node")) == NODES
    assert options("#link-model") == ["emu0123-m1"]
    tab.fill("#link-search", "no-such-model")
    assert tab.inner_text("#link-search-note") == "nothing matches"
    assert tab.is_hidden("#link-node") and tab.is_hidden("#link-model")
    tab.fill("#link-search", "")
    assert len(options("#link-node")) == NODES
    width = tab.evaluate("[document.documentElement.scrollWidth, document.body.scrollWidth]")
    assert max(width) <= PHONE["width"], width


def test_the_timeline_charts_the_nodes_that_lent_or_borrowed_and_folds_the_rest(
    cluster: EmulatedCluster, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport=PHONE)
    tab.goto(cluster.master_url + "/ui/lending")
    tab.wait_for_selector("#tl-show-quiet", timeout=60_000)

    def charted() -> list[str]:
        keys: list[str] = tab.eval_on_selector_all(
            "#tl-nodes [data-chart]", "bs => bs.map(b => b.dataset.chart.slice(5))"
        )
        return keys

    assert charted() == LENDING
    # The down nodes are not in the timeline (its note names them). Waited for: with the whole
    # suite on two cores, a poll round of the 300 emulated nodes can miss its deadline for some
    # of them (191 of 286 quiet ones shown once), until the page's next refresh after it.
    charts = NODES + 1 - len(DOWN)
    expect(tab.locator("#tl-more .muted")).to_have_text(
        f"{charts - len(LENDING)} nodes neither lent nor borrowed in this window —",
        timeout=60_000,
    )
    assert all(n in tab.inner_text("#tl-note") for n in DOWN)
    tab.fill("#tl-search", "emu0123")
    assert charted() == ["emu0123"]
    tab.fill("#tl-search", "")
    tab.click("#tl-show-quiet")
    assert len(charted()) == 24
    assert tab.inner_text("#tl-show-more") == f"show 24 more ({charts - 24} not shown)"
    tab.click("#tl-show-more")
    assert len(charted()) == 48 and charted() == sorted(charted())
    width = tab.evaluate("[document.documentElement.scrollWidth, document.body.scrollWidth]")
    assert max(width) <= PHONE["width"], width


def test_the_nodes_page_asks_for_the_inventory_and_models_every_6th_refresh_only(
    cluster: EmulatedCluster, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport=DESKTOP)
    asked: list[str] = []
    tab.on("request", lambda r: asked.append(r.url.split("/router/v1/", 1)[-1]))
    tab.goto(cluster.master_url + "/ui/nodes")
    tab.wait_for_function("window.fullPaintMs !== undefined", timeout=60_000)
    for _ in range(7):
        tab.evaluate("refresh()")

    def due() -> bool:
        # The summary is asked once per refresh: refresh n asks for the others when n % 6 == 1.
        refreshes = asked.count("site/offload/summary")
        expected = len([n for n in range(1, refreshes + 1) if n % 6 == 1])
        return refreshes >= 8 and asked.count("site/inventory") == expected == asked.count("models")

    poll(due, 30, "the inventory and model list asked for every 6th refresh")
    assert asked.count("site/nodes/state?nodes=all") >= 8
