"""The expected-time bar of a load started soon after the first measured one (headless
Chromium): the node's costs are refitted only every `scheduling_refresh_interval`, and until
then the load it just measured is the expected time."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import require_chromium
from tests.harness import REPO, ModelSpec, RouterNode, sim_weights, start_node

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
# Long enough that a browser poll sees the load under way on a busy machine.
SLOW_LOAD_MS = 5000
CARD = '.card[data-node="node-a"]'


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    slow = ModelSpec(
        "slowload",
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(load_ms=SLOW_LOAD_MS)},
    )
    # No refit during the test: the costs stay as they were at start, without any load.
    n = start_node(
        tmp_path_factory.mktemp("webui-load-expected"),
        [slow],
        cluster={"scheduling_refresh_interval": "1h"},
    )
    try:
        yield n
    finally:
        n.cleanup()


def chat(node: RouterNode) -> None:
    with node.client() as client:
        body = {
            "model": "slowload",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2,
        }
        client.post("/v1/chat/completions", json=body).raise_for_status()


def test_a_second_load_soon_after_the_first_shows_the_first_ones_time_as_expected(
    node: RouterNode, new_page: Callable[..., Any]
) -> None:
    chat(node)  # the first load: measured now, unknown to the costs until the next refit
    with node.client() as client:
        client.post("/router/v1/unload", json={"model": "slowload"}).raise_for_status()
    tab = new_page()
    tab.goto(node.base_url + "/ui/nodes")
    tab.wait_for_selector(CARD)
    caller = threading.Thread(target=chat, args=(node,))
    caller.start()
    try:
        selector = f'{CARD} .load[data-loading="slowload"] .bar'
        # The page is asked to redraw every half second rather than wait for its 5 s timer.
        tab.wait_for_function(
            "sel => { refresh(); return document.querySelector(sel) !== null; }",
            arg=selector,
            polling=500,
            timeout=SLOW_LOAD_MS,
        )
        expected = float(tab.locator(selector).get_attribute("data-expected-ms") or 0)
        assert SLOW_LOAD_MS <= expected < SLOW_LOAD_MS * 3, expected
        text = tab.locator(f'{CARD} .load[data-loading="slowload"]').inner_text()
        assert "expected" in text and "no load time measured yet" not in text, text
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "nodes-loading-expected-before-refit.png"))
    finally:
        caller.join()
