"""The Lending tab's decision log while it refreshes (headless Chromium): lines keep their
order, new ones come in on top without moving the line the operator has open, and on a phone
every column is on screen."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import require_chromium
from tests.harness import REPO, RouterNode, start_node, text_model
from tests.test_webui_log import insert_rows

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
PHONE = {"width": 390, "height": 844}
# Enough lines that the log panel scrolls: lines come in above while the operator is lower down.
HELPERS = 30


def row(helper: str, at_ms: int, **fields: Any) -> dict[str, Any]:
    return {
        "node_id": "node-a",
        "kind": "plan",
        "lane": "text",
        "owner_node_id": "node-a",
        "owner_model_id": "chat",
        "helper_node_id": "node-b",
        "helper_model_id": helper,
        "outcome": "skipped",
        "reason": "cost_rejected",
        "trigger": "tick",
        "router_version": "0.1.0",
        "recorded_at": at_ms,
        **fields,
    }


@pytest.fixture
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    # Function-scoped: each test adds rows, and reads the order from a log of its own.
    n = start_node(tmp_path_factory.mktemp("webui-log-order"), [text_model("chat")])
    now = int(time.time() * 1000)
    try:
        insert_rows(n, [row(f"h{h:02d}", now - 60_000 - h * 1000) for h in range(HELPERS)])
        yield n
    finally:
        n.cleanup()


def shown_helpers(tab: Any) -> list[str]:
    keys: list[str] = tab.evaluate(
        "[...document.querySelectorAll('#decisions tr.group')].map(r => r.dataset.fold)"
    )
    return keys


def fold_top(tab: Any, key: str) -> float:
    top: float = tab.evaluate(
        "key => [...document.querySelectorAll('#decisions tr.group')]"
        ".find(r => r.dataset.fold === key).getBoundingClientRect().top",
        key,
    )
    return top


def refreshed_with(tab: Any, text: str) -> None:
    """Run the page's own periodic refresh now (rather than wait out its 5 s timer) until the
    log shows `text`."""
    tab.wait_for_function(
        "text => { refresh();"
        " return document.querySelector('#decisions').innerText.includes(text); }",
        arg=text,
        polling=300,
    )


def test_a_refresh_keeps_the_order_and_puts_new_lines_on_top_without_moving_the_open_one(
    node: RouterNode, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport={"width": 1400, "height": 700})
    tab.goto(node.base_url + "/ui/lending")
    tab.wait_for_function(f"document.querySelectorAll('#decisions tr.group').length === {HELPERS}")
    before = shown_helpers(tab)
    # The server's order: newest first, h00 on top.
    assert "h00" in before[0] and f"h{HELPERS - 1}" in before[-1], before
    # The operator opens a line in the middle, scrolled to the middle of the panel.
    opened = before[12]
    tab.evaluate("document.getElementById('log-panel').scrollTop = 250")
    tab.locator(f'#decisions tr.group[data-fold="{opened}"]').click()
    tab.locator("#decisions tr.detail").wait_for()
    top = fold_top(tab, opened)

    # New rows: one for an old line (h09: now the server's newest) and two new decisions.
    now = int(time.time() * 1000)
    insert_rows(
        node,
        [
            row("h09", now),
            row("new-1", now - 10, outcome="lent", reason=""),
            row("new-2", now - 20, reason="helper_claimed"),
        ],
    )
    refreshed_with(tab, "new-2")
    after = shown_helpers(tab)
    # The server put h09 first: the page keeps every known line where it was, in the old
    # order, and puts the two new lines above them.
    assert after[2:] == before, after
    assert {"new-1" in k or "new-2" in k for k in after[:2]} == {True}
    assert "\u00d72" in tab.locator('#decisions tr.group:has-text("h09")').inner_text()
    # The open line is still open, where it was on the screen.
    assert tab.locator("#decisions tr.detail").count() == 1
    assert abs(fold_top(tab, opened) - top) <= 1, (fold_top(tab, opened), top)
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "decision-log-stable-order.png"))

    # A filter change is a new list: the server's order again.
    tab.select_option("#f-outcome", "skipped")
    tab.wait_for_function(
        "!document.querySelector('#decisions').innerText.includes('new-1')"
        " && document.querySelector('#decisions tr.group').innerText.includes('h09')"
    )


def test_the_line_under_the_pointer_stays_under_it_when_lines_come_in_above(
    node: RouterNode, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport={"width": 1400, "height": 700})
    tab.goto(node.base_url + "/ui/lending")
    tab.wait_for_function(f"document.querySelectorAll('#decisions tr.group').length === {HELPERS}")
    tab.evaluate("document.getElementById('log-panel').scrollTop = 200")
    pointed = shown_helpers(tab)[10]
    line = tab.locator(f'#decisions tr.group[data-fold="{pointed}"]')
    line.hover()
    box = line.bounding_box()
    assert box is not None
    insert_rows(node, [row("new-3", int(time.time() * 1000))])
    refreshed_with(tab, "new-3")
    # The pointer (it did not move) is still over the same line.
    under: str = tab.evaluate(
        "([x, y]) => document.elementFromPoint(x, y).closest('tr').dataset.fold",
        [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2],
    )
    assert under == pointed


def test_on_a_phone_each_line_shows_its_outcome_and_reason_without_a_sideways_scroll(
    node: RouterNode, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport=PHONE)
    tab.goto(node.base_url + "/ui/lending")
    tab.wait_for_selector("#decisions tr.group")
    panel = tab.evaluate(
        "(() => { const p = document.getElementById('log-panel');"
        " return [p.scrollWidth, p.clientWidth]; })()"
    )
    assert panel[0] <= panel[1], panel
    first = tab.locator("#decisions tr.group").first
    for cell in ("td.outcome", "td.reason"):
        box = first.locator(cell).bounding_box()
        assert box is not None and box["width"] > 0
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (cell, box)
    assert "skipped" in first.locator("td.outcome").inner_text()
    assert "cost_rejected" in first.locator("td.reason").inner_text()
    widths = tab.evaluate("[document.documentElement.scrollWidth, innerWidth]")
    assert widths[0] <= PHONE["width"], widths
    first.click()
    detail = tab.locator("#decisions tr.detail")
    detail.wait_for()
    box = detail.bounding_box()
    assert box is not None and box["x"] + box["width"] <= PHONE["width"], box
    ARTIFACTS.mkdir(exist_ok=True)
    tab.locator("#log-panel").screenshot(path=str(ARTIFACTS / "decision-log-390px.png"))
