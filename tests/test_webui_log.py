"""The Lending tab's decision log (headless Chromium): folded and paged by the server, filtered
server-side, in its own scrolling panel, details with labels and units, reasons explained."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lending.decisions import DECISION_FIELDS, NULLABLE_FIELDS, REASON_TEXT, TEXT_FIELDS
from tests.browser import require_chromium
from tests.harness import REPO, RouterNode, start_node, text_model

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
HELPERS = 60  # distinct decisions besides the repeated one: 61 lines, two pages of 50


def insert_rows(node: RouterNode, rows: list[dict[str, Any]]) -> None:
    """Rows as the decision log writes them, into the node's own database."""

    def default(field: str) -> Any:
        return None if field in NULLABLE_FIELDS else "" if field in TEXT_FIELDS else 0

    values = [tuple(r.get(f, default(f)) for f in DECISION_FIELDS) for r in rows]
    columns = ", ".join(DECISION_FIELDS)
    if node.db is not None:
        import psycopg

        marks = ", ".join(["%s"] * len(DECISION_FIELDS))
        with psycopg.connect(node.db.url, autocommit=True) as conn, conn.cursor() as cur:
            cur.executemany(f"INSERT INTO offload_decisions ({columns}) VALUES ({marks})", values)
        return
    marks = ", ".join(["?"] * len(DECISION_FIELDS))
    with sqlite3.connect(node.store / "router.sqlite3", timeout=30) as lite:
        lite.executemany(f"INSERT INTO offload_decisions ({columns}) VALUES ({marks})", values)


@pytest.fixture(scope="module")
def written_at() -> int:
    """The time (ms) the rows are dated from. A time range a test picks rows by is built from
    it, not from the clock: the test may run long after the rows were written (after the other
    test, on a loaded machine), and a range from the clock then misses the rows it means."""
    return int(time.time() * 1000)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, written_at: int) -> Iterator[RouterNode]:
    n = start_node(tmp_path_factory.mktemp("webui-log"), [text_model("chat"), text_model("other")])
    now = written_at
    base = {
        "node_id": "node-a",
        "kind": "plan",
        "lane": "text",
        "owner_node_id": "node-a",
        "owner_model_id": "chat",
        "helper_node_id": "node-b",
        "outcome": "skipped",
        "router_version": "0.1.0",
    }
    rows = [
        # One decision taken 10 times with different numbers and triggers: one line, counted 10.
        {
            **base,
            "recorded_at": now - 60_000 + i * 1000,
            "trigger": "enqueued" if i % 2 else "completed",
            "helper_model_id": "twin",
            "reason": "cost_rejected",
            "keep_ms": 800.0 + i * 50,
            "pending_count": 2 + i,
        }
        for i in range(10)
    ]
    # Sixty distinct decisions, older than that one, two rows each.
    for h in range(HELPERS):
        for k in range(2):
            rows.append(
                {
                    **base,
                    "recorded_at": now - 120_000 - h * 1000 - k,
                    "trigger": "tick",
                    "helper_model_id": f"h{h:02d}",
                    "reason": "helper_claimed",
                }
            )
    # A lent row of another model, three hours ago: outside "last hour".
    rows.append(
        {
            **base,
            "kind": "dispatch",
            "recorded_at": now - 3 * 3600_000,
            "owner_model_id": "other",
            "helper_model_id": "twin",
            "outcome": "lent",
            "reason": "",
            "lent_out": 1,
            "request_id": "req-lent-1",
        }
    )
    try:
        insert_rows(n, rows)
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def tab(node: RouterNode, new_page: Callable[..., Any]) -> Any:
    page = new_page(viewport={"width": 1400, "height": 900})
    page.goto(node.base_url + "/ui/lending")
    page.wait_for_selector("#decisions tr.group")
    return page


def status(tab: Any) -> str:
    text: str = tab.locator("#log-status").inner_text()
    return text


def test_the_log_folds_repeated_decisions_and_pages_the_rest(tab: Any) -> None:
    tab.wait_for_function("document.querySelector('#log-status').innerText.includes('of 61')")
    assert "Lines 1\u201350 of 61 (130 decisions in all)" in status(tab)
    assert "11 older line(s)" in status(tab)
    groups = tab.locator("#decisions tr.group")
    assert groups.count() == 50
    first = groups.first
    assert "\u00d710" in first.inner_text() and "node-b/twin" in first.inner_text()
    # The log has its own scrolling panel: fifty lines do not stretch the page.
    panel = tab.evaluate(
        "(() => { const p = document.getElementById('log-panel');"
        " return [p.clientHeight, p.scrollHeight, innerHeight]; })()"
    )
    assert panel[0] <= 0.6 * panel[2] + 1 and panel[1] > panel[0], panel
    # Details: labelled values with units, the triggers counted, the reason in words.
    first.click()
    detail = tab.locator("#decisions tr.detail dl.kv")
    detail.wait_for()
    text = detail.inner_text()
    assert "Owner's drain time" in text and "800 ms \u2013 1.25 s" in text, text
    assert "Held requests" in text and "2 \u2013 11" in text
    assert "completed \u00d75" in text and "enqueued \u00d75" in text
    assert REASON_TEXT["cost_rejected"] in text
    reason = first.locator("abbr.code")
    assert reason.get_attribute("title") == REASON_TEXT["cost_rejected"]
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "decision-log-page-1.png"), full_page=True)
    # The next page holds the oldest eleven lines.
    tab.click("#log-older")
    tab.wait_for_function("document.querySelector('#log-status').innerText.startsWith('Lines 51')")
    assert "Lines 51\u201361 of 61" in status(tab)
    assert tab.locator("#decisions tr.group").count() == 11
    assert tab.locator("#log-older").is_disabled()
    assert tab.locator("#log-page").inner_text() == "page 2 of 2"
    tab.click("#log-newer")
    tab.wait_for_function(
        "document.querySelector('#log-status').innerText.startsWith('Lines 1\u2013')"
    )


def test_filters_are_applied_by_the_server(tab: Any, written_at: int) -> None:
    # Outcome: every outcome the log can hold is offered; "lent" is three hours old.
    options = tab.locator("#f-outcome option").all_inner_texts()
    assert {"lent", "relay_refused", "borrowed_returned", "lease_refused"} <= set(options)
    tab.select_option("#f-outcome", "lent")
    tab.wait_for_function("document.querySelector('#log-status').innerText.includes('of 0')")
    tab.select_option("#f-window", "")
    tab.wait_for_function("document.querySelector('#log-status').innerText.includes('of 1 ')")
    assert "other" in tab.locator("#decisions tr.group").first.inner_text()
    # Model (owner or helper) and kind.
    tab.select_option("#f-outcome", "")
    tab.select_option("#f-model", "chat")
    tab.wait_for_function("document.querySelector('#log-status').innerText.includes('of 61')")
    tab.select_option("#f-kind", "dispatch")
    tab.wait_for_function("document.querySelector('#log-status').innerText.includes('of 0')")
    tab.select_option("#f-kind", "")
    tab.select_option("#f-model", "")
    # Node: every row here is node-a's (all time now: the lent row too).
    tab.wait_for_function("document.querySelector('#f-node option[value=\"node-a\"]')")
    # The page showed 62 lines before this filter too: the server's answer to it is the proof.
    with tab.expect_response(lambda r: "node_id=node-a" in r.url) as answer:
        tab.select_option("#f-node", "node-a")
    assert answer.value.json()["total_folds"] == 62
    tab.wait_for_function("document.querySelector('#log-status').innerText.includes('of 62')")
    # One request's rows, by its ID; its ID is in the line's details.
    tab.fill("#f-request", "req-lent-1")
    tab.locator("#f-request").dispatch_event("change")
    tab.wait_for_function("document.querySelector('#log-status').innerText.includes('of 1 ')")
    tab.locator("#decisions tr.group").first.click()
    assert "req-lent-1" in tab.locator("#decisions tr.detail").inner_text()
    tab.fill("#f-request", "")
    tab.locator("#f-request").dispatch_event("change")
    tab.wait_for_function("document.querySelector('#log-status').innerText.includes('of 62')")
    # A custom range around the repeated decision only, from the rows' own dates.
    tab.select_option("#f-window", "custom")
    tab.fill("#f-from", _local(tab, written_at - 90_000))
    tab.fill("#f-to", _local(tab, written_at + 60_000))
    tab.locator("#f-to").dispatch_event("change")
    tab.wait_for_function(
        "document.querySelector('#log-status').innerText.includes('of 1 ')"
        " && document.querySelector('#decisions tr.group').innerText.includes('twin')"
        " && document.querySelector('#decisions tr.group').innerText.includes('skipped')"
    )
    assert "\u00d710" in tab.locator("#decisions tr.group").first.inner_text()


def _local(tab: Any, ms: int) -> str:
    # A datetime-local value in the browser's own time zone.
    value: str = tab.evaluate(
        "ms => { const d = new Date(ms); d.setMinutes(d.getMinutes() - d.getTimezoneOffset());"
        " return d.toISOString().slice(0, 19); }",
        ms,
    )
    return value


def test_a_refresh_that_brings_the_same_lines_leaves_them_as_they_were(tab: Any) -> None:
    # Redrawn on every refresh, a click pressed on a line and released on its replacement would
    # open nothing: the page's own refresh must keep the very same rows.
    tab.evaluate("document.querySelector('#decisions tr.group').dataset.kept = 'yes'")
    # The next periodic refresh: its log answer, then its end (the status line's new time).
    with tab.expect_response(lambda r: "/offload/decisions/folded" in r.url, timeout=15000):
        pass
    before = tab.locator("#status").inner_text()
    tab.wait_for_function(
        "(before) => document.querySelector('#status').innerText !== before",
        arg=before,
        timeout=15000,
    )
    kept = tab.evaluate("document.querySelector('#decisions tr.group').dataset.kept")
    assert kept == "yes"
