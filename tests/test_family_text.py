"""The text-lane families and the embeddings family, through a standalone node and a cluster.

Responses (created, streamed, followed by ID), Anthropic messages, rerank, the `/v1` catch-all,
Kobold's token stream and token count, music, and the embeddings paths, each on simulated
backends the router starts. The sim answers with `seen_model`, the model ID the request reached
it under, which the router never rewrites: a test sees both directions of the ID rewrite.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import (
    Cluster,
    ModelSpec,
    RouterNode,
    UpstreamServer,
    sim_weights,
    start_cluster,
    start_node,
    start_upstream,
    text_model,
)

pytestmark = pytest.mark.integration

SERVED_NAME = "Org/Served-7B"
EMBEDDING_PATHS = (
    "/v2/embed",
    "/api/extra/embeddings",
    "/rerank",
    "/v2/rerank",
    "/classify",
    "/score",
    "/v1/score",
    "/pooling",
)


def shared(name: str) -> ModelSpec:
    # Same weights and settings on every node: identical hashes, so replicas of one ID.
    return text_model(name, base_ms=5, output_ms_per_token=1)


def embedder(name: str) -> ModelSpec:
    return ModelSpec(name, {}, {"embeddingsmodel": sim_weights(base_ms=2)})


def events(resp: httpx.Response) -> list[dict[str, Any]]:
    return [
        json.loads(line[len("data:") :])
        for line in resp.text.splitlines()
        if line.startswith("data:") and line[len("data:") :].strip() not in ("", "[DONE]")
    ]


def create_response(client: httpx.Client, model: str, *, stream: bool = False) -> str:
    resp = client.post("/v1/responses", json={"model": model, "input": "hi", "stream": stream})
    assert resp.status_code == 200, resp.text
    if not stream:
        ident: str = resp.json()["id"]
        return ident
    assert resp.headers["content-type"].startswith("text/event-stream")
    created = events(resp)[0]
    assert created["type"] == "response.created"
    assert created["response"]["model"] == model
    ident = created["response"]["id"]
    return ident


def assert_unknown_response(resp: httpx.Response) -> None:
    assert resp.status_code == 404, resp.text
    error = resp.json()["error"]
    assert error["code"] == "response_not_found" and error["param"] == "response_id"


# -- a standalone node ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamServer]:
    server = start_upstream(tmp_path_factory.mktemp("up"), "served", "-a", SERVED_NAME)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def node(
    tmp_path_factory: pytest.TempPathFactory, upstream: UpstreamServer
) -> Iterator[RouterNode]:
    models = [
        text_model("chat"),
        embedder("emb"),
        # Served under another name: the router must rewrite it on the way in and out.
        ModelSpec(
            "renamed",
            {
                "backend_mode": "upstream",
                "upstream_url": upstream.url,
                "upstream_model": SERVED_NAME,
            },
        ),
    ]
    n = start_node(tmp_path_factory.mktemp("text-family"), models)
    try:
        yield n
    finally:
        n.cleanup()


def test_a_response_is_created_fetched_cancelled_and_deleted(node: RouterNode) -> None:
    with node.client() as client:
        ident = create_response(client, "chat")
        got = client.get(f"/v1/responses/{ident}")
        assert got.status_code == 200, got.text
        assert (got.json()["id"], got.json()["model"]) == (ident, "chat")
        cancelled = client.post(f"/v1/responses/{ident}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        deleted = client.delete(f"/v1/responses/{ident}")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        # Deleted: the router forgets the ID, so it answers without asking any backend.
        assert_unknown_response(client.get(f"/v1/responses/{ident}"))
        assert_unknown_response(client.delete(f"/v1/responses/{ident}"))


def test_unknown_response_ids_are_404_in_the_openai_envelope(node: RouterNode) -> None:
    with node.client() as client:
        assert_unknown_response(client.get("/v1/responses/resp-never"))
        assert_unknown_response(client.post("/v1/responses/resp-never/cancel"))


def test_a_streamed_response_is_remembered_from_its_created_event(node: RouterNode) -> None:
    with node.client() as client:
        ident = create_response(client, "chat", stream=True)
        got = client.get(f"/v1/responses/{ident}")
        assert got.status_code == 200 and got.json()["status"] == "completed"


def test_a_served_name_is_rewritten_both_ways_in_responses_and_messages(node: RouterNode) -> None:
    with node.client() as client:
        made = client.post("/v1/responses", json={"model": "renamed", "input": "hi"})
        assert made.status_code == 200, made.text
        assert (made.json()["model"], made.json()["seen_model"]) == ("renamed", SERVED_NAME)
        streamed = client.post(
            "/v1/responses", json={"model": "renamed", "input": "hi", "stream": True}
        )
        chunks = events(streamed)
        assert chunks[0]["response"]["model"] == "renamed"
        assert chunks[-1]["response"]["model"] == "renamed"
        assert SERVED_NAME not in streamed.text.replace(f'"seen_model":"{SERVED_NAME}"', "")
        got = client.get(f"/v1/responses/{made.json()['id']}")
        assert got.status_code == 200 and got.json()["model"] == "renamed"
        message = client.post(
            "/v1/messages",
            json={
                "model": "renamed",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        assert message.status_code == 200, message.text
        assert (message.json()["model"], message.json()["seen_model"]) == ("renamed", SERVED_NAME)
        opening = events(
            client.post(
                "/v1/messages",
                json={"model": "renamed", "stream": True, "messages": []},
            )
        )[0]
        assert opening["type"] == "message_start" and opening["message"]["model"] == "renamed"


def test_other_text_paths_go_to_the_named_models_backend(node: RouterNode) -> None:
    with node.client() as client:
        counted = client.post("/v1/messages/count_tokens", json={"model": "chat", "messages": []})
        assert counted.status_code == 200 and counted.json()["input_tokens"] >= 1
        tokens = client.post("/v1/responses/input_tokens", json={"model": "chat", "input": "x"})
        assert tokens.status_code == 200 and tokens.json()["model"] == "chat"
        for path in ("/v1/reranking", "/v1/sim/anything/at/all"):
            resp = client.post(path, json={"model": "chat", "query": "q", "documents": ["d"]})
            assert resp.status_code == 200, (path, resp.text)
            assert (resp.json()["path"], resp.json()["model"]) == (path, "chat")


def test_the_catch_all_refuses_what_it_cannot_route(node: RouterNode) -> None:
    with node.client() as client:
        missing = client.get("/v1/nothing/here")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "not_found"
        assert missing.json()["error"]["message"] == "endpoint not found"
        no_model = client.post("/v1/sim/x", json={"input": "x"})
        assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
        unknown = client.post("/v1/messages", json={"model": "nope"})
        assert unknown.status_code == 404
        # In Anthropic's envelope on its path, the router's code where its SDKs read one.
        assert unknown.json()["type"] == "error"
        assert unknown.json()["error"]["type"] == "not_found_error"
        assert unknown.json()["error"]["details"]["error_code"] == "model_not_found"
        broken = client.post(
            "/v1/responses", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert broken.status_code == 400
        wrong_method = client.put("/v1/responses/resp-x")
        assert wrong_method.status_code == 405


def test_the_embeddings_family_goes_to_the_embeddings_backend(node: RouterNode) -> None:
    with node.client() as client:
        for path in EMBEDDING_PATHS:
            resp = client.post(path, json={"model": "emb", "input": ["a"], "query": "q"})
            assert resp.status_code == 200, (path, resp.text)
            assert (resp.json()["path"], resp.json()["model"]) == (path, "emb")
        # Selector-less: the loaded embedding models take turns (which are loaded depends on
        # the tests before), the one chosen put in the body.
        answered = set()
        for _ in range(3):
            resp = client.post("/v2/embed", json={"texts": ["a"]})
            assert resp.status_code == 200, resp.text
            answered.add((resp.json()["model"], resp.json()["seen_model"]))
        assert answered and answered <= {
            ("emb", "emb"),
            ("chat", "chat"),
            ("renamed", SERVED_NAME),
        }


def test_v1_rerank_follows_the_model_it_names(node: RouterNode) -> None:
    with node.client() as client:
        # An embeddings-only model (no text replica) would be refused on the text lane.
        emb = client.post("/v1/rerank", json={"model": "emb", "query": "q", "documents": ["d"]})
        assert emb.status_code == 200, emb.text
        assert emb.json()["model"] == "emb"
        text = client.post("/v1/rerank", json={"model": "chat", "query": "q", "documents": ["d"]})
        assert text.status_code == 200 and text.json()["model"] == "chat"
        unnamed = client.post("/v1/rerank", json={"query": "q", "documents": ["d"]})
        assert unnamed.status_code == 200, unnamed.text


def test_kobold_streams_tokens_and_counts_them(node: RouterNode) -> None:
    with node.client() as client:
        body = {"model": "chat", "prompt": "once upon", "max_length": 3}
        resp = client.post("/api/extra/generate/stream", json=body)
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert "event: message" in resp.text
        tokens = events(resp)
        assert len(tokens) >= 3 and all("token" in t for t in tokens)
        assert "".join(t["token"] for t in tokens).strip()
        assert tokens[-1]["finish_reason"] in ("length", "stop")
        counted = client.post("/api/extra/tokencount", json={"model": "chat", "prompt": "a b c"})
        assert counted.status_code == 200, counted.text
        assert counted.json() == {"value": 3, "ids": [1, 2, 3]}
        bad = client.post("/api/extra/tokencount", json={"model": "chat", "prompt": 5})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_music_goes_to_the_named_or_the_loaded_text_model(node: RouterNode) -> None:
    with node.client() as client:
        page = client.get("/musicui", params={"model": "chat"})
        assert page.status_code == 200 and "sim music chat" in page.text
        api = client.post(
            "/api/extra/music/generate",
            json={"model": "chat", "prompt": "a tune"},
        )
        assert api.status_code == 200, api.text
        assert api.json()["path"] == "/api/extra/music/generate"
        queried = client.get("/api/extra/music/status", params={"model": "chat", "x": "1"})
        assert queried.status_code == 200 and queried.json()["query"] == "model=chat&x=1"
        header = client.get("/api/extra/music/status", headers={"X-Tensors-Model": "chat"})
        assert header.status_code == 200 and header.json()["method"] == "GET"
        # No model named: the text model loaded now serves it.
        assert client.post("/v1/chat/completions", json={"model": "chat", "messages": []})
        files = client.get("/musicui/assets/app.js")
        assert files.status_code == 200 and "/musicui/assets/app.js" in files.text


# -- a master and two slaves ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("text-cluster"),
        # The master holds no "twin": its replicas on s1 and s2 take turns.
        [text_model("clash", output_ms_per_token=1)],
        {
            "s1": [shared("twin"), text_model("clash", output_ms_per_token=2), embedder("emb")],
            "s2": [shared("twin"), text_model("clash", output_ms_per_token=3)],
        },
    )
    try:
        yield c
    finally:
        c.cleanup()


def test_response_ids_follow_the_replica_that_created_them(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        made = [create_response(client, "twin") for _ in range(2)]
        made.append(create_response(client, "twin", stream=True))
        # Rotation alone would send every other follow-up to the replica that never saw it.
        for ident in made:
            for _ in range(2):
                got = client.get(f"/v1/responses/{ident}")
                assert got.status_code == 200, got.text
                assert (got.json()["id"], got.json()["model"]) == (ident, "twin")
        # A response that continues another goes to the backend storing that one.
        for ident in made:
            for _ in range(2):
                body = {"model": "twin", "input": "more", "previous_response_id": ident}
                follow = client.post("/v1/responses", json=body)
                assert follow.status_code == 200, follow.text
        assert client.post(f"/v1/responses/{made[0]}/cancel").json()["status"] == "cancelled"
        for ident in made:
            deleted = client.delete(f"/v1/responses/{ident}")
            assert deleted.status_code == 200 and deleted.json()["deleted"] is True, deleted.text
            assert_unknown_response(client.get(f"/v1/responses/{ident}"))
        assert_unknown_response(client.get("/v1/responses/resp-never"))


def test_the_master_rewrites_ids_both_ways_on_every_family(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        made = client.post("/v1/responses", json={"model": "clash-2", "input": "hi"})
        assert made.status_code == 200, made.text
        assert (made.json()["model"], made.json()["seen_model"]) == ("clash-2", "clash")
        got = client.get(f"/v1/responses/{made.json()['id']}")
        assert got.status_code == 200 and got.json()["model"] == "clash-2"
        streamed = client.post(
            "/v1/responses", json={"model": "clash-3", "input": "hi", "stream": True}
        )
        chunks = events(streamed)
        assert chunks[0]["response"]["model"] == "clash-3"
        assert chunks[-1]["response"]["model"] == "clash-3"
        got = client.get(f"/v1/responses/{chunks[0]['response']['id']}")
        assert got.status_code == 200 and got.json()["model"] == "clash-3"
        opening = events(
            client.post("/v1/messages", json={"model": "clash-2", "stream": True, "messages": []})
        )[0]
        assert opening["message"]["model"] == "clash-2"
        assert opening["message"]["seen_model"] == "clash"
        for path in ("/v1/reranking", "/v1/sim/deep/path", "/v1/rerank"):
            resp = client.post(path, json={"model": "clash-3", "query": "q"})
            assert resp.status_code == 200, (path, resp.text)
            assert (resp.json()["model"], resp.json()["seen_model"]) == ("clash-3", "clash")
        for path in EMBEDDING_PATHS:
            resp = client.post(path, json={"model": "clash-2", "input": ["a"]})
            assert resp.status_code == 200, (path, resp.text)
            assert (resp.json()["path"], resp.json()["model"]) == (path, "clash-2")
            assert resp.json()["seen_model"] == "clash"
        emb = client.post("/v1/rerank", json={"model": "emb", "query": "q"})
        assert emb.status_code == 200 and emb.json()["path"] == "/v1/rerank"


def test_kobold_and_music_reach_a_slave(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.post(
            "/api/extra/generate/stream",
            json={"model": "clash-3", "prompt": "x", "max_length": 2},
        )
        assert resp.status_code == 200, resp.text
        assert [t["finish_reason"] for t in events(resp)][-1] in ("length", "stop")
        counted = client.post("/api/extra/tokencount", json={"model": "clash-2", "prompt": "a b"})
        assert counted.status_code == 200 and counted.json()["value"] == 2
        page = client.get("/musicui", params={"model": "clash-2"})
        assert page.status_code == 200 and "sim music clash" in page.text
        api = client.get("/api/extra/music/x", headers={"X-Tensors-Model": "clash-3"})
        assert api.status_code == 200 and api.json()["path"] == "/api/extra/music/x"
        # The query's selector reaches the slave under the slave's own model ID.
        queried = client.get("/api/extra/music/x", params={"model": "clash-2", "x": "1"})
        assert queried.status_code == 200, queried.text
        assert queried.json()["query"] == "model=clash&x=1"
