"""The Usage page in headless Chromium (Debian's build, driven by Playwright), on a desktop and a
390 px phone. Keyed requests reach the node the way a master forwards them (the node protocol
with `X-Router-Key-Name`), so the page has several keys to show before stored keys exist."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import require_chromium
from tests.harness import CLUSTER_TOKEN, REPO, Cluster, start_cluster, text_model

pytestmark = pytest.mark.integration
require_chromium()
ARTIFACTS = REPO / "test-artifacts"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
SENT = {"alice-with-a-rather-long-key-name": 3, "bob": 1, None: 2}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("webui-usage"), [text_model("chat")], {})
    try:
        with c.master.client(timeout=60) as client:
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            for key, count in SENT.items():
                for _ in range(count):
                    if key is None:
                        resp = client.post("/v1/chat/completions", json=body)
                    else:
                        headers = {
                            "Authorization": f"Bearer {CLUSTER_TOKEN}",
                            "X-Router-Key-Name": key,
                        }
                        url = "/router/v1/node/inference/v1/chat/completions"
                        resp = client.post(url, json=body, headers=headers)
                    assert resp.status_code == 200, resp.text
        yield c
    finally:
        c.cleanup()


def tokens_by_key(c: Cluster) -> dict[str, int]:
    with c.master.client() as client:
        rows = client.get("/router/v1/site/usage", params={"group_by": "key"}).json()["rows"]
    return {
        r["key_name"] or "(no stored key)": r["prompt_tokens"] + r["completion_tokens"]
        for r in rows
    }


def cell(tab: Any, key: str, field: str) -> str:
    text: str = tab.inner_text(f'#usage tr[data-key="{key}"] td[data-field="{field}"]')
    return text


def test_the_table_totals_each_key_and_the_chart_its_tokens_per_day(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport=DESKTOP)
    tab.goto(cluster.master.base_url + "/ui/usage")
    tab.wait_for_selector('#usage tr[data-key="bob"]')
    assert cell(tab, "alice-with-a-rather-long-key-name", "requests") == "3"
    assert cell(tab, "bob", "requests") == "1"
    assert cell(tab, "(no stored key)", "requests") == "2"
    assert cell(tab, "total", "requests") == "6"
    assert cell(tab, "total", "errors") == "0"
    # Biggest first.
    keys = tab.eval_on_selector_all("#usage tbody tr", "rows => rows.map(r => r.dataset.key)")
    assert keys == ["alice-with-a-rather-long-key-name", "(no stored key)", "bob"]
    charted = tab.evaluate(
        "Object.fromEntries(Chart.getChart(document.getElementById('chart')).data.datasets"
        ".map(d => [d.label, d.data.reduce((a, b) => a + b, 0)]))"
    )
    assert charted == tokens_by_key(cluster)
    assert all(value > 0 for value in charted.values())
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "ui-usage-desktop.png"), full_page=True)


def test_a_range_without_requests_says_so(cluster: Cluster, new_page: Callable[..., Any]) -> None:
    tab = new_page(viewport=DESKTOP)
    tab.goto(cluster.master.base_url + "/ui/usage")
    tab.wait_for_selector('#usage tr[data-key="bob"]')
    tab.fill("#from", "2020-01-01")
    tab.fill("#to", "2020-01-03")
    tab.click("#range button[type=submit]")
    tab.wait_for_selector("#none:not([hidden])")
    assert tab.locator("#usage tbody tr").count() == 0
    labels = tab.evaluate("Chart.getChart(document.getElementById('chart')).data.labels")
    assert labels == ["2020-01-01", "2020-01-02", "2020-01-03"]


def test_the_page_fits_a_390_px_phone_without_horizontal_scroll(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    tab = new_page(viewport=PHONE)
    tab.goto(cluster.master.base_url + "/ui/usage")
    tab.wait_for_selector('#usage tr[data-key="bob"]')
    widths = tab.evaluate(
        "[document.documentElement.scrollWidth, document.body.scrollWidth, innerWidth]"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / "ui-usage-390px.png"), full_page=True)
    offenders = tab.evaluate(
        "[...document.querySelectorAll('body *')]"
        ".filter(e => e.getBoundingClientRect().right > innerWidth)"
        ".map(e => `${e.tagName}#${e.id}.${e.className}`).slice(0, 15)"
    )
    assert widths[0] <= PHONE["width"] and widths[1] <= PHONE["width"], (widths, offenders)
    assert offenders == []
    # The table stacks: each number of a key is still there, each beside its label.
    assert tab.is_hidden("#usage thead")
    labelled = tab.eval_on_selector_all(
        '#usage tr[data-key="bob"] td',
        "cells => cells.map(c => [getComputedStyle(c, '::before').content, c.textContent])",
    )
    assert [label for label, _ in labelled] == [
        '"Key"',
        '"Requests"',
        '"Errors"',
        '"Prompt tokens"',
        '"Completion tokens"',
        '"Backend time"',
        '"Lent"',
    ]
    assert labelled[1][1] == "1"
