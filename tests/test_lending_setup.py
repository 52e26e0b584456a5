"""Lending part 1 on a real cluster: links (both lanes), propagation, settings, the router queue."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import (
    CLUSTER_TOKEN,
    Cluster,
    ModelSpec,
    sim_weights,
    start_cluster,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
TEXT = "/router/v1/site/text-routing-groups"
IMAGE = "/router/v1/site/routing-groups"


def picture(name: str) -> ModelSpec:
    return ModelSpec(name, {}, {"sdmodel": sim_weights(base_ms=5, image_ms_per_megapixel_step=1)})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("lending")
    c = start_cluster(
        root,
        [
            text_model("own", output_ms_per_token=60),
            text_model("free", output_ms_per_token=60),
            picture("pic"),
        ],
        {
            "s1": [
                text_model("help", output_ms_per_token=2),
                ModelSpec(
                    "wide", {"contextsize": 4096, "parallel": 2}, {"model_param": sim_weights()}
                ),
                ModelSpec("noctx", {"parallel": 1}, {"model_param": sim_weights(base_ms=6)}),
                ModelSpec(
                    "seer",
                    {"contextsize": 4096, "parallel": 1},
                    {"model_param": sim_weights(vision=True), "mmproj": sim_weights(vision=True)},
                ),
                picture("pic"),
            ]
        },
    )
    try:
        yield c
    finally:
        c.cleanup()


def master(c: Cluster) -> httpx.Client:
    return c.master.client()


def slave_status(c: Cluster) -> dict[str, Any]:
    with c.slaves["s1"].client() as client:
        return client.get("/router/v1/node/runtime-status", headers=AUTH).json()


def test_candidates_are_labelled_and_ineligible_ones_listed_with_the_reason(
    cluster: Cluster,
) -> None:
    with master(cluster) as client:
        doc = client.get(TEXT, params={"node_id": "master", "model_id": "own"}).json()
    cands = {c["model_id"]: c for c in doc["candidates"]}
    assert set(cands) == {"help", "wide", "noctx", "seer"}  # other nodes only, none omitted
    assert cands["help"]["eligible"] and cands["help"]["context_size"] == 4096
    assert cands["help"]["weights_match"] is False
    assert "serves requests concurrently" in cands["wide"]["ineligible_reason"]
    assert "context window" in cands["noctx"]["ineligible_reason"]
    assert "multimodal" in cands["seer"]["ineligible_reason"]
    assert cands["help"]["lends_to"] == {
        "selected": False,
        "load_if_unloaded": True,
        "restore_after_borrow": False,
    }


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            {
                "anchor": {"node_id": "master", "model_id": "own"},
                "lends_to": [{"node_id": "s1", "model_id": "wide"}],
            },
            "not eligible",
        ),
        (
            {
                "anchor": {"node_id": "master", "model_id": "own"},
                "lends_to": [{"node_id": "master", "model_id": "free"}],
            },
            "own node",
        ),
        (
            {
                "anchor": {"node_id": "master", "model_id": "own"},
                "lends_to": [{"node_id": "s1", "model_id": "nope"}],
            },
            "unknown",
        ),
        ({"anchor": {"node_id": "master", "model_id": "nope"}}, "unknown"),
        ({"anchor": {"node_id": "master", "model_id": "own"}, "lends_to": "s1"}, "must be a list"),
        (
            {
                "anchor": {"node_id": "master", "model_id": "own"},
                "lends_to": [{"node_id": "s1", "model_id": "help", "load_if_unloaded": "yes"}],
            },
            "true or false",
        ),
        (
            {
                "anchor": {"node_id": "master", "model_id": "own"},
                "lends_to": [{"node_id": "s1", "model_id": "help"}],
            },
            "different weights",
        ),
    ],
)
def test_bad_link_sets_are_refused_and_change_nothing(
    cluster: Cluster, body: dict[str, Any], fragment: str
) -> None:
    with master(cluster) as client:
        before = client.get(TEXT).json()
        resp = client.post(TEXT, json=body)
        assert resp.status_code == 400
        assert fragment in resp.json()["error"]["message"]
        assert client.get(TEXT).json() == before


def test_a_saved_link_enrolls_both_models_everywhere_at_once_and_delete_undoes_it(
    cluster: Cluster,
) -> None:
    body = {
        "anchor": {"node_id": "master", "model_id": "own"},
        "lends_to": [{"node_id": "s1", "model_id": "help", "restore_after_borrow": True}],
        "acknowledge_different_weights": True,
    }
    with master(cluster) as client:
        resp = client.post(TEXT, json=body)
        assert resp.status_code == 200, resp.text
        links = client.get(TEXT).json()["links"]
        assert links == [
            {
                "owner_node_id": "master",
                "owner_model_id": "own",
                "helper_node_id": "s1",
                "helper_model_id": "help",
                "load_if_unloaded": True,
                "restore_after_borrow": True,
            }
        ]
        doc = client.get(TEXT, params={"node_id": "s1", "model_id": "help"}).json()
        own = next(c for c in doc["candidates"] if c["model_id"] == "own")
        assert own["borrows_from"]["selected"] and own["borrows_from"]["restore_after_borrow"]
        # Saving again needs no acknowledgement: the link already exists.
        body.pop("acknowledge_different_weights")
        assert client.post(TEXT, json=body).status_code == 200
    # The slave was told at once: its model is enrolled (it has a queue in its runtime status).
    assert [q["model_id"] for q in slave_status(cluster)["text_queue"]] == ["help"]
    with master(cluster) as client:
        resp = client.delete(TEXT, params={"node_id": "master", "model_id": "own"})
        assert resp.status_code == 200 and resp.json()["deleted"] == 1
        assert client.get(TEXT).json()["links"] == []
        assert client.delete(TEXT).status_code == 400
    assert slave_status(cluster)["text_queue"] == []


def test_image_links_use_image_ids_and_flag_identical_weights(cluster: Cluster) -> None:
    with master(cluster) as client:
        doc = client.get(IMAGE, params={"node_id": "master", "model_id": "pic-pic-sdmodel"}).json()
        cand = doc["candidates"][0]
        assert (cand["node_id"], cand["model_id"], cand["weights_match"]) == (
            "s1",
            "pic-pic-sdmodel",
            True,
        )
        assert "eligible" not in cand
        body = {
            "anchor": {"node_id": "s1", "model_id": "pic-pic-sdmodel"},
            "borrows_from": [{"node_id": "master", "model_id": "pic-pic-sdmodel"}],
        }
        assert client.post(IMAGE, json=body).status_code == 200  # same weights: no acknowledgement
        assert client.get(IMAGE).json()["links"][0]["owner_node_id"] == "master"
        assert (
            client.delete(IMAGE, params={"node_id": "s1", "model_id": "pic-pic-sdmodel"}).json()[
                "deleted"
            ]
            == 1
        )


def test_settings_batches_are_all_or_nothing_and_reach_every_slave(cluster: Cluster) -> None:
    path = "/router/v1/site/offload/settings"
    with master(cluster) as client:
        before = client.get(path).json()
        resp = client.post(
            path, json={"values": {"offload_probe_idle": "2s", "scheduling_backend_depth": "0"}}
        )
        assert (
            resp.status_code == 400
            and "scheduling_backend_depth" in resp.json()["error"]["message"]
        )
        assert client.get(path).json() == before
        resp = client.post(path, json={"values": {"offload_probe_idle": "2000ms"}})
        assert resp.status_code == 200
        entry = next(e for e in resp.json()["entries"] if e["key"] == "offload_probe_idle")
        assert (entry["effective"], entry["source"]) == ("2s", "db")
        fingerprint = resp.json()["fingerprint"]
        assert fingerprint != before["fingerprint"]
    assert slave_status(cluster)["settings_fingerprint"] == fingerprint
    with master(cluster) as client:
        summary = client.get("/router/v1/site/offload/summary").json()
        assert {n["node_id"]: n["settings_fingerprint"] for n in summary["nodes"]} == {
            "master": fingerprint,
            "s1": fingerprint,
        }
        assert summary["leases"] == []
        assert client.delete(path, params={"key": "offload_probe_idle"}).status_code == 200
        assert client.get(path).json()["fingerprint"] == before["fingerprint"]
    wait_for(lambda: slave_status(cluster)["settings_fingerprint"] == before["fingerprint"])


def _held(client: httpx.Client) -> list[dict[str, Any]]:
    summary = client.get("/router/v1/site/offload/summary").json()
    return next(n for n in summary["nodes"] if n["node_id"] == "master")["held_requests"]


def test_an_enrolled_model_is_queued_in_the_router_and_depth_applies_live(cluster: Cluster) -> None:
    body = {
        "anchor": {"node_id": "master", "model_id": "own"},
        "lends_to": [{"node_id": "s1", "model_id": "help"}],
        "acknowledge_different_weights": True,
    }
    statuses: list[int] = []

    def call(model: str, stream: bool = False) -> None:
        with httpx.Client(base_url=cluster.master.base_url, timeout=60) as c:
            payload = {
                "model": model,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 10,
                "stream": stream,
            }
            statuses.append(c.post("/v1/chat/completions", json=payload).status_code)

    with master(cluster) as client:
        assert client.post(TEXT, json=body).status_code == 200
        threads = [threading.Thread(target=call, args=("own", i == 4)) for i in range(5)]
        for t in threads:
            t.start()
        held = wait_for(lambda: len(_held(client)) == 3 and _held(client))
        assert {h["state"] for h in held} == {"queued"}
        assert all(h["model_id"] == "own" and h["waiting_ms"] >= 0 for h in held)
        status = client.get("/router/v1/node/runtime-status", headers=AUTH).json()
        own = next(q for q in status["text_queue"] if q["model_id"] == "own")
        assert own["pending_count"] == 3 and own["backlog_count"] == 5
        resp = client.post(
            "/router/v1/site/offload/settings", json={"values": {"scheduling_backend_depth": 4}}
        )
        assert resp.status_code == 200
        wait_for(lambda: len(_held(client)) <= 1)
        for t in threads:
            t.join()
        assert statuses == [200] * 5
        assert _held(client) == []
        client.delete("/router/v1/site/offload/settings")
        client.delete(TEXT, params={"node_id": "master", "model_id": "own"})


def test_an_unlinked_model_is_never_queued(cluster: Cluster) -> None:
    done: list[int] = []

    def call() -> None:
        with httpx.Client(base_url=cluster.master.base_url, timeout=60) as c:
            payload = {
                "model": "free",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 5,
            }
            done.append(c.post("/v1/chat/completions", json=payload).status_code)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    with master(cluster) as client:
        seen = []
        while any(t.is_alive() for t in threads):
            seen.extend(_held(client))
    for t in threads:
        t.join()
    assert done == [200] * 4 and seen == []


def test_the_decision_log_api_checks_its_filters_and_gathers_every_node(cluster: Cluster) -> None:
    path = "/router/v1/site/offload/decisions"
    with master(cluster) as client:
        assert client.get(path, params={"limit": "0"}).status_code == 400
        assert client.get(path, params={"limit": "x"}).status_code == 400
        assert client.get(path, params={"since_ms": "-1"}).status_code == 400
        assert client.get(path, params={"lane": "audio"}).status_code == 400
        resp = client.get(path, params={"limit": "10"})
        assert resp.status_code == 200 and "node_errors" not in resp.json()
        assert isinstance(resp.json()["records"], list)
    with cluster.slaves["s1"].client() as client:
        assert client.get(path).status_code == 404
        assert client.get("/router/v1/node/offload/decisions", headers=AUTH).status_code == 200
        assert (
            client.post("/router/v1/node/routing-links", json={}, headers=AUTH).status_code == 204
        )
    with master(cluster) as client:
        # Only a slave runs pushed links and settings.
        assert (
            client.post("/router/v1/node/routing-links", json={}, headers=AUTH).status_code == 409
        )
        assert (
            client.post("/router/v1/node/offload/settings", json={}, headers=AUTH).status_code
            == 409
        )
