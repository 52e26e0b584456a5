"""Per-key limits across a real cluster (a master and two slaves, `runrouter` processes, one
replica of `alpha` on each): what one node admitted counts on the others within the stated
slack (README, "Limits"), `max_concurrent` holds across nodes and a hang-up frees its slot, and
the 429's shape and headers on OpenAI, Ollama and Kobold paths, headers on answers that pass."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from registry.limitsync import LIMITS_SYNC_INTERVAL_SECS
from tests.harness import CLUSTER_TOKEN, Cluster, RouterNode, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration

KEYS = "/router/v1/site/api-keys"
LIMITS = "/router/v1/node/limits"
# The stated slack: one report and one answer (two exchange intervals). The deadline below adds
# room for a loaded machine's scheduling; the test reports how long it really took.
SLACK_SECS = 2 * LIMITS_SYNC_INTERVAL_SECS
SEEN_DEADLINE_SECS = 5.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("limits")
    # Ten milliseconds a token: a stream of 3,000 runs half a minute, longer than any wait here.
    alpha = text_model("alpha", output_ms_per_token=10)
    made = start_cluster(root, [alpha], {"s1": [alpha], "s2": [alpha]})
    try:
        yield made
    finally:
        made.cleanup()


def create(cluster: Cluster, name: str, **fields: Any) -> str:
    """A stored key made through the API on the master, once every node accepts it."""
    with cluster.master.client() as c:
        response = c.post(KEYS, json={"name": name, **fields})
    assert response.status_code == 201, response.text
    secret: str = response.json()["key"]

    def everywhere() -> bool:
        return all(
            httpx.get(n.base_url + "/v1/models", headers=bearer(secret)).status_code == 200
            for n in cluster.nodes()
        )

    wait_for(everywhere, timeout=10)
    return secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": "alpha",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }


def counts(node: RouterNode, name: str) -> dict[str, list[int]]:
    with node.client() as c:
        doc = c.get(LIMITS, headers=bearer(CLUSTER_TOKEN)).json()
    found: dict[str, list[int]] = doc["keys"].get(name, {"here": [0, 0, 0], "cluster": [0, 0, 0]})
    return found


def ratelimit_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("x-ratelimit-")}


def test_what_one_node_admitted_is_refused_on_the_others_within_the_slack(
    cluster: Cluster,
) -> None:
    secret = create(cluster, "spread", rpm=4)
    s1, s2, master = cluster.slaves["s1"], cluster.slaves["s2"], cluster.master
    with s1.client() as c:
        for _ in range(4):
            assert c.post("/v1/chat/completions", json=chat(), headers=bearer(secret)).is_success
    started = time.monotonic()
    wait_for(
        lambda: all(counts(n, "spread")["cluster"][0] == 4 for n in (master, s2)),
        timeout=SEEN_DEADLINE_SECS,
        interval=0.02,
    )
    took = time.monotonic() - started
    print(f"4 admissions on s1 seen on the master and s2 after {took:.2f}s")
    # Seen everywhere: every node refuses the fifth, none counted it.
    for node in (master, s2, s1):
        with node.client() as c:
            answer = c.post("/v1/chat/completions", json=chat(), headers=bearer(secret))
        assert answer.status_code == 429
        assert answer.json()["error"]["code"] == "rate_limited"
        assert ratelimit_headers(answer) == {
            "x-ratelimit-limit-requests": "4",
            "x-ratelimit-remaining-requests": "0",
        }
    assert counts(master, "spread")["cluster"][0] == 4


def test_the_429_and_the_headers_on_openai_ollama_and_kobold_paths(cluster: Cluster) -> None:
    secret = create(cluster, "families", rpm=3, tpm=100_000)
    node = cluster.slaves["s2"]
    key = bearer(secret)
    calls = [
        ("/v1/chat/completions", chat()),
        ("/api/chat", chat(stream=False)),
        ("/api/v1/generate", {"model": "alpha", "prompt": "hi", "max_length": 2}),
    ]
    with node.client() as c:
        for remaining, (path, body) in zip((2, 1, 0), calls, strict=True):
            passed = c.post(path, json=body, headers=key)
            assert passed.status_code == 200, (path, passed.text)
            headers = ratelimit_headers(passed)
            assert headers["x-ratelimit-limit-requests"] == "3"
            assert headers["x-ratelimit-remaining-requests"] == str(remaining)
            assert headers["x-ratelimit-limit-tokens"] == "100000"
            assert int(headers["x-ratelimit-remaining-tokens"]) < 100_000
        for path, body in calls:
            refused = c.post(path, json=body, headers=key)
            assert refused.status_code == 429, path
            assert 1 <= int(refused.headers["retry-after"]) <= 61
            assert set(ratelimit_headers(refused)) == {
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
            }
            error = refused.json()["error"]
            if path == "/api/chat":
                assert error.endswith("(rate_limited)")
            else:
                assert (error["code"], error["type"]) == ("rate_limited", "rate_limit_error")
        metrics = c.get("/metrics").text
    assert 'router_key_rate_limited_total{key="families",limit="requests"} 3.0' in metrics


def test_max_concurrent_holds_across_nodes_and_a_hang_up_frees_the_slot(
    cluster: Cluster,
) -> None:
    secret = create(cluster, "parallel", max_concurrent=1)
    s1, s2, master = cluster.slaves["s1"], cluster.slaves["s2"], cluster.master
    key = bearer(secret)
    # Half a minute of tokens: held open until this test hangs up.
    with (
        s1.client() as c,
        c.stream(
            "POST", "/v1/chat/completions", json=chat(max_tokens=3000, stream=True), headers=key
        ) as held,
    ):
        assert held.status_code == 200
        # Keep the iterator: a dropped one closes the response (httpx), which is a hang-up.
        lines = held.iter_lines()
        next(lines)
        wait_for(
            lambda: all(counts(n, "parallel")["cluster"][2] == 1 for n in (master, s2)),
            timeout=SEEN_DEADLINE_SECS,
        )
        for node in (master, s2, s1):
            with node.client() as other:
                refused = other.post("/v1/chat/completions", json=chat(), headers=key)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "too_many_concurrent"
            assert refused.headers["retry-after"] == "1"
    # The client hung up: its own node frees the slot as soon as it hears of it.
    started = time.monotonic()
    wait_for(lambda: counts(s1, "parallel")["here"][2] == 0, timeout=SEEN_DEADLINE_SECS)
    print(f"s1 freed the slot {time.monotonic() - started:.2f}s after the hang-up")
    with s1.client() as c:
        assert c.post("/v1/chat/completions", json=chat(), headers=key).status_code == 200
    wait_for(lambda: counts(master, "parallel")["cluster"][2] == 0, timeout=SEEN_DEADLINE_SECS)
    with master.client() as c:
        assert c.post("/v1/chat/completions", json=chat(), headers=key).status_code == 200
