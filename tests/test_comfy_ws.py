"""ComfyUI's progress socket `/ws` on real processes: relayed to the image backend its
prompts run on, on that node and through a master to a slave, and told each prompt's progress.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.harness import Cluster, ModelSpec, RouterNode, sim_weights, start_cluster, text_model

pytestmark = pytest.mark.integration

RECV_SECS = 30.0
STEPS = 3
KEY = "comfy-test-key"
KEYED = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("comfy-ws")
    art = ModelSpec("art", {}, {"sdmodel": sim_weights(base_ms=5, image_ms_per_megapixel_step=1)})
    # The image model lives on the slave only: the master relays its socket there.
    c = start_cluster(
        root,
        [text_model("chat")],
        {"s1": [art]},
        master_sections={"auth": {"inference_keys": [KEY]}},
    )
    try:
        yield c
    finally:
        c.cleanup()


def progress_socket(node: RouterNode, query: str) -> ClientConnection:
    url = node.base_url.replace("http://", "ws://") + "/ws?" + query
    return connect(url, additional_headers=KEYED, open_timeout=30)


def messages_until_done(ws: ClientConnection, prompt_id: str) -> list[dict[str, Any]]:
    """The socket's messages up to the one that ends `prompt_id` (executing no node)."""
    seen: list[dict[str, Any]] = []
    while True:
        message = json.loads(ws.recv(timeout=RECV_SECS))
        seen.append(message)
        data = message.get("data", {})
        done = message["type"] == "executing" and data.get("node") is None
        if done and data.get("prompt_id") == prompt_id:
            return seen


def workflow(client_id: str) -> dict[str, Any]:
    return {
        "client_id": client_id,
        "prompt": {
            "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "art"}},
            "3": {"class_type": "KSampler", "inputs": {"steps": STEPS, "model": ["4", 0]}},
        },
    }


@pytest.mark.parametrize("through", ["master", "s1"])
def test_the_progress_socket_tells_a_prompts_progress(cluster: Cluster, through: str) -> None:
    node = cluster.master if through == "master" else cluster.slaves["s1"]
    client_id = f"client-{through}"
    with progress_socket(node, f"clientId={client_id}") as ws:
        hello = json.loads(ws.recv(timeout=RECV_SECS))
        assert hello["type"] == "status" and hello["data"]["sid"] == client_id
        with node.client() as client:
            posted = client.post("/prompt", json=workflow(client_id), headers=KEYED)
            assert posted.status_code == 200, posted.text
            prompt_id = posted.json()["prompt_id"]
            seen = messages_until_done(ws, prompt_id)
            kinds = [m["type"] for m in seen]
            assert kinds[0] == "execution_start" and "execution_success" in kinds
            steps = [m["data"]["value"] for m in seen if m["type"] == "progress"]
            assert steps == list(range(1, STEPS + 1))
            assert all(m["data"]["prompt_id"] == prompt_id for m in seen)
            # Done when the socket says so: its history has the output.
            history = client.get(f"/history/{prompt_id}", headers=KEYED).json()
            assert history[prompt_id]["status"]["completed"] is True


def test_another_clients_prompt_is_not_told_on_this_socket(cluster: Cluster) -> None:
    with (
        progress_socket(cluster.master, "clientId=watcher") as watcher,
        progress_socket(cluster.master, "clientId=worker") as worker,
    ):
        watcher.recv(timeout=RECV_SECS)
        worker.recv(timeout=RECV_SECS)
        with cluster.master.client() as client:
            posted = client.post("/prompt", json=workflow("worker"), headers=KEYED)
            theirs = posted.json()["prompt_id"]
            messages_until_done(worker, theirs)
            # One socket's messages keep their order: had the worker's prompt been told here,
            # it would come before anything of the watcher's own, posted after it ended.
            posted = client.post("/prompt", json=workflow("watcher"), headers=KEYED)
            own = posted.json()["prompt_id"]
            seen = messages_until_done(watcher, own)
        assert {m["data"]["prompt_id"] for m in seen} == {own}


def test_a_socket_naming_an_unknown_model_is_closed_with_the_404(cluster: Cluster) -> None:
    with progress_socket(cluster.master, "clientId=x&model=nope") as ws:
        event = json.loads(ws.recv(timeout=RECV_SECS))
        assert event["type"] == "error" and event["error"]["code"] == "model_not_found"
        # The image models that exist are named, as in an HTTP 404.
        assert event["error"]["message"].endswith("; the models here are: art")
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=RECV_SECS)
    assert ws.close_code == 4404


def test_the_progress_socket_needs_the_inference_key_like_every_client_path(
    cluster: Cluster,
) -> None:
    url = cluster.master.base_url.replace("http://", "ws://") + "/ws?clientId=x"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, open_timeout=30)
    assert refused.value.response.status_code == 401
    # A plain GET says what the path is for.
    with cluster.master.client() as client:
        plain = client.get("/ws", headers=KEYED)
    assert plain.status_code == 426 and plain.json()["error"]["code"] == "upgrade_required"
