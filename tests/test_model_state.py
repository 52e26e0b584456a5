"""Enabling and disabling models per node: `POST /router/v1/site/models/state`, end to end.

Real `runrouter` processes with simulated backends. A disabled model is still listed by
`/router/v1/models` (flagged), is gone from the client lists, and every request for it is the
404 of an unknown model; the state lives in the serving node's own database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import (
    CLUSTER_TOKEN,
    Cluster,
    running_node,
    start_cluster,
    start_node,
    text_model,
)

pytestmark = pytest.mark.integration

STATE = "/router/v1/site/models/state"
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


def set_state(client: httpx.Client, node_id: str, local_id: str, enabled: Any) -> httpx.Response:
    return client.post(STATE, json={"node_id": node_id, "local_id": local_id, "enabled": enabled})


def flags(client: httpx.Client) -> dict[tuple[str, str], bool]:
    """(node_id, local_id) → disabled, from the management list."""
    recs = client.get("/router/v1/models").json()["models"]
    return {(r["node_id"], r["local_id"]): r["disabled"] for r in recs}


def listed(client: httpx.Client) -> tuple[set[str], set[str]]:
    """The public IDs that /v1/models and /api/tags list."""
    openai = {m["id"] for m in client.get("/v1/models").json()["data"]}
    ollama = {m["name"] for m in client.get("/api/tags").json()["models"]}
    return openai, ollama


def assert_not_found(client: httpx.Client, model: str) -> None:
    # The answer goes on to list the models that exist, which it must not be among.
    message = f'model "{model}" was not found'
    resp = client.post("/v1/chat/completions", json=chat(model))
    assert resp.status_code == 404, resp.text
    said = resp.json()["error"]["message"]
    listed = said.partition("; the models here are: ")[2].split(", ")
    assert said.startswith(message) and model not in listed
    resp = client.post("/api/chat", json={**chat(model), "stream": False})
    assert resp.status_code == 404 and resp.json()["error"].startswith(message)
    resp = client.post("/api/v1/generate", json={"model": model, "prompt": "x"})
    assert resp.status_code == 404, resp.text


def loaded_models(client: httpx.Client, node_id: str | None = None) -> set[str]:
    params = {"node_id": node_id} if node_id else {}
    state = client.get("/router/v1/site/nodes/state", params=params).json()
    return {m["model_id"] for b in state["backends"] for m in b["loaded_models"]}


# -- one standalone node -------------------------------------------------------------------


def test_a_disabled_model_is_hidden_and_refused_stays_loaded_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    models = [text_model("alpha"), text_model("beta")]
    node = start_node(tmp_path, models)
    try:
        with node.client() as client:
            assert client.post("/router/v1/load", json={"model": "alpha"}).status_code == 200
            resp = set_state(client, "node-a", "alpha", False)
            assert resp.status_code == 200, resp.text
            snapshot = resp.json()
            assert snapshot["node_id"] == "node-a"
            assert {m["local_id"]: m["disabled"] for m in snapshot["models"]} == {
                "alpha": True,
                "beta": False,
            }
            assert flags(client) == {("node-a", "alpha"): True, ("node-a", "beta"): False}
            assert listed(client) == ({"beta"}, {"beta"})
            assert_not_found(client, "alpha")
            # Disabling does not unload: the model stays until another one replaces it.
            assert loaded_models(client) == {"alpha"}
            # A Kobold client naming no model gets the loaded one, unless it is disabled.
            resp = client.post("/api/v1/generate", json={"prompt": "x"})
            assert resp.status_code == 200, resp.text
            assert loaded_models(client) == {"beta"}
            assert client.post("/v1/chat/completions", json=chat("beta")).status_code == 200
            assert loaded_models(client) == {"beta"}
            # Asking twice is no change and no error.
            assert set_state(client, "node-a", "alpha", False).status_code == 200
            # An explicit load is refused rather than holding memory nobody can use.
            resp = client.post("/router/v1/load", json={"model": "alpha"})
            assert resp.status_code == 409 and resp.json()["error"]["code"] == "model_disabled"

        node.stop()
        node.cleanup(drop_db=False)
        node = start_node(tmp_path, models, port=node.port, db=node.db, keep_db=True)
        with node.client() as client:
            assert flags(client)[("node-a", "alpha")] is True
            assert_not_found(client, "alpha")
            assert set_state(client, "node-a", "alpha", True).status_code == 200
            assert flags(client)[("node-a", "alpha")] is False
            assert listed(client) == ({"alpha", "beta"}, {"alpha", "beta"})
            resp = client.post("/v1/chat/completions", json=chat("alpha"))
            assert resp.status_code == 200, resp.text
    finally:
        node.cleanup()


def test_bad_requests_are_refused_naming_the_field_and_change_nothing(tmp_path: Path) -> None:
    models = [text_model("alpha"), text_model("beta")]
    with running_node(tmp_path, models) as node, node.client() as client:
        before = flags(client)
        cases = [
            ({"node_id": "elsewhere", "local_id": "alpha", "enabled": False}, 404, "node_id"),
            ({"node_id": "node-a", "local_id": "ghost", "enabled": False}, 404, "local_id"),
            ({"node_id": "node-a", "local_id": "alpha", "enabled": "false"}, 400, "enabled"),
            ({"node_id": "node-a", "local_id": "alpha", "enabled": 0}, 400, "enabled"),
            ({"node_id": "node-a", "local_id": "alpha"}, 400, "enabled"),
            ({"node_id": "node-a", "enabled": False}, 400, "local_id"),
            ({"local_id": "alpha", "enabled": False}, 400, "node_id"),
        ]
        for body, status, param in cases:
            resp = client.post(STATE, json=body)
            assert resp.status_code == status, (body, resp.text)
            assert resp.json()["error"]["param"] == param, body
        resp = set_state(client, "node-a", "ghost", False)
        assert '"ghost"' in resp.json()["error"]["message"]
        json_body = {"Content-Type": "application/json"}
        assert client.post(STATE, content=b"[1]", headers=json_body).status_code == 400
        # A management write's body must say it is JSON (the front door's rule).
        assert client.post(STATE, content=b"[1]").status_code == 415
        assert client.get(STATE).status_code == 404
        assert flags(client) == before


# -- a cluster -----------------------------------------------------------------------------


def shared(name: str) -> Any:
    # Same weights content and settings on both nodes → identical hashes → replicas.
    return text_model(name, load_ms=50, base_ms=5, output_ms_per_token=1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("model-state")
    store = root / "master" / "store"
    store.mkdir(parents=True)
    recipe = {
        "id": "combo",
        "public_id": "combo",
        "text": {
            "kind": "text",
            "node_id": "s1",
            "model_id": "solo",
            "config_filename": "solo.kcpps",
        },
    }
    (store / "split-recipes.json").write_text(json.dumps({"recipes": [recipe]}))
    c = start_cluster(root, [shared("twin")], {"s1": [shared("twin"), text_model("solo")]})
    try:
        yield c
    finally:
        c.cleanup()


def test_disabling_a_slave_model_through_the_master_takes_effect_at_once(cluster: Cluster) -> None:
    slave = cluster.slaves["s1"]
    with cluster.master.client() as client, slave.client() as direct:
        assert client.post("/v1/chat/completions", json=chat("solo")).status_code == 200
        resp = set_state(client, "s1", "solo", False)
        assert resp.status_code == 200, resp.text
        snapshot = resp.json()
        assert snapshot["node_id"] == "s1" and snapshot["node_url"] == slave.base_url
        assert {m["local_id"]: m["disabled"] for m in snapshot["models"]}["solo"] is True
        # No poll in between: the master took the answer in.
        assert flags(client)[("s1", "solo")] is True
        assert "solo" not in listed(client)[0] | listed(client)[1]
        assert_not_found(client, "solo")
        # A recipe whose component is disabled names that, not a missing replica.
        resp = client.post("/v1/chat/completions", json=chat("combo"))
        assert resp.status_code == 404
        assert resp.json()["error"]["message"] == 'recipe "combo" uses a disabled model'
        # The slave itself refuses it too, and its own snapshot says so.
        assert_not_found(direct, "solo")
        models = direct.get("/router/v1/node/models", headers=AUTH).json()["models"]
        assert {m["local_id"]: m["disabled"] for m in models}["solo"] is True

        resp = set_state(client, "s1", "solo", True)
        assert resp.status_code == 200, resp.text
        assert flags(client)[("s1", "solo")] is False
        assert client.post("/v1/chat/completions", json=chat("solo")).status_code == 200
        assert client.post("/v1/chat/completions", json=chat("combo")).status_code == 200


def test_a_model_disabled_on_one_node_is_still_served_by_its_replica(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        try:
            assert set_state(client, "master", "twin", False).status_code == 200
            assert flags(client)[("master", "twin")] is True
            assert "twin" in listed(client)[0] and "twin" in listed(client)[1]
            resp = client.post("/v1/chat/completions", json=chat("twin"))
            assert resp.status_code == 200, resp.text
            assert "twin" not in loaded_models(client)
            assert "twin" in loaded_models(client, "s1")
            # Disabled everywhere, the public ID is gone.
            assert set_state(client, "s1", "twin", False).status_code == 200
            assert "twin" not in listed(client)[0] | listed(client)[1]
            assert_not_found(client, "twin")
        finally:
            set_state(client, "master", "twin", True)
            set_state(client, "s1", "twin", True)
        assert client.post("/v1/chat/completions", json=chat("twin")).status_code == 200


def test_a_slave_keeps_its_disabled_models_across_its_restart(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        assert set_state(client, "s1", "solo", False).status_code == 200
    try:
        # The restarted slave registers before it reports ready, so the master knows at once.
        cluster.restart_slave("s1")
        with cluster.master.client() as client:
            assert flags(client)[("s1", "solo")] is True
            assert_not_found(client, "solo")
    finally:
        with cluster.master.client() as client:
            assert set_state(client, "s1", "solo", True).status_code == 200


def test_the_master_refuses_unknown_nodes_and_models_of_other_nodes(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = set_state(client, "s9", "solo", False)
        assert (resp.status_code, resp.json()["error"]["param"]) == (404, "node_id")
        # solo is a model of s1, not of the master.
        resp = set_state(client, "master", "solo", False)
        assert (resp.status_code, resp.json()["error"]["param"]) == (404, "local_id")
        resp = set_state(client, "s1", "ghost", False)
        assert resp.status_code == 404
        assert resp.json()["error"]["message"] == 'model "ghost" is not a model config on node "s1"'
        resp = set_state(client, "s1", "solo", "off")
        assert (resp.status_code, resp.json()["error"]["param"]) == (400, "enabled")
        assert flags(client)[("s1", "solo")] is False


def test_a_slave_has_no_site_route_but_answers_its_node_route(cluster: Cluster) -> None:
    slave = cluster.slaves["s1"]
    with slave.client() as client:
        assert set_state(client, "s1", "solo", False).status_code == 404
        body = {"local_id": "solo", "enabled": False}
        assert client.post("/router/v1/node/models/state", json=body).status_code == 401
        wrong = client.post(
            "/router/v1/node/models/state", json={**body, "node_id": "s2"}, headers=AUTH
        )
        assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "wrong_node")
        models = client.get("/router/v1/node/models", headers=AUTH).json()["models"]
        assert {m["local_id"]: m["disabled"] for m in models}["solo"] is False


def test_a_disabled_startup_model_is_skipped_and_the_node_still_starts(tmp_path: Path) -> None:
    models = [text_model("alpha"), text_model("beta")]
    node = start_node(tmp_path, models, models={"startup_model": "alpha"})
    try:
        with node.client() as client:
            assert loaded_models(client) == {"alpha"}
            assert set_state(client, "node-a", "alpha", False).status_code == 200
        node.stop()
        node.cleanup(drop_db=False)
        node = start_node(
            tmp_path,
            models,
            port=node.port,
            db=node.db,
            keep_db=True,
            models={"startup_model": "alpha"},
        )
        with node.client() as client:
            assert loaded_models(client) == set()
        assert "startup model 'alpha' is disabled on this node; not loaded" in node.output()
    finally:
        node.cleanup()
