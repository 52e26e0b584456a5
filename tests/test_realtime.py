"""The `/v1/realtime` WebSocket with a real `websockets` client, on a real master and slave.

The master holds `talk` itself and reaches the slave's `talk` (other weights) as `talk-2`, so
each test covers the relay to a local backend and the relay through another node's router.
The simulated backend echoes frames with the model ID it was given, closes with the client's
code, and counts its open sockets in /sim/stats.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.harness import (
    CLUSTER_TOKEN,
    Cluster,
    ModelSpec,
    RouterNode,
    sim_weights,
    start_cluster,
    wait_for,
)

pytestmark = pytest.mark.integration

KEY = "realtime-test-key"
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
RECV_SECS = 10.0
CONNECTION_CAP = 4
# (model the client names, node whose backend serves it, ID that backend is given)
TARGETS = [("talk", "master", "talk"), ("talk-2", "s1", "talk")]


def talker(**costs: Any) -> ModelSpec:
    return ModelSpec(
        "talk",
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(**costs), "ttsmodel": sim_weights(**costs)},
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("realtime")
    c = start_cluster(
        root,
        [talker(base_ms=5)],
        {"s1": [talker(base_ms=7)]},
        master_sections={
            "auth": {"inference_keys": [KEY]},
            "server": {"max_connections_per_client": CONNECTION_CAP},
        },
    )
    try:
        yield c
    finally:
        c.cleanup()


def node_of(cluster: Cluster, name: str) -> RouterNode:
    return cluster.master if name == "master" else cluster.slaves[name]


def backend_stats(node: RouterNode) -> dict[str, Any]:
    with node.client() as client:
        state = client.get("/router/v1/node/state", headers=AUTH).json()
    backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
    stats: dict[str, Any] = httpx.get(backend["base_url"] + "/sim/stats").json()
    return stats


def open_sockets(node: RouterNode) -> int:
    with node.client() as client:
        state = client.get("/router/v1/node/state", headers=AUTH).json()
    backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
    if backend["base_url"] is None:
        return 0
    count: int = httpx.get(backend["base_url"] + "/sim/stats").json().get("realtime_open", 0)
    return count


def ws_url(cluster: Cluster, model: str | None) -> str:
    url = cluster.master.base_url.replace("http://", "ws://") + "/v1/realtime"
    return url + (f"?model={model}" if model is not None else "")


def session(cluster: Cluster, model: str | None, **kwargs: Any) -> ClientConnection:
    headers = kwargs.pop("additional_headers", {"Authorization": f"Bearer {KEY}"})
    return connect(ws_url(cluster, model), additional_headers=headers, open_timeout=30, **kwargs)


def recv_json(ws: ClientConnection) -> dict[str, Any]:
    frame = ws.recv(timeout=RECV_SECS)
    assert isinstance(frame, str), frame
    doc: dict[str, Any] = json.loads(frame)
    return doc


@pytest.mark.parametrize(("model", "where", "served"), TARGETS)
def test_text_and_binary_frames_pass_both_ways_with_the_public_id(
    cluster: Cluster, model: str, where: str, served: str
) -> None:
    with session(cluster, model) as ws:
        ws.send("hello")
        assert recv_json(ws) == {"model": model, "echo": "hello"}
        payload = bytes(range(256)) * 4
        ws.send(payload)
        assert ws.recv(timeout=RECV_SECS) == payload
    # The backend that echoed was the one that holds the model, under its own ID there.
    assert backend_stats(node_of(cluster, where)).get("realtime_opened", 0) >= 1


@pytest.mark.parametrize(("model", "where", "served"), TARGETS)
def test_a_session_update_reaches_the_backend_under_its_own_id(
    cluster: Cluster, model: str, where: str, served: str
) -> None:
    update = {"type": "session.update", "session": {"model": model, "voice": "alloy"}}
    with session(cluster, model) as ws:
        ws.send(json.dumps(update))
        # The sim echoes the frame as it got it: the model there is the backend's own ID.
        got = json.loads(recv_json(ws)["echo"])
    assert got == {"type": "session.update", "session": {"model": served, "voice": "alloy"}}


@pytest.mark.parametrize(("model", "where", "served"), TARGETS)
def test_streamed_frames_arrive_whole_and_in_order(
    cluster: Cluster, model: str, where: str, served: str
) -> None:
    count = 200
    with session(cluster, model) as ws:
        ws.send(json.dumps({"type": "sim.stream", "count": count}))
        assert [recv_json(ws)["seq"] for _ in range(count)] == list(range(count))
        for index in range(count):
            ws.send(index.to_bytes(4, "big") * 16)
        echoed = [ws.recv(timeout=RECV_SECS) for _ in range(count)]
        assert echoed == [index.to_bytes(4, "big") * 16 for index in range(count)]


@pytest.mark.parametrize(("model", "where", "served"), TARGETS)
@pytest.mark.parametrize("code", [1000, 1001, 4001])
def test_the_clients_close_code_reaches_the_backend(
    cluster: Cluster, model: str, where: str, served: str, code: int
) -> None:
    backend = node_of(cluster, where)
    with session(cluster, model) as ws:
        ws.send("hi")
        recv_json(ws)
        ws.close(code=code, reason="done")
    wait_for(lambda: open_sockets(backend) == 0)
    assert backend_stats(backend)["realtime_last_close_code"] == code


@pytest.mark.parametrize(("model", "where", "served"), TARGETS)
@pytest.mark.parametrize("code", [1000, 1001, 1011, 4003])
def test_the_backends_close_code_and_reason_reach_the_client(
    cluster: Cluster, model: str, where: str, served: str, code: int
) -> None:
    with session(cluster, model) as ws:
        ws.send(json.dumps({"type": "sim.close", "code": code, "reason": "bye"}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=RECV_SECS)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (code, "bye")


@pytest.mark.parametrize(("model", "where", "served"), TARGETS)
def test_a_backend_that_drops_its_socket_closes_the_session_with_1011(
    cluster: Cluster, model: str, where: str, served: str
) -> None:
    with session(cluster, model) as ws:
        ws.send(json.dumps({"type": "sim.drop"}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=RECV_SECS)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011


@pytest.mark.parametrize(("model", "where", "served"), TARGETS)
def test_a_client_that_drops_its_connection_frees_the_backend_socket(
    cluster: Cluster, model: str, where: str, served: str
) -> None:
    backend = node_of(cluster, where)
    with session(cluster, model) as ws:
        ws.send("hi")
        recv_json(ws)
        assert wait_for(lambda: open_sockets(backend) == 1)
        # Gone without a close frame, as a client whose network dropped.
        ws.socket.close()
        wait_for(lambda: open_sockets(backend) == 0)


def test_the_browser_subprotocol_carries_the_key(cluster: Cluster) -> None:
    protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
    with session(cluster, "talk", additional_headers={}, subprotocols=protocols) as ws:
        # The backend's choice among what the client offered (never the key) comes back.
        assert ws.subprotocol == "realtime"
        ws.send("hi")
        assert recv_json(ws)["echo"] == "hi"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {CLUSTER_TOKEN}"}],
)
def test_a_session_without_the_inference_key_is_refused_before_the_upgrade(
    cluster: Cluster, headers: dict[str, str]
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        session(cluster, "talk", additional_headers=headers)
    assert refused.value.response.status_code == 401


def test_a_wrong_key_in_the_subprotocol_is_refused(cluster: Cluster) -> None:
    with pytest.raises(InvalidStatus) as refused:
        session(
            cluster,
            "talk",
            additional_headers={},
            subprotocols=["realtime", "openai-insecure-api-key.wrong"],
        )
    assert refused.value.response.status_code == 401


@pytest.mark.parametrize(
    ("model", "code", "says"),
    [(None, 4400, "model is required"), ("nope", 4404, "was not found")],
)
def test_a_session_that_cannot_start_says_why_and_closes(
    cluster: Cluster, model: str | None, code: int, says: str
) -> None:
    with session(cluster, model) as ws:
        event = recv_json(ws)
        assert event["type"] == "error" and says in event["error"]["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=RECV_SECS)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code


def test_the_node_route_takes_only_the_cluster_token(cluster: Cluster) -> None:
    slave = cluster.slaves["s1"]
    url = slave.base_url.replace("http://", "ws://") + "/router/v1/node/inference/v1/realtime"
    with pytest.raises(InvalidStatus) as refused:
        connect(url + "?model=talk", additional_headers={"Authorization": f"Bearer {KEY}"})
    assert refused.value.response.status_code == 401
    with connect(url + "?model=talk", additional_headers=AUTH, open_timeout=30) as ws:
        ws.send("hi")
        assert recv_json(ws) == {"model": "talk", "echo": "hi"}


def test_closed_sockets_give_their_connection_back_to_the_front_door(cluster: Cluster) -> None:
    # Over the per-address cap, a leaked count would refuse the next connection with 429.
    for _ in range(CONNECTION_CAP * 2):
        with session(cluster, "talk") as ws:
            ws.send("hi")
            recv_json(ws)
    with cluster.master.client(headers={"Authorization": f"Bearer {KEY}"}) as client:
        assert client.get("/v1/models").status_code == 200
