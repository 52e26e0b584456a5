"""A real cluster on loopback: registration, health, identity, forwarding, STT, node auth."""

from __future__ import annotations

import io
import struct
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import (
    CLUSTER_TOKEN,
    Cluster,
    ModelSpec,
    free_port,
    sim_weights,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


# A held request's output: at 1 ms a token, longer than any loaded machine needs for the
# requests sent while it holds; the test closes it as soon as they are answered.
HOLD_TOKENS = 30_000


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def shared(name: str, *, load_ms: int = 50) -> ModelSpec:
    # Same weights content and settings on every node → identical hashes → replicas.
    spec = text_model(name, load_ms=load_ms, base_ms=5, output_ms_per_token=1)
    # Room for a request that holds its replica busy for up to HOLD_TOKENS ms.
    spec.kcpps["contextsize"] = HOLD_TOKENS + 1024
    return spec


def painter(ms_per_step: int) -> ModelSpec:
    # Different weights on each node: one image ID, two models, the second one suffixed.
    return ModelSpec(
        "paint", {}, {"sdmodel": sim_weights(base_ms=5, image_ms_per_megapixel_step=ms_per_step)}
    )


def voice(name: str) -> ModelSpec:
    return ModelSpec(name, {}, {"whispermodel": sim_weights(base_ms=5)})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    c = start_cluster(
        root,
        [shared("twin"), text_model("clash", output_ms_per_token=1), painter(1)],
        {
            "s1": [
                shared("twin"),
                text_model("solo1"),
                text_model("clash", output_ms_per_token=2),
                painter(2),
            ],
            "s2": [
                shared("twin"),
                text_model("slow2", output_ms_per_token=100),
                text_model("clash", output_ms_per_token=3),
                voice("ears"),
            ],
        },
    )
    try:
        yield c
    finally:
        c.cleanup()


def records(c: Cluster) -> list[dict[str, Any]]:
    with c.master.client() as client:
        return client.get("/router/v1/models").json()["models"]


def analytics(node: Any) -> list[dict[str, Any]]:
    with node.client() as client:
        return client.get("/router/v1/site/analytics").json()["records"]


def identities(recs: list[dict[str, Any]]) -> set[tuple[str, ...]]:
    """What a refused snapshot must not change (runtime flags like `loaded` move on their own)."""
    return {
        (r["node_id"], r["local_id"], r["public_id"], r["model_hash"], r["config_hash"])
        for r in recs
    }


def test_slaves_register_and_their_models_appear_on_the_master(cluster: Cluster) -> None:
    recs = records(cluster)
    by_node = {(r["node_id"], r["local_id"]) for r in recs}
    assert {("s1", "solo1"), ("s2", "slow2"), ("master", "twin")} <= by_node
    solo = next(r for r in recs if r["local_id"] == "solo1")
    assert solo["source"] == "slave" and solo["available"] is True
    assert solo["model_hash"] and solo["config_hash"]
    with cluster.master.client() as client:
        ids = {m["id"] for m in client.get("/v1/models").json()["data"]}
    assert {"twin", "solo1", "slow2"} <= ids


def test_identical_models_are_replicas_and_conflicts_get_stable_suffixes(cluster: Cluster) -> None:
    recs = records(cluster)
    twins = [r for r in recs if r["local_id"] == "twin"]
    assert {r["public_id"] for r in twins} == {"twin"} and len(twins) == 3
    clash = {r["node_id"]: r["public_id"] for r in recs if r["local_id"] == "clash"}
    assert clash == {"master": "clash", "s1": "clash-2", "s2": "clash-3"}


def test_the_master_forwards_and_rewrites_ids_both_ways(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.post("/v1/chat/completions", json=chat("clash-3", max_tokens=3))
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == "clash-3"
        with client.stream("POST", "/v1/chat/completions", json=chat("clash-2", stream=True)) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
        assert lines and all('"model":"clash-2"' in ln for ln in lines)
        resp = client.post(
            "/api/chat",
            json={
                "model": "clash-2",
                "messages": [{"role": "user", "content": "x"}],
                "stream": False,
            },
        )
        assert resp.status_code == 200 and resp.json()["model"] == "clash-2"
        with client.stream("POST", "/api/generate", json={"model": "clash-3", "prompt": "x"}) as r:
            recs = [httpx.Response(200, content=ln).json() for ln in r.iter_lines() if ln]
        assert recs[-1]["done"] and all(rec["model"] == "clash-3" for rec in recs)
        resp = client.post("/api/embed", json={"model": "clash-2", "input": ["x", "y"]})
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == "clash-2" and len(resp.json()["embeddings"]) == 2


def served_by(c: Cluster, ids: list[str]) -> list[str]:
    """The node whose backend answered each request (by X-Request-Id), from every node's own
    analytics table; waits for the rows each recorder writes a moment after the answer."""
    nodes = {"master": c.master, **c.slaves}

    def where() -> dict[str, str] | None:
        found = {
            request_id: name
            for name, node in nodes.items()
            for (request_id,) in node.query("SELECT request_id FROM analytics_requests")
            if request_id in ids
        }
        return found if len(found) == len(ids) else None

    found = wait_for(where, timeout=20, interval=0.2)
    return [found[i] for i in ids]


def master_runtime_active(c: Cluster) -> int:
    with c.master.client() as client:
        state = client.get("/router/v1/site/nodes/state").json()
    return int(state["active_requests"].count("twin"))


def test_replicas_rotate_idle_local_first(cluster: Cluster) -> None:
    def ask(request_id: str, max_tokens: int = 3) -> int:
        with cluster.master.client() as client:
            resp = client.post(
                "/v1/chat/completions",
                json=chat("twin", max_tokens=max_tokens),
                headers={"X-Request-Id": request_id},
            )
        return resp.status_code

    # Sequential requests find the local replica idle every time.
    idle = [f"rotate-idle-{i}" for i in range(4)]
    assert [ask(i) for i in idle] == [200] * 4
    assert served_by(cluster, idle) == ["master"] * 4

    # With the local replica busy, the replicas of the other nodes take turns.
    held = chat("twin", max_tokens=HOLD_TOKENS, stream=True)
    with (
        cluster.master.client() as client,
        client.stream("POST", "/v1/chat/completions", json=held) as hold,
    ):
        assert hold.status_code == 200
        wait_for(lambda: master_runtime_active(cluster) == 1, timeout=20)
        busy = [f"rotate-busy-{i}" for i in range(4)]
        assert [ask(i) for i in busy] == [200] * 4
        assert master_runtime_active(cluster) == 1, "the held request ended too soon"
    # The client hung up: the router stops the held request and frees its replica.
    wait_for(lambda: master_runtime_active(cluster) == 0, timeout=20)
    first, second = served_by(cluster, busy[:2])
    assert {first, second} == {"s1", "s2"}
    assert served_by(cluster, busy) == [first, second, first, second]

    # Idle again, the local replica is first again.
    assert ask("rotate-idle-again") == 200
    assert served_by(cluster, ["rotate-idle-again"]) == ["master"]


def test_explicit_load_is_routed_to_the_owning_node(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.post("/router/v1/load", json={"model": "solo1"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["node_id"] == "s1"
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "s1"}).json()
        loaded = [m["model_id"] for b in state["backends"] for m in b["loaded_models"]]
        assert "solo1" in loaded
        assert (
            client.get("/router/v1/site/nodes/state", params={"node_id": "nope"}).status_code == 404
        )


def test_every_node_route_needs_the_token(cluster: Cluster) -> None:
    paths = [
        ("POST", "/router/v1/node/register"),
        ("GET", "/router/v1/node/models"),
        ("GET", "/router/v1/node/runtime-status"),
        ("POST", "/router/v1/node/load"),
        ("POST", "/router/v1/node/unload"),
        ("GET", "/router/v1/node/state"),
        ("POST", "/router/v1/node/inference/v1/chat/completions"),
    ]
    for node in cluster.nodes():
        with node.client() as client:
            for method, path in paths:
                assert client.request(method, path).status_code == 401, path
                bad = {"Authorization": "Bearer wrong"}
                assert client.request(method, path, headers=bad).status_code == 401, path
            assert client.get("/router/v1/node/runtime-status", headers=AUTH).status_code == 200


def test_site_routes_do_not_exist_on_a_slave(cluster: Cluster) -> None:
    with cluster.slaves["s1"].client() as client:
        assert client.get("/router/v1/site/nodes/state").status_code == 404
        # The slave still serves its own models to a client that calls it directly.
        assert client.post("/v1/chat/completions", json=chat("solo1")).status_code == 200


def test_registration_from_an_unlisted_url_is_refused_naming_it(cluster: Cluster) -> None:
    snapshot = {
        "node_id": "intruder",
        "node_url": "http://127.0.0.1:9",
        "models": [],
        "protocol_version": 2,
    }
    with cluster.master.client() as client:
        resp = client.post("/router/v1/node/register", json=snapshot, headers=AUTH)
        assert resp.status_code == 400
        assert "http://127.0.0.1:9" in resp.json()["error"]["message"]
        before = records(cluster)
        # A node id already held under another URL is a duplicate; nothing changes.
        dup = {**snapshot, "node_id": "s1", "node_url": cluster.slaves["s2"].base_url}
        resp = client.post("/router/v1/node/register", json=dup, headers=AUTH)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "duplicate_node"
        old = {
            **snapshot,
            "node_id": "s2",
            "node_url": cluster.slaves["s2"].base_url,
            "protocol_version": 1,
        }
        resp = client.post("/router/v1/node/register", json=old, headers=AUTH)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "incompatible_protocol"
        bad = {
            **snapshot,
            "node_id": "s2",
            "node_url": cluster.slaves["s2"].base_url,
            "models": [{"local_id": 5}],
        }
        assert client.post("/router/v1/node/register", json=bad, headers=AUTH).status_code == 400
        assert (
            client.post("/router/v1/node/register", content=b"{", headers=AUTH).status_code == 400
        )
    assert identities(records(cluster)) == identities(before)


def _wav() -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(struct.pack("<h", 0) * 800)
    return buf.getvalue()


def test_selector_less_transcription_goes_to_a_capable_node(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.post(
            "/v1/audio/transcriptions", files={"file": ("a.wav", _wav(), "audio/wav")}
        )
        assert resp.status_code == 200, resp.text
        status = client.get(
            cluster.slaves["s2"].base_url + "/router/v1/node/runtime-status", headers=AUTH
        ).json()
        assert status["active_stt_model_id"] == "ears"


def test_a_slave_killed_mid_stream_gives_an_error_not_a_hang_and_comes_back(
    cluster: Cluster,
) -> None:
    with cluster.master.client() as client:
        with client.stream(
            "POST", "/v1/chat/completions", json=chat("slow2", stream=True, max_tokens=100)
        ) as r:
            it = r.iter_lines()
            first = next(ln for ln in it if ln.startswith("data: "))
            assert first
            cluster.slaves["s2"].kill()
            rest = list(it)
        assert not any(ln == "data: [DONE]" for ln in rest)
        assert any("error" in ln for ln in rest)
        wait_for(
            lambda: all(not r["available"] for r in records(cluster) if r["node_id"] == "s2"),
            timeout=10,
        )
        resp = client.post("/v1/chat/completions", json=chat("slow2"))
        assert resp.status_code == 503 and "not healthy" in resp.json()["error"]["message"]
    cluster.restart_slave("s2")
    cluster.wait_healthy("s2")
    with cluster.master.client() as client:
        assert (
            client.post("/v1/chat/completions", json=chat("slow2", max_tokens=1)).status_code == 200
        )
    recs = records(cluster)
    assert {r["public_id"] for r in recs if r["local_id"] == "clash" and r["node_id"] == "s2"} == {
        "clash-3"
    }


def test_a_slave_with_the_wrong_token_is_unhealthy(tmp_path: Path) -> None:
    c = start_cluster(
        tmp_path,
        [],
        {"good": [text_model("g")], "bad": [text_model("b")]},
        slave_tokens={"bad": "some-other-token-9876543210"},
    )
    try:
        with c.master.client() as client:
            state = client.get("/router/v1/site/nodes/state").json()
            ids = {n["node_id"] for n in state["cluster"]["nodes"]}
            assert "bad" not in ids  # never accepted: its registration carried the wrong token
            assert client.post("/v1/chat/completions", json=chat("g")).status_code == 200
            assert client.post("/v1/chat/completions", json=chat("b")).status_code == 404
    finally:
        c.cleanup()


def test_a_routing_only_master_serves_everything_remotely(tmp_path: Path) -> None:
    c = start_cluster(
        tmp_path,
        [],
        {"w1": [text_model("m")]},
        master_sections={"backend": {"mode": "llama_sdcpp"}},
    )
    try:
        with c.master.client() as client:
            resp = client.post("/v1/chat/completions", json=chat("m"))
            assert resp.status_code == 200 and resp.json()["model"] == "m"
            state = client.get("/router/v1/site/nodes/state").json()
            assert all(not b["loaded_models"] for b in state["backends"])
    finally:
        c.cleanup()


def test_suffixes_survive_a_master_restart_and_a_new_node_joining(tmp_path: Path) -> None:
    spare = free_port()
    c = start_cluster(
        tmp_path,
        [text_model("x", output_ms_per_token=1)],
        {"zz": [text_model("x", output_ms_per_token=2)]},
        extra_slave_urls=[f"http://127.0.0.1:{spare}"],
    )
    try:
        assert {r["node_id"]: r["public_id"] for r in records(c) if r["local_id"] == "x"} == {
            "master": "x",
            "zz": "x-2",
        }
        # A node whose id sorts first joins with a third identity: zz keeps x-2.
        aa = start_node(
            tmp_path / "aa",
            [text_model("x", output_ms_per_token=3)],
            port=spare,
            cluster={
                "role": "slave",
                "node_id": "aa",
                "token": CLUSTER_TOKEN,
                "public_url": f"http://127.0.0.1:{spare}",
                "master_url": c.master.base_url,
                "sync_interval": "1s",
            },
        )
        c.slaves["aa"] = aa
        c.wait_healthy("aa", "zz")
        assert {r["node_id"]: r["public_id"] for r in records(c) if r["local_id"] == "x"} == {
            "master": "x",
            "zz": "x-2",
            "aa": "x-3",
        }
        # The master restarts and hears from aa first: the stored assignments still hold.
        zz = c.slaves.pop("zz")
        zz.stop()
        # Out of the cluster, so its cleanup (and its PostgreSQL database's drop) is here.
        zz.cleanup()
        c.restart_master()
        c.wait_healthy("aa")
        assert {r["node_id"]: r["public_id"] for r in records(c) if r["local_id"] == "x"} == {
            "master": "x",
            "aa": "x-3",
        }
    finally:
        c.cleanup()


def test_standalone_node_routes_answer_401_cluster_token_required(tmp_path: Path) -> None:
    node = start_node(tmp_path, [text_model("m")])
    try:
        with node.client() as client:
            resp = client.get("/router/v1/node/models", headers=AUTH)
            assert resp.status_code == 401
            assert resp.json()["error"]["message"] == "cluster token is required"
    finally:
        node.cleanup()


def test_a_split_recipe_routes_each_kind_to_its_components_node(tmp_path: Path) -> None:
    import json

    store = tmp_path / "master" / "store"
    store.mkdir(parents=True)
    recipe = {
        "id": "combo",
        "public_id": "combo",
        "text": {
            "kind": "text",
            "node_id": "w1",
            "model_id": "words",
            "config_filename": "words.kcpps",
        },
    }
    (store / "split-recipes.json").write_text(json.dumps({"recipes": [recipe]}))
    c = start_cluster(tmp_path, [], {"w1": [text_model("words")]})
    try:
        with c.master.client() as client:
            resp = client.post("/v1/chat/completions", json=chat("combo"))
            assert resp.status_code == 200 and resp.json()["model"] == "combo"
            c.slaves["w1"].kill()
            wait_for(
                lambda: client.post("/v1/chat/completions", json=chat("combo")).status_code == 503,
                timeout=15,
            )
    finally:
        c.cleanup()


def test_an_image_request_names_the_serving_nodes_model_wherever_the_client_put_it(
    cluster: Cluster,
) -> None:
    recs = [r for r in records(cluster) if r["local_id"] == "paint"]
    by_node = {r["node_id"]: (r["public_image_id"], r["image_id"]) for r in recs}
    public, local = by_node["s1"]
    assert public != local and by_node["master"][0] == local
    body = {
        "prompt": "a cat",
        "width": 64,
        "height": 64,
        "steps": 1,
        "sd_model_checkpoint": f" {public} ",
        "override_settings": {"sd_model_checkpoint": public, "CLIP_stop_at_last_layers": 2},
    }
    with cluster.master.client() as client:
        # Forge clients name the checkpoint, not `model`; sd-server clients may use the header.
        resp = client.post("/sdapi/v1/txt2img", json=body, headers={"X-Tensors-Model": public})
        assert resp.status_code == 200, resp.text
        assert resp.json()["images"]
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "s1"}).json()
    backend = next(b for b in state["backends"] if b["id"] == "image-runtime")
    seen = httpx.get(backend["base_url"] + "/sim/stats").json()["requests"][-1]
    assert seen["model"] == local
    assert seen["checkpoint"] == local
    assert seen["header_model"] == local
