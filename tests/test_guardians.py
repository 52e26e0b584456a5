"""Guardian models end to end: settings API, pre-dispatch reroute, fallback on refusal, restore.

Real `runrouter` processes with simulated backends; an upstream-mode model points at a
separate simulated server without vision, which refuses images the way a real one does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import (
    REPO,
    Cluster,
    ModelSpec,
    RouterNode,
    free_port,
    sim_weights,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration

GUARDIANS = "/router/v1/site/guardians"
RESTORE: dict[str, Any] = {"cluster": {"offload_restore_delay": "300ms"}}
IMAGE_CONTENT = [
    {"type": "text", "text": "what is in it"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
]


def vision_model(name: str) -> ModelSpec:
    return ModelSpec(
        name,
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(vision=True), "mmproj": sim_weights(vision=True)},
    )


def image_chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": IMAGE_CONTENT}], **extra}


def text_chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}]}


def loaded_text_model(client: httpx.Client, node_id: str | None = None) -> str | None:
    query = f"?node_id={node_id}" if node_id else ""
    state = client.get(f"/router/v1/site/nodes/state{query}").json()
    for backend in state["backends"]:
        if backend["id"] == "text-runtime" and backend["loaded_models"]:
            return str(backend["loaded_models"][0]["model_id"])
    return None


@pytest.fixture(scope="module")
def blind_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An OpenAI-compatible server without vision that the router does not manage."""
    root = tmp_path_factory.mktemp("upstream")
    weights = root / "blind.sim.json"
    weights.write_text(json.dumps(sim_weights(load_ms=0)))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.sim", "-m", str(weights), "--port", str(port)],
        cwd=str(REPO),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/v1/models", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, blind_upstream: str) -> Iterator[RouterNode]:
    models = [
        text_model("plain"),
        text_model("other"),
        vision_model("seer"),
        vision_model("seer-two"),
        ModelSpec("outside", {"backend_mode": "upstream", "upstream_url": blind_upstream}),
    ]
    n = start_node(tmp_path_factory.mktemp("guardians"), models, cluster=RESTORE["cluster"])
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def client(node: RouterNode) -> Iterator[httpx.Client]:
    with node.client() as c:
        yield c
        for scope, key in (("cluster", ""), ("model", "plain"), ("model", "outside")):
            c.delete(GUARDIANS, params={"scope": scope, "key": key})


def test_the_settings_api_validates_whole_and_reports_the_effective_guardian(
    client: httpx.Client,
) -> None:
    doc = client.get(GUARDIANS).json()
    assert doc["cluster"] is None and doc["nodes"] == {} and doc["models"] == {}
    assert doc["candidates"] == ["seer", "seer-two"]
    assert doc["effective"] == {}

    # A text-only model cannot guard; one bad entry refuses the whole body.
    resp = client.post(GUARDIANS, json={"cluster": "seer", "models": {"plain": "other"}})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "models.plain" and err["code"] == "invalid_guardian"
    assert client.get(GUARDIANS).json()["cluster"] is None

    for body, param in (
        ({"nodes": {"nowhere": "seer"}}, "nodes.nowhere"),
        ({"models": {"ghost": "seer"}}, "models.ghost"),
        ({"models": {"seer": "seer"}}, "models.seer"),
        ({"models": ["plain"]}, "models"),
        ({"colour": "blue"}, "colour"),
        ({}, "cluster"),
    ):
        resp = client.post(GUARDIANS, json=body)
        assert resp.status_code == 400, body
        assert resp.json()["error"]["param"] == param, body

    doc = client.post(GUARDIANS, json={"cluster": "seer", "nodes": {"node-a": "seer-two"}}).json()
    assert doc["cluster"] == "seer" and doc["nodes"] == {"node-a": "seer-two"}
    # The node scope beats the cluster scope; a model never guards itself.
    assert doc["effective"]["plain"] == "seer-two"
    assert "seer-two" not in doc["effective"]
    doc = client.post(GUARDIANS, json={"models": {"plain": "seer"}}).json()
    assert doc["effective"]["plain"] == "seer" and doc["effective"]["other"] == "seer-two"

    doc = client.delete(GUARDIANS, params={"scope": "node", "key": "node-a"}).json()
    assert doc["nodes"] == {} and doc["effective"]["other"] == "seer"
    resp = client.delete(GUARDIANS, params={"scope": "everywhere"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "scope"
    resp = client.delete(GUARDIANS, params={"scope": "model"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "key"


def test_without_a_guardian_an_image_to_a_text_only_model_is_refused_before_any_backend(
    client: httpx.Client,
) -> None:
    resp = client.post("/v1/chat/completions", json=image_chat("plain"))
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert "not supported" in err["message"] and "guardian" in err["message"]
    assert err["code"] == "image_not_supported"


def test_the_guardian_answers_in_the_model_s_name_and_the_model_is_loaded_back(
    client: httpx.Client,
) -> None:
    client.post(GUARDIANS, json={"models": {"plain": "seer"}}).raise_for_status()
    assert client.post("/v1/chat/completions", json=text_chat("plain")).status_code == 200
    assert loaded_text_model(client) == "plain"

    resp = client.post("/v1/chat/completions", json=image_chat("plain"))
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "plain"
    # The guardian shared the runtime: it displaced the text-only model, which comes back once
    # the node is quiet for offload_restore_delay.
    assert wait_for(lambda: loaded_text_model(client) == "plain", timeout=20)

    # Streamed, and through Ollama's chat with an images list: the same reroute.
    with client.stream("POST", "/v1/chat/completions", json=image_chat("plain", stream=True)) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: {")]
    assert events and all(json.loads(e[6:])["model"] == "plain" for e in events)
    resp = client.post(
        "/api/chat",
        json={
            "model": "plain",
            "stream": False,
            "messages": [{"role": "user", "content": "what", "images": ["AAAA"]}],
        },
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "plain" and resp.json()["message"]["content"]


def test_the_cluster_guardian_covers_every_text_only_model(client: httpx.Client) -> None:
    client.post(GUARDIANS, json={"cluster": "seer-two"}).raise_for_status()
    resp = client.post("/v1/chat/completions", json=image_chat("other"))
    assert resp.status_code == 200 and resp.json()["model"] == "other"
    # A model with vision reads its own images.
    resp = client.post("/v1/chat/completions", json=image_chat("seer"))
    assert resp.status_code == 200 and resp.json()["model"] == "seer"


def test_a_backend_that_refuses_the_image_hands_the_request_to_the_guardian(
    client: httpx.Client,
) -> None:
    # The router cannot know what an upstream server reads, so the request goes there first.
    resp = client.post("/v1/chat/completions", json=image_chat("outside"))
    assert resp.status_code == 400 and "not supported" in resp.text

    client.post(GUARDIANS, json={"models": {"outside": "seer"}}).raise_for_status()
    resp = client.post("/v1/chat/completions", json=image_chat("outside"))
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "outside"
    # Text keeps going to the upstream server.
    resp = client.post("/v1/chat/completions", json=text_chat("outside"))
    assert resp.status_code == 200 and resp.json()["model"] == "outside"


# -- cluster ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("guardians-cluster")
    c = start_cluster(
        root,
        [],
        {
            "a": [text_model("plain"), vision_model("seer")],
            "b": [text_model("bee"), vision_model("eye")],
        },
        master_sections=RESTORE,
    )
    try:
        yield c
    finally:
        c.cleanup()


def test_across_the_cluster_only_the_text_only_model_s_node_loads_it_back(
    cluster: Cluster,
) -> None:
    with cluster.master.client() as master, cluster.slaves["a"].client() as a:
        master.post("/v1/chat/completions", json=text_chat("bee")).raise_for_status()
        master.post("/v1/chat/completions", json=text_chat("plain")).raise_for_status()

        # A guardian on another node answers, and that node keeps the guardian loaded.
        master.post(GUARDIANS, json={"models": {"plain": "eye"}}).raise_for_status()
        resp = master.post("/v1/chat/completions", json=image_chat("plain"))
        assert resp.status_code == 200 and resp.json()["model"] == "plain"
        assert loaded_text_model(master, "b") == "eye"
        assert loaded_text_model(master, "a") == "plain"

        # The guardian on the model's own node shares its runtime and loads it back.
        master.post(GUARDIANS, json={"models": {"plain": "seer"}}).raise_for_status()
        resp = master.post("/v1/chat/completions", json=image_chat("plain"))
        assert resp.status_code == 200 and resp.json()["model"] == "plain"
        wait_for(lambda: loaded_text_model(master, "a") == "plain", timeout=20)
        # Node b finished its guardian work earlier and has the same delay: had it been
        # going to restore, it would have by now.
        assert loaded_text_model(master, "b") == "eye"

        # The settings were pushed: a client talking to the slave directly gets the same
        # guardian, one of the slave's own models.
        def pushed() -> bool:
            r = a.post("/v1/chat/completions", json=image_chat("plain"))
            return r.status_code == 200 and r.json()["model"] == "plain"

        wait_for(pushed, timeout=20)
        # On a slave the site API does not exist.
        assert a.get(GUARDIANS).status_code == 404
