"""The Nodes page's generation-checked unload on a real cluster: local and through the master,
stale generations refused, running and borrowed work let through, bad bodies refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import CLUSTER_TOKEN, Cluster, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration

UNLOAD = "/router/v1/site/nodes/unload"
JSON_BODY = {"Content-Type": "application/json"}
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("unload"),
        [text_model("plain"), text_model("other")],
        {"s": [text_model("notes"), text_model("slow", output_ms_per_token=100)]},
    )
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def master(cluster: Cluster) -> Iterator[httpx.Client]:
    with cluster.master.client() as client:
        yield client


def state(client: httpx.Client, node_id: str | None = None) -> dict[str, Any]:
    params = {"node_id": node_id} if node_id else {}
    resp = client.get("/router/v1/site/nodes/state", params=params)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def text_row(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The model loaded on the node's text runtime, as the Nodes page shows it."""
    backend = next(b for b in doc["backends"] if b["id"] == "text-runtime")
    rows: list[dict[str, Any]] = backend["loaded_models"]
    assert len(rows) <= 1
    return rows[0] if rows else None


def load(client: httpx.Client, model: str) -> None:
    resp = client.post("/router/v1/load", json={"model": model})
    assert resp.status_code == 200, resp.text


def unload_body(node_id: Any, generation: Any, **overrides: Any) -> dict[str, Any]:
    body = {
        "node_id": node_id,
        "backend_id": "text-runtime",
        "runtime_id": "text",
        "expected_generation": generation,
    }
    body.update(overrides)
    return body


def test_a_local_runtime_is_unloaded_with_the_generation_the_page_showed(
    master: httpx.Client,
) -> None:
    load(master, "plain")
    row = text_row(state(master))
    assert row is not None and row["model_id"] == "plain"
    assert (row["lane"], row["runtime_id"], row["borrowed"], row["active"]) == (
        "text",
        "text",
        False,
        0,
    )

    resp = master.post(UNLOAD, json=unload_body("master", row["generation"]))
    assert resp.status_code == 200, resp.text
    # The answer is the node's fresh state: the runtime is empty already.
    assert resp.json()["node_id"] == "master"
    assert text_row(resp.json()) is None
    assert text_row(state(master)) is None
    models = master.get("/router/v1/models").json()["models"]
    assert not next(m for m in models if m["local_id"] == "plain" and m["node_id"] == "master")[
        "loaded"
    ]


def test_a_stale_generation_is_refused_and_nothing_is_unloaded(master: httpx.Client) -> None:
    load(master, "plain")
    seen = text_row(state(master))
    assert seen is not None
    # Someone else switches the runtime after the page drew it.
    load(master, "other")
    now = text_row(state(master))
    assert now is not None and now["generation"] == seen["generation"] + 1

    resp = master.post(UNLOAD, json=unload_body("master", seen["generation"]))
    assert resp.status_code == 409
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("stale_generation", "expected_generation")
    assert f'"other" at generation {now["generation"]}' in error["message"]
    assert text_row(state(master)) == now

    # The generation stays put on unload: once empty, that generation is stale too.
    assert master.post(UNLOAD, json=unload_body("master", now["generation"])).status_code == 200
    again = master.post(UNLOAD, json=unload_body("master", now["generation"]))
    assert again.status_code == 409
    assert "has nothing loaded now" in again.json()["error"]["message"]


def test_a_slaves_runtime_is_unloaded_through_the_master(
    cluster: Cluster, master: httpx.Client
) -> None:
    load(master, "notes")
    row = text_row(state(master, "s"))
    assert row is not None and row["model_id"] == "notes"

    stale = master.post(UNLOAD, json=unload_body("s", row["generation"] + 1))
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "stale_generation"
    assert 'node "s" has "notes"' in stale.json()["error"]["message"]
    assert text_row(state(master, "s")) == row

    resp = master.post(UNLOAD, json=unload_body("s", row["generation"]))
    assert resp.status_code == 200, resp.text
    assert resp.json()["node_id"] == "s" and text_row(resp.json()) is None
    with cluster.slaves["s"].client() as slave:
        # Unloaded on the slave itself, not only in the master's view.
        assert text_row(slave.get("/router/v1/node/state", headers=AUTH).json()) is None
        # The slave has no site routes of its own.
        assert slave.post(UNLOAD, json=unload_body("s", 1)).status_code == 404
        # A master that has the wrong node at this URL unloads nothing there.
        load(master, "notes")
        row = text_row(state(master, "s"))
        assert row is not None
        wrong = slave.post(
            "/router/v1/node/state/unload",
            json=unload_body("elsewhere", row["generation"]),
            headers=AUTH,
        )
        assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "wrong_node")
        assert text_row(state(master, "s")) == row


def test_unload_lets_borrowed_work_finish_and_the_page_marks_it_meanwhile(
    cluster: Cluster, master: httpx.Client
) -> None:
    load(master, "slow")
    results: list[httpx.Response] = []

    def borrowed() -> None:
        # What the master's relay sends a helper: a request lent to it, on the node protocol.
        headers = {**AUTH, "X-Tensors-Offload": "1"}
        body = {"model": "slow", "messages": [{"role": "user", "content": "x"}], "max_tokens": 20}
        with cluster.slaves["s"].client(timeout=60) as slave:
            results.append(
                slave.post(
                    "/router/v1/node/inference/v1/chat/completions", json=body, headers=headers
                )
            )

    runner = threading.Thread(target=borrowed)
    runner.start()
    try:
        # Marked borrowed when admitted, active once in the backend: wait for both.
        row = wait_for(
            lambda: (r := text_row(state(master, "s"))) and r["borrowed"] and r["active"] and r
        )
        assert row["model_id"] == "slow" and row["active"] == 1
        resp = master.post(UNLOAD, json=unload_body("s", row["generation"]))
    finally:
        runner.join(60)
    assert resp.status_code == 200, resp.text
    assert text_row(resp.json()) is None
    # The borrowed request ran to its end: 20 tokens at 100 ms each, not cut off by the unload.
    assert [r.status_code for r in results] == [200]
    answer = results[0].json()
    assert answer["usage"]["completion_tokens"] == 20
    assert answer["choices"][0]["finish_reason"] == "length"


def test_bad_bodies_are_refused_naming_the_field_and_change_nothing(
    master: httpx.Client,
) -> None:
    load(master, "plain")
    row = text_row(state(master))
    assert row is not None
    generation = row["generation"]
    cases: list[tuple[Any, int, str | None]] = [
        (
            {"backend_id": "text-runtime", "runtime_id": "text", "expected_generation": 1},
            400,
            "node_id",
        ),
        (unload_body(5, generation), 400, "node_id"),
        (unload_body("master", generation, backend_id=""), 400, "backend_id"),
        (unload_body("master", generation, runtime_id=["text"]), 400, "runtime_id"),
        (unload_body("master", None), 400, "expected_generation"),
        (unload_body("master", str(generation)), 400, "expected_generation"),
        (unload_body("master", True), 400, "expected_generation"),
        (unload_body("master", float(generation)), 400, "expected_generation"),
        (unload_body("master", -1), 400, "expected_generation"),
        (unload_body("master", generation, backend_id="gpu-runtime"), 400, "backend_id"),
        (unload_body("master", generation, runtime_id="image"), 400, "runtime_id"),
        (unload_body("s", generation, backend_id="gpu-runtime"), 400, "backend_id"),
        (unload_body("nowhere", generation), 404, "node_id"),
    ]
    for body, status, param in cases:
        resp = master.post(UNLOAD, json=body)
        assert resp.status_code == status, (body, resp.text)
        assert resp.json()["error"].get("param") == param, (body, resp.text)
    unknown = master.post(UNLOAD, json=unload_body("master", generation, backend_id="gpu-runtime"))
    assert "text-runtime" in unknown.json()["error"]["message"]  # says what there is
    assert master.post(UNLOAD, content=b"{", headers=JSON_BODY).status_code == 400
    # A management write's body must say it is JSON (the front door's rule).
    assert master.post(UNLOAD, content=b"{").status_code == 415
    assert master.post(UNLOAD, json=[1]).status_code == 400
    assert master.get(UNLOAD).status_code == 404
    assert text_row(state(master)) == row
