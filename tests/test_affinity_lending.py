"""Lending and the owner's prompt cache, on a real three-node cluster.

Owner ``o`` serves A with cache-affine routing on and a simulated prompt cache; helper ``h``
serves B at the same speed, with no cache of o's prompts. Prompts are long and costly
(1 ms per prompt token), answers short. A burst of new conversations at o pays to lend (each
costs o the whole prompt); a burst of second turns of conversations o already served does
not: o's price leaves out the prefix its backend holds, the helper's price keeps it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import Cluster, start_cluster, text_model, wait_for
from tests.lending_cluster import burst, priced, settled_decisions, status

pytestmark = pytest.mark.integration
SYSTEM_BYTES = 6000
ANSWER_TOKENS = 20


def costs() -> dict[str, Any]:
    return {
        "load_ms": 50,
        "base_ms": 5,
        "prompt_ms_per_token": 1,
        "output_ms_per_token": 10,
        "prompt_cache_entries": 16,
    }


def text(tag: str, size: int) -> str:
    words = f"{tag} lorem ipsum dolor sit amet "
    return (words * (size // len(words) + 1))[:size]


def turn(conv: str, turns: int, model: str = "A") -> dict[str, Any]:
    messages = [{"role": "system", "content": text(f"conversation {conv}", SYSTEM_BYTES)}]
    for i in range(turns):
        if i:
            messages.append({"role": "assistant", "content": text(f"answer {conv} {i}", 200)})
        messages.append({"role": "user", "content": text(f"question {conv} {i}", 200)})
    return {"model": model, "messages": messages, "max_tokens": ANSWER_TOKENS}


def warmup(model: str, index: int) -> dict[str, Any]:
    # Unrelated prompts of different lengths and answers: the fits see the prompt's price.
    size = 400 + 1400 * (index % 5)
    content = text(f"{index:04d} warm {model}", size)
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4 + 3 * (index % 4),
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("affinitylending")
    c = start_cluster(
        root,
        [],
        {"o": [text_model("A", **costs())], "h": [text_model("B", **costs())]},
        master_sections={
            "cluster": {
                "scheduling_min_samples": "3",
                "scheduling_refresh_interval": "1s",
                # The cost rule alone decides, never a probe.
                "offload_probe_idle": "10m",
            }
        },
        per_slave_sections={"o": {"cluster": {"routing_cache_affinity": True}}},
    )
    try:
        for node, model in (("o", "A"), ("h", "B")):
            with c.slaves[node].client(timeout=60) as client:
                for i in range(10):
                    assert client.post("/v1/chat/completions", json=warmup(model, i)).is_success
        for node, model in (("o", "A"), ("h", "B")):
            wait_for(lambda n=node, m=model: priced(c, n, m), timeout=30)
        with c.master.client() as client:
            link = {
                "anchor": {"node_id": "o", "model_id": "A"},
                "lends_to": [{"node_id": "h", "model_id": "B"}],
                "acknowledge_different_weights": True,
            }
            assert client.post("/router/v1/site/text-routing-groups", json=link).status_code == 200
        wait_for(
            lambda: any(q.get("model_id") == "A" for q in status(c, "o").get("text_queue", [])),
            timeout=30,
        )
        yield c
    finally:
        c.cleanup()


def plans(c: Cluster, since_ms: int) -> list[dict[str, Any]]:
    rows = settled_decisions(c, since_ms)
    return [r for r in rows if r["kind"] == "plan" and r["owner_model_id"] == "A"]


def test_new_conversations_are_lent_and_cached_second_turns_stay_home(cluster: Cluster) -> None:
    since = int(time.time() * 1000)
    fresh = burst(cluster, [turn(f"new{i}", 1) for i in range(3)])
    assert [r.status_code for r in fresh] == [200] * 3
    rows = plans(cluster, since)
    granted = [r for r in rows if r["outcome"] == "granted"]
    # Without a cache the whole prompt costs o as much as it costs h: lending pays.
    assert granted, rows
    assert all(r["service_ms"] < r["keep_ms"] for r in granted)

    # Each conversation's first turn, one after the other: o's backend caches each prompt.
    for i in range(3):
        with cluster.slaves["o"].client(timeout=60) as client:
            assert client.post("/v1/chat/completions", json=turn(f"old{i}", 1)).is_success

    since = int(time.time() * 1000)
    cached = burst(cluster, [turn(f"old{i}", 2) for i in range(3)])
    assert [r.status_code for r in cached] == [200] * 3
    # The first burst's lease may show as kept (with its own prices) until the planner, seeing
    # the second turns held, drops it.
    rows = [r for r in plans(cluster, since) if r["outcome"] != "kept"]
    assert rows and not [r for r in rows if r["outcome"] == "granted"], rows
    assert {r["reason"] for r in rows} == {"cost_rejected"}, rows
    # o prices each second turn from its cache: well under what the helper must spend.
    assert all(r["owner_job_ms"] * 2 < r["service_ms"] for r in rows), rows
    # The answers show the prefix really was reused where they ran.
    reused = [r.json()["usage"].get("prompt_tokens_details", {}) for r in cached]
    assert all(d.get("cached_tokens", 0) > SYSTEM_BYTES // 8 for d in reused), reused
