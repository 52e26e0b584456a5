"""Request IDs end to end on real nodes: every answer carries one, and the node's analytics rows,
its log lines and the rows of every node the request passed through carry the same one."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import (
    Cluster,
    ModelSpec,
    RouterNode,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration
NEW_ID_RE = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    models = [
        text_model("alpha"),
        ModelSpec("broken", {"contextsize": 4096}, {"model_param": {"load_ms": -1}}),
    ]
    n = start_node(tmp_path_factory.mktemp("reqid"), models)
    try:
        yield n
    finally:
        n.cleanup()


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def analytics_ids(client: httpx.Client) -> list[str | None]:
    rows = client.get("/router/v1/site/analytics", params={"kind": "requests"}).json()["records"]
    return [r["request_id"] for r in rows]


def test_a_clients_id_is_answered_and_recorded(node: RouterNode) -> None:
    with node.client() as client:
        resp = client.post(
            "/v1/chat/completions", json=chat("alpha"), headers={"X-Request-Id": "trace-a1"}
        )
        assert resp.status_code == 200
        assert resp.headers["x-request-id"] == "trace-a1"
        assert "trace-a1" in analytics_ids(client)


def test_without_an_id_the_node_makes_one_and_records_it(node: RouterNode) -> None:
    with node.client() as client:
        streamed = client.post("/v1/chat/completions", json={**chat("alpha"), "stream": True})
        plain = client.post("/api/chat", json={**chat("alpha"), "stream": False})
        made = [streamed.headers["x-request-id"], plain.headers["x-request-id"]]
        assert all(NEW_ID_RE.fullmatch(i) for i in made) and made[0] != made[1]
        recorded = analytics_ids(client)
        assert set(made) <= set(recorded)


def test_every_kind_of_answer_carries_an_id(node: RouterNode) -> None:
    with node.client() as client:
        answers = [
            client.get("/v1/models"),
            client.get("/ping"),
            client.post("/v1/chat/completions", json=chat("nope")),  # 404
            client.post("/v1/chat/completions", content=b"{"),  # 400
            client.get("/router/v1/version"),  # Django
            client.get("/router/v1/no-such-route"),  # Django's 404
        ]
    for resp in answers:
        assert NEW_ID_RE.fullmatch(resp.headers["x-request-id"]), (resp.url, resp.headers)


def test_the_log_lines_a_request_causes_name_it(node: RouterNode) -> None:
    with node.client() as client:
        resp = client.post(
            "/v1/chat/completions", json=chat("broken"), headers={"X-Request-Id": "trace-broken"}
        )
    assert resp.status_code == 502 and resp.headers["x-request-id"] == "trace-broken"
    line = wait_for(
        lambda: next((x for x in node.lines if "load of broken failed" in x), None), timeout=10
    )
    assert "WARNING [trace-broken] proxy.runtimes.runtime:" in line


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("reqid-cluster"), [], {"s": [text_model("far")]})
    try:
        yield c
    finally:
        c.cleanup()


def test_a_request_served_by_another_node_is_recorded_there_under_the_same_id(
    cluster: Cluster,
) -> None:
    with cluster.master.client() as client:
        given = client.post(
            "/v1/chat/completions", json=chat("far"), headers={"X-Request-Id": "trace-far"}
        )
        made = client.post("/v1/chat/completions", json=chat("far"))
    assert given.status_code == made.status_code == 200
    assert given.headers["x-request-id"] == "trace-far"
    new_id = made.headers["x-request-id"]
    assert NEW_ID_RE.fullmatch(new_id)

    slave = cluster.slaves["s"]

    def recorded() -> set[str]:
        rows = slave.query(
            "SELECT request_id FROM analytics_requests WHERE model_id = %s", ("far",)
        )
        return {r[0] for r in rows}

    wait_for(lambda: {"trace-far", new_id} <= recorded(), timeout=10)
