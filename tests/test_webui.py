"""The Lending tab in headless Chromium (Debian's build, driven by Playwright)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("webui"),
        [],
        {
            "o": [text_model("big", base_ms=5, output_ms_per_token=30)],
            "h": [text_model("fast", base_ms=5, output_ms_per_token=2)],
        },
        master_sections={"cluster": {"offload_probe_idle": "100ms"}},
    )
    try:
        with c.master.client() as client:
            link = {
                "anchor": {"node_id": "o", "model_id": "big"},
                "lends_to": [{"node_id": "h", "model_id": "fast"}],
                "acknowledge_different_weights": True,
            }
            assert client.post("/router/v1/site/text-routing-groups", json=link).status_code == 200
            client.post("/router/v1/load", json={"model": "fast"}).raise_for_status()

        def call() -> None:
            with c.slaves["o"].client() as oc:
                body = {
                    "model": "big",
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 8,
                }
                oc.post("/v1/chat/completions", json=body).raise_for_status()

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def page(cluster: Cluster, new_page: Callable[..., Any]) -> object:
    tab = new_page()
    tab.goto(cluster.master.base_url + "/ui/lending")
    return tab


def test_the_lending_tab_shows_every_node_in_sync_and_the_folded_decision_log(
    cluster: Cluster, page: object
) -> None:
    tab = page  # playwright Page
    tab.wait_for_selector("#nodes tbody tr:nth-child(3)")  # type: ignore[attr-defined]
    rows = tab.locator("#nodes tbody tr").all_inner_texts()  # type: ignore[attr-defined]
    assert sorted(r.split("\t")[0] for r in rows) == ["h", "master", "o"]
    assert all("in sync" in r for r in rows)
    tab.wait_for_selector("#decisions tbody tr.group")  # type: ignore[attr-defined]
    groups = tab.locator("#decisions tbody tr.group")  # type: ignore[attr-defined]
    texts = groups.all_inner_texts()
    assert any("lent" in t for t in texts) and any("probe" in t or "granted" in t for t in texts)
    assert any("\u00d7" in t for t in texts)  # the fold count
    groups.first.click()
    tab.wait_for_selector("#decisions tr.detail")  # type: ignore[attr-defined]
    assert "router" in tab.locator("#decisions tr.detail").first.inner_text()  # type: ignore[attr-defined]
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "lending-tab.png"), full_page=True)  # type: ignore[attr-defined]


def test_settings_typed_in_the_tab_are_saved_and_reach_the_cluster(
    cluster: Cluster, page: object
) -> None:
    tab = page
    box = tab.locator('input[data-key="offload_probe_idle"]')  # type: ignore[attr-defined]
    box.wait_for()
    box.fill("750ms")
    settings_path = cluster.master.base_url + "/router/v1/site/offload/settings"
    try:
        tab.click("#save")  # type: ignore[attr-defined]
        tab.wait_for_function(  # type: ignore[attr-defined]
            "document.querySelector('#settings').innerText.includes('750ms · db')"
        )
        with cluster.master.client() as client:
            entries = client.get("/router/v1/site/offload/settings").json()["entries"]
            effective = next(e for e in entries if e["key"] == "offload_probe_idle")["effective"]
            assert effective == "750ms"
    finally:
        # The other tests of the module see the fixture's settings, whatever happened here.
        assert httpx.delete(settings_path).status_code == 200


def test_the_nodes_page_lists_held_requests_with_their_state(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    done: list[int] = []

    def call() -> None:
        with cluster.slaves["o"].client(timeout=120) as oc:
            body: dict[str, object] = {
                "model": "big",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 100,
            }
            done.append(oc.post("/v1/chat/completions", json=body).status_code)

    # No probes for now (the helper would drain the queue in a blink): eight 3-second jobs at
    # depth 2 then stay queued for several seconds.
    settings_path = cluster.master.base_url + "/router/v1/site/offload/settings"
    httpx.post(settings_path, json={"values": {"offload_probe_idle": "10m"}}).raise_for_status()
    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        tab = new_page()
        tab.goto(cluster.master.base_url + "/ui/nodes")
        tab.wait_for_selector('section[data-node="o"] ul.held li', timeout=30_000)
        text = tab.locator('section[data-node="o"] ul.held').inner_text()
        assert "big" in text and "queued" in text
        # Waiting requests per key: these came with no stored key.
        waiting = tab.locator('section[data-node="o"] ul.waiting-keys').inner_text()
        assert "big" in waiting and "no key" in waiting
        assert tab.locator("section.card").count() == 3
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "nodes-page.png"), full_page=True)
        # The node's own state lists them too, as the summary does (not always []).
        state = httpx.get(
            cluster.master.base_url + "/router/v1/site/nodes/state",
            params={"node_id": "o"},
        ).json()
        held = state["held_requests"]
        assert any(r["model_id"] == "big" and r["state"] == "queued" for r in held), held
        assert any(w["model_id"] == "big" and w["key"] is None for w in state["waiting_by_key"])
    finally:
        httpx.delete(settings_path)
        for t in threads:
            t.join()
    assert done == [200] * 8


def test_the_nodes_page_shows_each_nodes_memory_or_says_it_has_none(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    with cluster.master.client() as client:
        inventory = client.get("/router/v1/site/inventory").json()
    hardware = {n["node_id"]: n["hardware"] for n in inventory["nodes"]}
    assert sorted(hardware) == ["h", "master", "o"]
    tab = new_page()
    tab.goto(cluster.master.base_url + "/ui/nodes")
    tab.wait_for_selector("section.card:nth-child(3) .mem")
    for node_id, hw in hardware.items():
        mem = tab.locator(f'section[data-node="{node_id}"] .mem')
        memory = hw["memory"]
        if memory is None:
            assert mem.inner_text() == "Memory unavailable on this node"
            continue
        assert mem.get_attribute("data-kind") == memory["kind"]
        assert mem.locator(".kind").inner_text() == memory["kind"].upper()
        # Used memory moves between two readings; the total does not.
        amount = mem.locator(".amount").inner_text()
        total = memory["total_bytes"] / 1024**3
        assert re.fullmatch(rf"\d+\.\d / {total:.1f} GB", amount), amount
        used = mem.locator(".membar .used").evaluate("e => parseFloat(e.style.width)")
        assert 0 < used <= 100
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "nodes-memory.png"), full_page=True)

    # A node that could not read its memory (no /proc/meminfo, nvidia-smi silent):
    # its card says so instead of drawing a bar, and the others keep theirs.
    def without_memory(route: Any) -> None:
        answer = route.fetch()
        doc = answer.json()
        for node in doc["nodes"]:
            if node["node_id"] == "h":
                node["hardware"] = {"memory": None, "cpu_count": 2, "note": "no reading"}
        route.fulfill(response=answer, json=doc)

    tab.route("**/router/v1/site/inventory", without_memory)
    tab.evaluate("refresh()")
    none = tab.locator('section[data-node="h"] .mem')
    assert none.inner_text() == "Memory unavailable on this node"
    assert none.get_attribute("title") == "no reading"
    assert tab.locator('section[data-node="h"] .membar').count() == 0
    assert tab.locator('section[data-node="o"] .membar').count() == 1
    tab.screenshot(path=str(ARTIFACTS / "nodes-memory-unavailable.png"), full_page=True)


def vision_model(name: str) -> ModelSpec:
    """A multimodal text model: a text model with a projector (`mmproj`)."""
    return ModelSpec(
        name,
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(vision=True), "mmproj": sim_weights(vision=True)},
    )


@pytest.fixture(scope="module")
def guardian_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # A cluster of its own: guardian candidates would change what the lending cluster shows.
    c = start_cluster(
        tmp_path_factory.mktemp("webui-guardians"),
        [text_model("plain")],
        {"s": [text_model("notes"), vision_model("seer"), vision_model("eye")]},
    )
    try:
        yield c
    finally:
        c.cleanup()


def guardians_doc(cluster: Cluster) -> dict[str, object]:
    with cluster.master.client() as client:
        doc: dict[str, object] = client.get("/router/v1/site/guardians").json()
        return doc


@pytest.fixture
def guardians_cleared(guardian_cluster: Cluster) -> Iterator[Cluster]:
    """The guardian cluster, its guardians cleared after the test whatever it left saved."""
    yield guardian_cluster
    doc: dict[str, Any] = guardians_doc(guardian_cluster)
    scopes = [("model", key) for key in doc["models"]] + [("node", key) for key in doc["nodes"]]
    if doc["cluster"] is not None:
        scopes.append(("cluster", ""))
    with guardian_cluster.master.client() as client:
        for scope, key in scopes:
            path = "/router/v1/site/guardians"
            client.delete(path, params={"scope": scope, "key": key}).raise_for_status()
    assert guardians_doc(guardian_cluster)["effective"] == {}


def test_guardians_chosen_in_the_tab_are_saved_and_shown_with_their_scope(
    guardians_cleared: Cluster, new_page: Callable[..., Any]
) -> None:
    c = guardians_cleared

    def effective(tab: Any, model: str) -> str:
        text: str = tab.locator(f'tr[data-model="{model}"] td.effective').inner_text()
        return text

    def wait_effective(tab: Any, model: str, text: str) -> None:
        tab.wait_for_function(
            """([m, t]) => {
                const cell = document.querySelector(`tr[data-model="${m}"] td.effective`);
                return cell !== null && cell.innerText === t;
            }""",
            arg=[model, text],
        )

    tab = new_page()
    tab.goto(c.master.base_url + "/ui/lending")
    tab.wait_for_selector('#guardian-cluster option[value="seer"]', state="attached")
    nodes = tab.locator("#guardian-nodes tbody tr")
    # key=str: a row without the attribute gives None, which sorts but still fails the check.
    shown = [nodes.nth(i).get_attribute("data-node") for i in range(nodes.count())]
    assert sorted(shown, key=str) == ["master", "s"]
    # Text-only models come first; a model's own selector does not offer itself.
    rows = tab.locator("#guardian-models tbody tr")
    assert [rows.nth(i).get_attribute("data-model") for i in range(rows.count())] == [
        "notes",
        "plain",
        "eye",
        "seer",
    ]
    seer_options = tab.locator('select[data-guardian="models:seer"] option')
    assert seer_options.evaluate_all("os => os.map(o => o.value)") == ["", "eye"]
    assert effective(tab, "plain") == "none"

    # The save is held in the browser until the tab has refreshed once: the refresh
    # must keep the operator's choice on screen while the router has not stored it.
    held: list[Any] = []
    tab.route(
        "**/router/v1/site/guardians",
        lambda route: held.append(route) if route.request.method == "POST" else route.continue_(),
    )
    tab.select_option('select[data-guardian="cluster"]', "seer")

    def save_held() -> bool:
        tab.evaluate("0")  # a round trip lets Playwright hand over the routed request
        return bool(held)

    wait_for(save_held)
    tab.evaluate("refresh()")
    assert guardians_doc(c)["cluster"] is None
    assert tab.locator('select[data-guardian="cluster"]').input_value() == "seer"
    held[0].continue_()
    tab.unroute("**/router/v1/site/guardians")
    wait_for(lambda: guardians_doc(c)["cluster"] == "seer")
    wait_effective(tab, "plain", "seer \u00b7 cluster")
    # The cluster's guardian does not guard itself.
    wait_effective(tab, "seer", "none (the cluster guardian is this model)")

    tab.select_option('select[data-guardian="models:plain"]', "eye")
    wait_for(lambda: guardians_doc(c)["models"] == {"plain": "eye"})
    wait_effective(tab, "plain", "eye \u00b7 model")
    assert effective(tab, "notes") == "seer \u00b7 cluster"

    tab.select_option('select[data-guardian="nodes:s"]', "eye")
    wait_for(lambda: guardians_doc(c)["nodes"] == {"s": "eye"})
    wait_effective(tab, "notes", "eye \u00b7 node s")
    assert effective(tab, "plain") == "eye \u00b7 model"  # the model scope still wins
    assert guardians_doc(c)["effective"] == {"notes": "eye", "plain": "eye", "seer": "eye"}

    # A list gone stale (its guardian left the cluster after the page drew it): the
    # router refuses the save, and the tab says why beside the selector and goes back
    # to what is really saved.
    notes = tab.locator('select[data-guardian="models:notes"]')
    notes.evaluate("s => s.append(new Option('ghost', 'ghost'))")
    notes.select_option("ghost")
    tab.wait_for_function(
        """() => document.querySelector('[data-guardian-error="models:notes"]')
            .innerText.includes('not a multimodal text model')"""
    )
    error = tab.locator('[data-guardian-error="models:notes"]').inner_text()
    assert 'guardian "ghost"' in error
    assert tab.locator('select[data-guardian="models:notes"]').input_value() == ""
    assert guardians_doc(c)["models"] == {"plain": "eye"}
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "lending-guardians.png"), full_page=True)

    tab.select_option('select[data-guardian="models:plain"]', "")
    wait_for(lambda: guardians_doc(c)["models"] == {})
    wait_effective(tab, "plain", "seer \u00b7 cluster")  # plain lives on the master
    tab.select_option('select[data-guardian="nodes:s"]', "")
    tab.select_option('select[data-guardian="cluster"]', "")
    wait_for(lambda: guardians_doc(c)["cluster"] is None and not guardians_doc(c)["nodes"])
    wait_effective(tab, "plain", "none")
    wait_effective(tab, "notes", "none")
    assert guardians_doc(c)["effective"] == {}


def test_the_nodes_page_marks_borrowed_work_and_unloads_by_generation(
    guardian_cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    c = guardian_cluster
    row = 'section[data-node="s"] li[data-backend="text-runtime"]'
    s_card = 'section[data-node="s"]'

    def shown_generation(tab: Any) -> str:
        title: str = tab.locator(row + " button.unload").get_attribute("title")
        return title

    with c.master.client() as client:
        client.post("/router/v1/load", json={"model": "notes"}).raise_for_status()
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "s"}).json()
        text = next(b for b in state["backends"] if b["id"] == "text-runtime")
        generation = text["loaded_models"][0]["generation"]
    answers: list[int] = []

    def borrowed() -> None:
        # A request lent to s, as the master's relay sends it: about 3 s of output.
        headers = {"Authorization": f"Bearer {CLUSTER_TOKEN}", "X-Tensors-Offload": "1"}
        body = {
            "model": "notes",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3000,
        }
        with c.slaves["s"].client(timeout=60) as slave:
            path = "/router/v1/node/inference/v1/chat/completions"
            answers.append(slave.post(path, json=body, headers=headers).status_code)

    tab = new_page()
    # The page's 5 s timer is frozen: it redraws when the test says so or after an
    # unload, so the generation on screen is the one it drew, whatever happens behind.
    start = datetime(2026, 1, 1, 8, 0, 0)
    tab.clock.install(time=start)
    tab.clock.pause_at(start + timedelta(seconds=1))
    tab.goto(c.master.base_url + "/ui/nodes")
    tab.wait_for_selector(row)
    assert tab.locator('section[data-node="master"] .badge.role-master').count() == 1
    assert tab.locator(f"{s_card} .badge.role-slave").count() == 1
    assert tab.locator(f"{s_card} h2 .dot.up").get_attribute("title") == "Online"
    assert tab.locator(f"{s_card} h2 .badge.warn").count() == 0  # same build as master
    line = tab.locator(row).inner_text()
    assert "notes" in line and "text lane" in line and "idle" in line
    assert shown_generation(tab) == f"generation {generation}"

    runner = threading.Thread(target=borrowed)
    runner.start()
    try:
        wait_for(
            lambda: tab.evaluate(
                f"refresh().then(() => document.querySelector('{row}.borrowed') !== null)"
            ),
            timeout=30,
        )
        # Relayed straight to s, not under a lease: the page knows no owner to name.
        assert tab.locator(row + " .badge.lent").inner_text() == "lent work of another node"
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "nodes-borrowed.png"), full_page=True)
    finally:
        runner.join(60)
    assert answers == [200]

    # Behind the page's back the runtime is unloaded and loaded again: the page's
    # Unload now names a generation that is gone, and the router refuses it.
    with c.master.client() as client:
        body = {
            "node_id": "s",
            "backend_id": "text-runtime",
            "runtime_id": "text",
            "expected_generation": generation,
        }
        client.post("/router/v1/site/nodes/unload", json=body).raise_for_status()
        client.post("/router/v1/load", json={"model": "notes"}).raise_for_status()
    tab.locator(row + " button.unload").click()
    tab.wait_for_selector(f"{s_card} .notice.err")
    notice = tab.locator(f"{s_card} .notice").inner_text()
    assert "Not unloaded" in notice
    assert f'"notes" at generation {generation + 1}' in notice
    # The page redrew after the refusal: it shows the new load, still there.
    tab.wait_for_function(
        """([sel, title]) => {
            const b = document.querySelector(sel);
            return b !== null && b.title === title;
        }""",
        arg=[row + " button.unload", f"generation {generation + 1}"],
    )
    tab.screenshot(path=str(ARTIFACTS / "nodes-unload-refused.png"), full_page=True)

    tab.locator(row + " button.unload").click()
    tab.wait_for_function(
        "document.querySelector('section[data-node=\"s\"]').innerText.includes('Nothing loaded.')"
    )
    assert "Unloaded notes" in tab.locator(f"{s_card} .notice").inner_text()
    tab.screenshot(path=str(ARTIFACTS / "nodes-unload.png"), full_page=True)
    with c.master.client() as client:
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "s"}).json()
    assert all(not b["loaded_models"] for b in state["backends"])


def test_the_timeline_shows_lending_per_node_and_per_owner(cluster: Cluster, page: object) -> None:
    # The fixture's backlog on o was lent to h: the series say so, per node and per owner.
    def timeline() -> dict[str, Any]:
        with cluster.master.client() as client:
            doc: dict[str, Any] = client.get(
                "/router/v1/site/offload/timeline", params={"minutes": 15}
            ).json()
            return doc

    def lent_and_borrowed() -> dict[str, Any] | None:
        doc = timeline()
        nodes = {n["node_id"]: n for n in doc["nodes"]}
        owners = {(o["owner_node_id"], o["owner_model_id"]): o for o in doc["owners"]}
        big = owners.get(("o", "big"))
        if big and sum(big["lent"]) and sum(nodes["h"]["borrowed_ms"]) and sum(nodes["o"]["lent"]):
            return doc
        return None

    doc = wait_for(lent_and_borrowed, timeout=30)
    assert doc["buckets"] == 60 and doc["step_ms"] == 15_000
    assert {n["node_id"] for n in doc["nodes"]} == {"master", "h", "o"}
    assert all(len(n["own_ms"]) == 60 for n in doc["nodes"])
    for n in doc["nodes"]:
        # Backend slot time, never the overlapping request times: the parts are the whole.
        slot_ms = n["slots"] * doc["step_ms"]
        parts = zip(n["own_ms"], n["borrowed_ms"], n["idle_ms"], strict=True)
        assert all(abs(sum(p) - slot_ms) <= 2 for p in parts), n
    big = next(o for o in doc["owners"] if o["owner_model_id"] == "big")
    assert max(big["held_max"]) >= 1
    tab = page  # playwright Page
    owner = tab.locator('#timeline [data-chart="owner:text:o/big"]')  # type: ignore[attr-defined]
    owner.wait_for()
    lent_text = owner.locator(".totals").inner_text()
    assert re.search(r"lent [1-9][0-9]* request", lent_text), lent_text
    helper = tab.locator('#timeline [data-chart="node:h"] .totals')  # type: ignore[attr-defined]
    borrowed = re.search(r"borrowed ([0-9.]+) (ms|s) ", helper.inner_text())
    assert borrowed and float(borrowed.group(1)) > 0, helper.inner_text()
    # Chart.js, served by the node itself, drew on the canvas.
    drawn = tab.evaluate(  # type: ignore[attr-defined]
        "typeof Chart === 'function' && Object.keys(Chart.instances).length >= 4"
    )
    assert drawn
    # Every interval of every node's chart: own + borrowed + idle is 100 % (± 1 for rounding).
    sums = tab.evaluate(  # type: ignore[attr-defined]
        """() => Object.entries(charts).filter(([k]) => k.startsWith("node:")).flatMap(([, c]) =>
            c.data.datasets[0].data.map((_, i) => [0, 1, 2].reduce((a, d) =>
                a + c.data.datasets[d].data[i], 0)))"""
    )
    assert sums and all(abs(v - 100) <= 1 for v in sums), sums
    ARTIFACTS.mkdir(exist_ok=True)
    tab.locator("#timeline").screenshot(path=str(ARTIFACTS / "lending-timeline.png"))  # type: ignore[attr-defined]
    bad = httpx.get(cluster.master.base_url + "/router/v1/site/offload/timeline?minutes=0")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "minutes"
