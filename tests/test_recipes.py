"""Split recipes made through the API, on a master and two slaves: stored, routed, loaded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import Cluster, ModelSpec, sim_weights, start_cluster, text_model

pytestmark = pytest.mark.integration

COOK = "/router/v1/site/cook"


def picture_model(name: str) -> ModelSpec:
    return ModelSpec(name, {}, {"sdmodel": sim_weights(base_ms=5, image_ms_per_megapixel_step=1)})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("recipes")
    c = start_cluster(root, [], {"w1": [text_model("words")], "w2": [picture_model("pics")]})
    try:
        yield c
    finally:
        c.cleanup()


def body(recipe_id: str = "combo", **extra: Any) -> dict[str, Any]:
    return {
        "id": recipe_id,
        "components": [
            {"kind": "text", "node_id": "w1", "model_id": "words"},
            {"kind": "embeddings", "node_id": "w1", "model_id": "words"},
            {"kind": "image", "node_id": "w2", "model_id": "pics"},
        ],
        **extra,
    }


def loaded(cluster: Cluster, node_id: str) -> list[str]:
    with cluster.master.client() as client:
        state = client.get("/router/v1/site/nodes/state", params={"node_id": node_id}).json()
    return sorted(m["model_id"] for b in state["backends"] for m in b["loaded_models"])


def test_a_recipe_across_two_nodes_is_stored_routed_and_loaded(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        preview = client.post(f"{COOK}/preview", json=body())
        assert preview.status_code == 200, preview.text
        assert preview.json()["exists"] is False
        assert preview.json()["recipe"]["image"]["image_id"] == "pics-pics-sdmodel"
        store = cluster.master.store / "split-recipes.json"
        assert not store.exists()  # a preview stores nothing

        applied = client.post(f"{COOK}/apply", json=body(public_image_id="combo-image"))
        assert applied.status_code == 200, applied.text
        stored = json.loads(store.read_text())["recipes"]
        assert [r["id"] for r in stored] == ["combo"]
        assert stored[0]["text"]["config_filename"] == "words.kcpps"
        again = client.post(f"{COOK}/apply", json=body())
        assert again.status_code == 409 and again.json()["error"]["code"] == "recipe_exists"
        assert (
            client.post(
                f"{COOK}/apply", json=body(overwrite=True, public_image_id="combo-image")
            ).status_code
            == 200
        )

        chat = {"model": "combo", "messages": [{"role": "user", "content": "hi"}]}
        plain = client.post("/v1/chat/completions", json=chat)
        assert plain.status_code == 200 and plain.json()["model"] == "combo", plain.text
        with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as sse:
            events = [
                json.loads(line[6:])
                for line in sse.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"
            ]
        assert events and all(e["model"] == "combo" for e in events)
        with client.stream("POST", "/api/chat", json={**chat, "stream": True}) as ndjson:
            lines = [json.loads(line) for line in ndjson.iter_lines() if line]
        assert lines and all(line["model"] == "combo" for line in lines)
        image = client.post(
            "/v1/images/generations",
            json={"model": "combo-image", "prompt": "cat", "size": "64x64", "steps": 1},
        )
        assert image.status_code == 200, image.text
        assert loaded(cluster, "w2") == ["pics"]

        for node_id in ("w1", "w2"):
            client.post("/router/v1/unload", json={"model": "words" if node_id == "w1" else "pics"})
        assert loaded(cluster, "w1") == loaded(cluster, "w2") == []
        load = client.post("/router/v1/load", json={"model": "combo"})
        assert load.status_code == 200, load.text
        parts = {(c["kind"], c["node_id"], c["skipped"]) for c in load.json()["components"]}
        assert parts == {("text", "w1", False), ("embeddings", "w1", True), ("image", "w2", False)}
        assert loaded(cluster, "w1") == ["words"] and loaded(cluster, "w2") == ["pics"]

        gone = client.delete(f"{COOK}/combo")
        assert gone.status_code == 200
        assert json.loads(store.read_text())["recipes"] == []
        assert client.post("/v1/chat/completions", json=chat).status_code == 404
        assert client.delete(f"{COOK}/combo").status_code == 404


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"id": "../x"}, "id"),
        ({"components": []}, "components"),
        ({"components": [{"kind": "text", "node_id": "w1", "model_id": "words"}]}, "components"),
        (
            {"components": [{"kind": "tv", "node_id": "w1", "model_id": "words"}]},
            "components[0].kind",
        ),
        (
            {"components": [{"kind": "text", "node_id": "nobody", "model_id": "x"}]},
            "components[0].node_id",
        ),
        (
            {
                "components": [
                    {
                        "kind": "text",
                        "node_id": "w1",
                        "node_url": "http://127.0.0.1:9",
                        "model_id": "words",
                    }
                ]
            },
            "components[0].node_url",
        ),
        (
            {"components": [{"kind": "text", "node_id": "w1", "model_id": "nope"}]},
            "components[0].model_id",
        ),
        (
            {"components": [{"kind": "image", "node_id": "w1", "model_id": "words"}]},
            "components[0].model_id",
        ),
        ({"public_id": "words"}, "public_id"),
    ],
)
def test_a_bad_recipe_is_refused_naming_the_field_and_nothing_is_stored(
    cluster: Cluster, change: dict[str, Any], param: str
) -> None:
    with cluster.master.client() as client:
        answer = client.post(f"{COOK}/apply", json={**body("bad"), **change})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    store = cluster.master.store / "split-recipes.json"
    assert not store.exists() or all(
        r["id"] != "bad" for r in json.loads(store.read_text())["recipes"]
    )
