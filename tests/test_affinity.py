"""Cache-affine routing on a real cluster: a master, two slaves holding replicas of one model.

Each slave's simulated backend keeps a prompt cache, and reports how much of each prompt it
reused (`usage.prompt_tokens_details.cached_tokens`), so where a turn ran shows in its answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.sim.server import prompt_text
from tests.harness import Cluster, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration

MODEL = "twin"


def replica_spec() -> Any:
    # Same weights and settings on both slaves: one public ID, two replicas.
    return text_model(MODEL, base_ms=5, output_ms_per_token=1, prompt_cache_entries=8)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("affinity")
    c = start_cluster(
        root,
        [],
        {"s1": [replica_spec()], "s2": [replica_spec()]},
        master_sections={"cluster": {"routing_cache_affinity": True}},
    )
    try:
        yield c
    finally:
        c.cleanup()


def turn_messages(turns: int, tag: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": f"Conversation {tag}. " * 20}]
    for i in range(turns):
        if i:
            messages.append({"role": "assistant", "content": f"answer {i} " * 20})
        messages.append({"role": "user", "content": f"question {tag} {i} " * 20})
    return messages


def ask(client: httpx.Client, messages: list[dict[str, str]]) -> dict[str, Any]:
    resp = client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2}
    )
    assert resp.status_code == 200, resp.text
    usage: dict[str, Any] = resp.json()["usage"]
    return usage


def affinity_state(c: Cluster) -> dict[str, Any]:
    with c.master.client() as client:
        state: dict[str, Any] = client.get("/router/v1/site/nodes/state").json()
    return state["affinity"]


def test_turn_n_plus_1_lands_where_turn_n_ran(cluster: Cluster) -> None:
    before = affinity_state(cluster)["models"].get(MODEL, {"hits": 0, "misses": 0})
    with cluster.master.client() as client:
        for turns in range(1, 6):
            for tag in ("a", "b"):
                usage = ask(client, turn_messages(turns, tag))
                if turns == 1:
                    continue
                # The whole previous turn was in the serving replica's cache: it ran there.
                previous = prompt_text({"messages": turn_messages(turns - 1, tag)})
                assert usage["prompt_tokens_details"]["cached_tokens"] == len(previous) // 4
    state = affinity_state(cluster)
    assert state["enabled"] is True
    counts = state["models"][MODEL]
    assert counts["hits"] - before["hits"] == 8
    assert counts["misses"] - before["misses"] == 2


def test_the_serving_node_records_the_tokens_its_prompt_cache_reused(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        ask(client, turn_messages(1, "rec"))
        resp = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": turn_messages(2, "rec"), "max_tokens": 2},
            headers={"X-Request-Id": "affinity-recorded"},
        )
    assert resp.status_code == 200, resp.text
    cached = resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0

    def recorded() -> list[tuple[Any, ...]]:
        sql = "SELECT prompt_tokens, cached_tokens FROM analytics_requests WHERE request_id = %s"
        return [
            row for s in cluster.slaves.values() for row in s.query(sql, ("affinity-recorded",))
        ]

    rows = wait_for(recorded, timeout=20, interval=0.2)
    assert rows == [(resp.json()["usage"]["prompt_tokens"], cached)]


def test_ollama_chats_are_steered_too(cluster: Cluster) -> None:
    def hits() -> int:
        return int(affinity_state(cluster)["models"].get(MODEL, {}).get("hits", 0))

    before = hits()
    with cluster.master.client() as client:
        for turns in range(1, 4):
            resp = client.post(
                "/api/chat",
                json={"model": MODEL, "messages": turn_messages(turns, "ollama"), "stream": False},
            )
            assert resp.status_code == 200, resp.text
    # Turns 2 and 3 found turn 1's and turn 2's replica.
    assert hits() - before == 2


def test_the_nodes_page_shows_the_choices_per_model(cluster: Cluster) -> None:
    pytest.importorskip("playwright.sync_api")
    from tests.browser import CHROMIUM, chromium

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with cluster.master.client() as client:
        for turns in (1, 2):
            ask(client, turn_messages(turns, "page"))
    counts = affinity_state(cluster)["models"][MODEL]
    with chromium() as browser:
        tab = browser.new_page()
        tab.goto(cluster.master.base_url + "/ui/nodes")
        row = f'section[data-node="master"] ul.affinity li[data-model="{MODEL}"]'
        tab.wait_for_selector(row, timeout=30_000)
        text = tab.locator(row).inner_text()
    assert f"{counts['hits']} hits" in text and f"{counts['misses']} misses" in text


def test_a_node_that_goes_down_loses_its_conversations(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    c = start_cluster(
        tmp_path_factory.mktemp("affinity-down"),
        [],
        {"s1": [replica_spec()], "s2": [replica_spec()]},
        master_sections={"cluster": {"routing_cache_affinity": True}},
    )
    try:
        with c.master.client() as client:
            # Two new conversations rotate: one lands on each slave.
            for tag in ("x", "y"):
                ask(client, turn_messages(1, tag))
        assert affinity_state(c)["entries"] == 2
        c.slaves["s1"].kill()
        wait_for(lambda: affinity_state(c)["entries"] == 1, timeout=30, interval=0.2)
        reused = []
        with c.master.client() as client:
            for tag in ("x", "y"):
                usage = ask(client, turn_messages(2, tag))
                reused.append(usage["prompt_tokens_details"]["cached_tokens"])
        # The conversation that lived on s2 still finds its cache; the other starts over there.
        full = [len(prompt_text({"messages": turn_messages(1, t)})) // 4 for t in ("x", "y")]
        assert sorted(r == f for r, f in zip(reused, full, strict=True)) == [False, True]
        counts = affinity_state(c)["models"][MODEL]
        assert counts == {"hits": 1, "misses": 3, "overrides": 0}
    finally:
        c.cleanup()
