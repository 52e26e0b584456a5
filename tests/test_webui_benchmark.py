"""The Nodes page's Benchmark button: it calibrates a model on the node that holds it, shows it
running, then its result (headless Chromium on a real master and slave)."""

from __future__ import annotations

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
# Long enough that a browser poll sees the calibration under way on a busy machine.
LOAD_MS = 4000
ROW = 'section[data-node="s"] ul.benchmarks li[data-model="calm"]'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Both terms cost clearly more than the timing noise of a busy machine, so the fit has a
    # slope for each and the page shows one.
    costs = {"base_ms": 20, "prompt_ms_per_token": 0.05, "output_ms_per_token": 0.5}
    weights = {"model_param": sim_weights(load_ms=LOAD_MS, **costs)}
    calm = ModelSpec("calm", {"contextsize": 4096, "parallel": 1}, weights)
    c = start_cluster(tmp_path_factory.mktemp("webui-bench"), [], {"s": [calm, text_model("x")]})
    try:
        yield c
    finally:
        c.cleanup()


def published_fit(cluster: Cluster) -> dict[str, Any] | None:
    headers = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
    doc = httpx.get(
        cluster.slaves["s"].base_url + "/router/v1/node/runtime-status", headers=headers
    ).json()
    for row in (doc.get("costs") or {}).get("models", []):
        if row["model_id"] == "calm":
            return dict(row)
    return None


def test_the_benchmark_button_calibrates_the_model_and_shows_its_fit(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    assert published_fit(cluster) is None
    tab = new_page()
    tab.goto(cluster.master.base_url + "/ui/nodes")
    tab.wait_for_selector(ROW + '[data-state="none"] button.benchmark:not([disabled])')
    tab.locator(ROW + " button.benchmark").click()
    # Shown under way (the first request waits for the load), the button held meanwhile.
    tab.wait_for_function(
        "sel => { refresh(); return document.querySelector(sel) !== null; }",
        arg=ROW + '[data-state="running"] button.benchmark[disabled]',
        polling=300,
        timeout=LOAD_MS * 3,
    )
    tab.screenshot(path=str(ARTIFACTS / "nodes-benchmark-running.png"), full_page=True)
    tab.wait_for_function(
        "sel => { refresh(); return document.querySelector(sel) !== null; }",
        arg=f'{ROW}[data-state="done"], {ROW}[data-state="failed"]',
        polling=500,
        timeout=60_000,
    )
    text = tab.locator(ROW + " .bench-state").inner_text()
    assert tab.locator(ROW).get_attribute("data-state") == "done", text
    fit = wait_for(lambda: published_fit(cluster), timeout=20.0)
    assert f"{fit['samples']} samples" in text
    assert "text: 20/20 ok" in text
    assert "load " in text
    tab.screenshot(path=str(ARTIFACTS / "nodes-benchmark-done.png"), full_page=True)
    assert list((cluster.slaves["s"].store / "benchmarks").glob("calm-*.json"))
