"""Lending end to end on a real three-node cluster: probe leases, lending through the master,
answers under the owner's model ID, and every client answered when the helper or master dies."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import CLUSTER_TOKEN, Cluster, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


def start_lending_cluster(root: Path) -> Cluster:
    """Owner o (big, slow) links to helper h (fast, loaded); the master probes after 100 ms."""
    c = start_cluster(
        root,
        [],
        {
            "o": [text_model("big", load_ms=50, base_ms=5, output_ms_per_token=40)],
            "h": [text_model("fast", load_ms=50, base_ms=5, output_ms_per_token=2)],
        },
        master_sections={
            # Two lent at once, so that a helper can hold borrowed work not yet started.
            "cluster": {"offload_probe_idle": "100ms", "offload_probe_helper_slots": 2}
        },
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
    except BaseException:
        c.cleanup()
        raise
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Shared by the tests that leave every node running."""
    c = start_lending_cluster(tmp_path_factory.mktemp("lendflow"))
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of its own, for a test that kills one of its nodes."""
    c = start_lending_cluster(tmp_path)
    try:
        yield c
    finally:
        c.cleanup()


def burst(
    c: Cluster, n: int, *, max_tokens: int = 10, headers: dict[str, str] | None = None
) -> list[httpx.Response]:
    """`n` requests at once to the owner, each with an X-Request-Id of its own."""
    out: list[httpx.Response] = []
    lock = threading.Lock()

    def call() -> None:
        with c.slaves["o"].client(timeout=120) as client:
            body = {
                "model": "big",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens,
            }
            trace = {"X-Request-Id": f"burst-{uuid.uuid4().hex}", **(headers or {})}
            resp = client.post("/v1/chat/completions", json=body, headers=trace)
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


def helper_backend(c: Cluster) -> dict[str, Any]:
    with c.master.client() as client:
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "h"}).json()
    backend: dict[str, Any] = next(b for b in state["backends"] if b["id"] == "text-runtime")
    return backend


def helper_stats(c: Cluster) -> dict[str, Any]:
    return httpx.get(helper_backend(c)["base_url"] + "/sim/stats").json()


def borrowed_on_helper(c: Cluster) -> int:
    """Borrowed requests the helper runs or holds in its router queue (the stall check's query)."""
    with c.slaves["h"].client() as client:
        doc = client.get("/router/v1/node/offload/borrowed", headers=AUTH).json()
    return int(doc["borrowed"])


def helper_chat(c: Cluster, request_id: str = "") -> httpx.Response:
    with c.slaves["h"].client(timeout=120) as client:
        body = {"model": "fast", "messages": [{"role": "user", "content": "mine"}], "max_tokens": 2}
        trace = {"X-Request-Id": request_id} if request_id else {}
        return client.post("/v1/chat/completions", json=body, headers=trace)


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


def test_a_lent_request_keeps_its_id_on_the_owner_the_master_and_the_helper(
    cluster: Cluster,
) -> None:
    since = _now_ms()
    responses = burst(cluster, 8)
    assert [r.status_code for r in responses] == [200] * 8
    ids = {r.headers["x-request-id"] for r in responses}
    assert len(ids) == 8 and all(i.startswith("burst-") for i in ids)

    def lent_ids() -> set[str]:
        rows = decisions(cluster, since_ms=since, node_id="o", outcome="lent")
        return {r.get("request_id", "") for r in rows}

    lent = wait_for(lent_ids, timeout=15, interval=0.2)
    # Each lent row names the request it lent, one the owner's client sent.
    assert lent <= ids
    # A lease row is about no request: it has no ID.
    leases = decisions(cluster, since_ms=since, outcome="lease_updated")
    assert all("request_id" not in r for r in leases)
    helper = cluster.slaves["h"]

    def borrowed_ids() -> set[str]:
        rows = helper.query(
            "SELECT request_id FROM analytics_requests WHERE borrowed = %s", (True,)
        )
        return {r[0] for r in rows} & lent

    def came_back() -> set[str]:
        rows = decisions(cluster, since_ms=since, node_id="o", outcome="returned")
        return {r["request_id"] for r in rows}

    # The helper answered those requests under the same IDs the owner's clients got (all
    # but any it handed back, which the owner then ran).
    wait_for(lambda: borrowed_ids() == lent - came_back(), timeout=15, interval=0.2)
    owner = cluster.slaves["o"]

    def owner_ids() -> set[str]:
        return {r[0] for r in owner.query("SELECT request_id FROM analytics_requests")}

    # The owner records the requests it ran itself under their IDs, and no lent one that the
    # helper answered (that is the helper's row).
    wait_for(lambda: ids - borrowed_ids() <= owner_ids(), timeout=15, interval=0.2)
    assert not borrowed_ids() & owner_ids()


def test_a_lent_request_waits_on_the_helper_under_its_owners_key(own_cluster: Cluster) -> None:
    """A cluster of its own: once it has a stored key, every client path needs a key."""
    cluster = own_cluster
    with cluster.master.client() as client:
        made = client.post(
            "/router/v1/site/api-keys", json={"name": "lending-team", "role": "inference"}
        )
    if made.status_code in (404, 405):
        pytest.skip("needs stored keys (issue 25: POST /router/v1/site/api-keys)")
    assert made.status_code == 201, made.text
    bearer = {"Authorization": f"Bearer {made.json()['key']}"}
    with cluster.slaves["o"].client() as owner:
        wait_for(lambda: owner.get("/v1/models", headers=bearer).status_code == 200, timeout=10)
    since = _now_ms()
    responses = burst(cluster, 8, headers=bearer)
    assert [r.status_code for r in responses] == [200] * 8
    ids = {r.headers["x-request-id"] for r in responses}

    def lent_rows() -> list[dict[str, Any]]:
        rows = decisions(cluster, since_ms=since, node_id="o", outcome="lent")
        return [r for r in rows if r.get("request_id") in ids]

    rows = wait_for(lent_rows, timeout=15, interval=0.2)
    assert {r.get("key_name") for r in rows} == {"lending-team"}
    helper = cluster.slaves["h"]
    lent_ids = {r["request_id"] for r in rows}

    def helper_keys() -> set[str]:
        found = helper.query(
            "SELECT request_id, key_name FROM analytics_requests WHERE borrowed = %s", (True,)
        )
        return {key for rid, key in found if rid in lent_ids}

    # The owner's key reached the helper with the lent requests (its queue waits them under
    # it; its usage rows name it).
    assert wait_for(helper_keys, timeout=15, interval=0.2) == {"lending-team"}


def test_the_lending_tab_data_shows_nodes_and_leases(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        summary = client.get("/router/v1/site/offload/summary").json()
    assert {n["node_id"] for n in summary["nodes"]} == {"master", "o", "h"}
    assert len({n["settings_fingerprint"] for n in summary["nodes"]}) == 1
    for lease in summary["leases"]:
        assert lease["owner_model_id"] == "big" and lease["helper_model_id"] == "fast"


def test_a_helper_request_of_its_own_is_never_blocked_by_borrowed_work(cluster: Cluster) -> None:
    since = _now_ms()
    backend_pid = int(helper_backend(cluster)["pid"])
    burst_results: list[httpx.Response] = []
    own: list[httpx.Response] = []
    runner = threading.Thread(target=lambda: burst_results.extend(burst(cluster, 6)))
    own_id = f"own-{uuid.uuid4().hex}"
    mine = threading.Thread(target=lambda: own.append(helper_chat(cluster, own_id)))
    # A stopped backend keeps the borrowed request inside it running for as long as the test
    # needs: the helper then holds borrowed work that is running and borrowed work that waits.
    os.kill(backend_pid, signal.SIGSTOP)
    try:
        runner.start()
        wait_for(lambda: borrowed_on_helper(cluster) >= 2, timeout=30)
        mine.start()
        # The own request hands back the borrowed request that had not started; it waits
        # only for the one inside the backend.
        wait_for(lambda: borrowed_on_helper(cluster) == 1, timeout=15)
        assert not own, "answered while the backend was stopped"
    finally:
        os.kill(backend_pid, signal.SIGCONT)
    mine.join(60)
    runner.join(120)

    assert [r.status_code for r in own] == [200] and own[0].json()["model"] == "fast"
    assert [r.status_code for r in burst_results] == [200] * 6
    assert all(r.json()["model"] == "big" for r in burst_results)
    kinds = {"native_waited_behind_borrowed", "borrowed_returned"}

    def helper_rows() -> list[dict[str, Any]]:
        # Rows reach the log in batches: wait until both kinds are readable.
        rows = [r for r in decisions(cluster, since_ms=since, node_id="h") if r["outcome"] in kinds]
        return rows if {r["outcome"] for r in rows} == kinds else []

    rows = wait_for(helper_rows, timeout=15, interval=0.2)
    waited = [r for r in rows if r["outcome"] == "native_waited_behind_borrowed"]
    assert [r["borrowed_ahead"] for r in waited] == [1]
    # The helper's own request is named on its row; each handed-back one by its owner's ID.
    assert [r["request_id"] for r in waited] == [own_id]
    burst_ids = {r.headers["x-request-id"] for r in burst_results}
    returned = [r for r in rows if r["outcome"] == "borrowed_returned"]
    assert {r["request_id"] for r in returned} <= burst_ids
    assert {r["reason"] for r in returned} <= {
        "own_work_arrived",
        "helper_busy_on_arrival",
    }
    assert "own_work_arrived" in {r["reason"] for r in returned}


def test_a_relay_without_a_live_lease_is_refused_and_logged(cluster: Cluster) -> None:
    headers = {
        **AUTH,
        "X-Tensors-Offload-Owner": "o",
        "X-Tensors-Offload-Owner-Model": "nope",
        "X-Tensors-Offload-Path": "/v1/chat/completions",
        "X-Tensors-Offload-Lane": "text",
        "X-Request-Id": "relay-no-lease",
    }
    with cluster.master.client() as client:
        resp = client.post(
            "/router/v1/node/offload/request", json={"model": "nope"}, headers=headers
        )
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "offload_returned"
    rows = decisions(cluster, outcome="relay_refused")
    assert any(
        r["reason"] == "no_live_lease"
        and r["owner_model_id"] == "nope"
        and r["request_id"] == "relay-no-lease"
        for r in rows
    )


def test_a_killed_helper_leaves_no_client_unanswered(own_cluster: Cluster) -> None:
    cluster = own_cluster
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


def test_with_the_master_down_owners_keep_serving_their_own_work(own_cluster: Cluster) -> None:
    own_cluster.master.kill()
    responses = burst(own_cluster, 4, max_tokens=3)
    assert [r.status_code for r in responses] == [200] * 4


def _now_ms(offset_ms: int = 0) -> str:
    import time

    return str(int(time.time() * 1000) + offset_ms)
