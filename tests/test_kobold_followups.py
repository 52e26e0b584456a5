"""Kobold's generation follow-ups on real processes: `/api/extra/generate/check` sees the text
of a running generate, `/api/extra/abort` ends it (its generate answers the text so far and
the backend's slot is freed), on the node that runs it and through a master to a slave.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import CLUSTER_TOKEN, Cluster, RouterNode, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration

# Slow enough that a generation is still running while the test checks on it and aborts it.
TOKENS = 400
MS_PER_TOKEN = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("kobold-followups")
    c = start_cluster(
        root,
        [text_model("near", output_ms_per_token=MS_PER_TOKEN)],
        {"s1": [text_model("far", output_ms_per_token=MS_PER_TOKEN)]},
    )
    try:
        yield c
    finally:
        c.cleanup()


def backend_stats(node: RouterNode) -> dict[str, Any]:
    with node.client() as client:
        state = client.get(
            "/router/v1/node/state", headers={"Authorization": f"Bearer {CLUSTER_TOKEN}"}
        ).json()
    backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
    stats: dict[str, Any] = httpx.get(backend["base_url"] + "/sim/stats").json()
    return stats


class Generate(threading.Thread):
    """A Kobold generate running in the background, as a client waits on it."""

    def __init__(self, node: RouterNode, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.body = body
        self.answer: httpx.Response | None = None

    def run(self) -> None:
        with self.node.client() as client:
            self.answer = client.post("/api/v1/generate", json=self.body, timeout=120)


def check(client: httpx.Client, genkey: str) -> str:
    resp = client.post("/api/extra/generate/check", json={"genkey": genkey})
    assert resp.status_code == 200, resp.text
    text: str = resp.json()["results"][0]["text"]
    return text


@pytest.mark.parametrize(("model", "runs_on"), [("near", "master"), ("far", "s1")])
def test_check_sees_the_running_text_and_abort_ends_the_generation(
    cluster: Cluster, model: str, runs_on: str
) -> None:
    genkey = f"KCPP-{model}"
    serving = cluster.master if runs_on == "master" else cluster.slaves["s1"]
    with cluster.master.client() as client:
        # Loaded first, so the generation below starts writing at once.
        client.post("/api/v1/generate", json={"model": model, "prompt": "x", "max_length": 1})
        before = backend_stats(serving)["cancelled"]
        body = {"model": model, "prompt": "Once", "max_length": TOKENS, "genkey": genkey}
        running = Generate(cluster.master, body)
        running.start()
        first = wait_for(lambda: check(client, genkey), timeout=30)
        later = wait_for(lambda: (t := check(client, genkey)) != first and t, timeout=30)
        assert later.startswith(first)
        # Another genkey names no generation; an abort needs one.
        assert check(client, "KCPP-other") == ""
        assert client.post("/api/extra/generate/check").json() == {"results": [{"text": ""}]}
        refused = client.post("/api/extra/abort", json={})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "genkey"
        aborted = client.post("/api/extra/abort", json={"genkey": genkey})
        assert aborted.json() == {"success": "true", "done": "true"}
        running.join(timeout=60)
        assert running.answer is not None and running.answer.status_code == 200
        (result,) = running.answer.json()["results"]
        # Ended early, with what had been written: the whole run would end by length.
        assert result["finish_reason"] == "stop"
        assert result["text"].startswith(later)
        assert len(result["text"].split()) < TOKENS
        # The backend's slot was given back, not left writing to nobody.
        wait_for(lambda: backend_stats(serving)["cancelled"] == before + 1, timeout=30)
        assert check(client, genkey) == ""
        again = client.post("/api/extra/abort", json={"genkey": genkey})
        assert again.json() == {"success": "false", "done": "true"}


def test_a_generate_with_a_genkey_that_runs_out_answers_by_length(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        body = {"model": "far", "prompt": "x", "max_length": 3, "genkey": "KCPP-short"}
        resp = client.post("/api/v1/generate", json=body)
        assert resp.status_code == 200, resp.text
        (result,) = resp.json()["results"]
        assert result["finish_reason"] == "length" and len(result["text"].split()) == 3
        bad = client.post("/api/v1/generate", json={**body, "genkey": 5})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "genkey"


class Stream(threading.Thread):
    """A Kobold token stream read in the background, event by event."""

    def __init__(self, node: RouterNode, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.body = body
        self.tokens: list[dict[str, Any]] = []

    def run(self) -> None:
        with (
            self.node.client() as client,
            client.stream(
                "POST", "/api/extra/generate/stream", json=self.body, timeout=120
            ) as resp,
        ):
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    self.tokens.append(json.loads(line[len("data:") :]))


@pytest.mark.parametrize(("model", "runs_on"), [("near", "master"), ("far", "s1")])
def test_a_token_stream_is_checked_and_aborted_by_its_genkey(
    cluster: Cluster, model: str, runs_on: str
) -> None:
    genkey = f"KCPP-stream-{model}"
    serving = cluster.master if runs_on == "master" else cluster.slaves["s1"]
    with cluster.master.client() as client:
        client.post("/api/v1/generate", json={"model": model, "prompt": "x", "max_length": 1})
        before = backend_stats(serving)["cancelled"]
        body = {"model": model, "prompt": "Once", "max_length": TOKENS, "genkey": genkey}
        stream = Stream(cluster.master, body)
        stream.start()
        # The check says what the stream has sent so far (or a little more: it may be ahead).
        seen = wait_for(lambda: check(client, genkey), timeout=30)
        aborted = client.post("/api/extra/abort", json={"genkey": genkey})
        assert aborted.json() == {"success": "true", "done": "true"}
        stream.join(timeout=60)
        assert not stream.is_alive()
        text = "".join(t["token"] for t in stream.tokens)
        assert text.startswith(seen) and len(text.split()) < TOKENS
        assert stream.tokens[-1] == {"token": "", "finish_reason": "stop"}
        wait_for(lambda: backend_stats(serving)["cancelled"] == before + 1, timeout=30)
