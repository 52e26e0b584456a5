"""Lending end to end on a real three-node cluster: probe leases, lending through the master,
answers under the owner's model ID, and every client answered when the helper or master dies."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import CLUSTER_TOKEN, Cluster, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("lendflow")
    c = start_cluster(
        root,
        [],
        {
            "o": [text_model("big", load_ms=50, base_ms=5, output_ms_per_token=40)],
            "h": [text_model("fast", load_ms=50, base_ms=5, output_ms_per_token=2)],
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
            assert client.post("/router/v1/load", json={"model": "fast"}).status_code == 200
        yield c
    finally:
        c.cleanup()


def burst(c: Cluster, n: int, *, max_tokens: int = 10) -> list[httpx.Response]:
    out: list[httpx.Response] = []
    lock = threading.Lock()

    def call() -> None:
        with c.slaves["o"].client(timeout=120) as client:
            body = {
                "model": "big",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens,
            }
            resp = client.post("/v1/chat/completions", json=body)
        with lock:
            out.append(resp)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def decisions(c: Cluster, **params: str) -> list[dict[str, Any]]:
    with c.master.client() as client:
        doc = client.get(
            "/router/v1/site/offload/decisions", params={"limit": "1000", **params}
        ).json()
    assert "node_errors" not in doc, doc
    return doc["records"]


def helper_stats(c: Cluster) -> dict[str, Any]:
    with c.master.client() as client:
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "h"}).json()
    backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
    return httpx.get(backend["base_url"] + "/sim/stats").json()


def test_held_requests_are_probed_to_the_helper_and_every_client_is_answered_once(
    cluster: Cluster,
) -> None:
    before = helper_stats(cluster)["completed"]
    responses = burst(cluster, 8)
    assert [r.status_code for r in responses] == [200] * 8
    assert all(r.json()["model"] == "big" for r in responses)
    served_by_helper = helper_stats(cluster)["completed"] - before
    assert served_by_helper >= 1
    rows = decisions(cluster)
    plans = [r for r in rows if r["kind"] == "plan" and r["node_id"] == "master"]
    assert any(r["outcome"] == "probe" and r["owner_model_id"] == "big" for r in plans)
    assert all(r["router_version"] for r in rows)
    lent = [r for r in rows if r["outcome"] == "lent" and r["node_id"] == "o"]
    assert len(lent) >= served_by_helper
    assert any(r["outcome"] == "lease_updated" for r in rows)


def test_the_lending_tab_data_shows_nodes_and_leases(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        summary = client.get("/router/v1/site/offload/summary").json()
    assert {n["node_id"] for n in summary["nodes"]} == {"master", "o", "h"}
    assert len({n["settings_fingerprint"] for n in summary["nodes"]}) == 1
    for lease in summary["leases"]:
        assert lease["owner_model_id"] == "big" and lease["helper_model_id"] == "fast"


def test_a_helper_request_of_its_own_is_never_blocked_by_borrowed_work(cluster: Cluster) -> None:
    with cluster.slaves["h"].client() as client:
        body = {"model": "fast", "messages": [{"role": "user", "content": "mine"}], "max_tokens": 2}
        assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_a_relay_without_a_live_lease_is_refused_and_logged(cluster: Cluster) -> None:
    headers = {
        **AUTH,
        "X-Tensors-Offload-Owner": "o",
        "X-Tensors-Offload-Owner-Model": "nope",
        "X-Tensors-Offload-Path": "/v1/chat/completions",
        "X-Tensors-Offload-Lane": "text",
    }
    with cluster.master.client() as client:
        resp = client.post(
            "/router/v1/node/offload/request", json={"model": "nope"}, headers=headers
        )
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "offload_returned"
    rows = decisions(cluster, outcome="relay_refused")
    assert any(r["reason"] == "no_live_lease" and r["owner_model_id"] == "nope" for r in rows)


def test_a_killed_helper_leaves_no_client_unanswered(cluster: Cluster) -> None:
    results: list[httpx.Response] = []
    runner = threading.Thread(target=lambda: results.extend(burst(cluster, 8, max_tokens=25)))
    runner.start()
    wait_for(
        lambda: any(r["outcome"] == "lent" for r in decisions(cluster, since_ms=_now_ms(-1000))),
        timeout=30,
    )
    cluster.slaves["h"].kill()
    runner.join(120)
    assert [r.status_code for r in results] == [200] * 8
    assert all(r.json()["model"] == "big" for r in results)


def test_with_the_master_down_owners_keep_serving_their_own_work(cluster: Cluster) -> None:
    cluster.master.kill()
    responses = burst(cluster, 4, max_tokens=3)
    assert [r.status_code for r in responses] == [200] * 4


def _now_ms(offset_ms: int = 0) -> str:
    import time

    return str(int(time.time() * 1000) + offset_ms)
