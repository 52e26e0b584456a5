"""Portable configs and peer transfers on real nodes: export, copy, resolve, verify, resume."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import (
    CLUSTER_TOKEN,
    Cluster,
    ModelSpec,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
SITE = "/router/v1/site/model-assets"
MIB = 1024 * 1024


def padded_weights(path: Path, size: int) -> str:
    """Simulated weights of exactly `size` bytes (JSON allows trailing blanks); its sha256."""
    text = json.dumps({"load_ms": 20, "base_ms": 5, "output_ms_per_token": 1})
    data = text.encode() + b" " * (size - len(text))
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def start(tmp_path: Path, size: int, *, rate: int = 0) -> tuple[Cluster, str, Path]:
    """A master holding `chat` (weights of `size` bytes); slave s1 starts in `install_portable`."""
    weights = tmp_path / "weights-master" / "chat.sim.json"
    weights.parent.mkdir()
    digest = padded_weights(weights, size)
    config = {"backend_mode": "sim", "contextsize": 4096, "model_param": str(weights)}
    # The master's store is written before it starts, so it starts once with `chat` in it.
    kcpps = tmp_path / "master" / "store" / "kcpps"
    kcpps.mkdir(parents=True)
    (kcpps / "chat.kcpps").write_text(json.dumps(config))
    cluster = start_cluster(
        tmp_path,
        [],
        {"s1": []},
        master_sections={"models": {"asset_serve_rate": rate}} if rate else None,
        deferred=("s1",),
    )
    return cluster, digest, weights


@pytest.fixture
def cleanup() -> Iterator[list[Cluster]]:
    clusters: list[Cluster] = []
    yield clusters
    for cluster in clusters:
        cluster.cleanup()


def export(cluster: Cluster, model: str = "chat") -> dict[str, Any]:
    with cluster.master.client() as client:
        answer = client.post(f"{SITE}/export", json={"id": model})
    assert answer.status_code == 200, answer.text
    config: dict[str, Any] = answer.json()["config"]
    return config


def install_portable(cluster: Cluster, configs: dict[str, dict[str, Any]]) -> None:
    """Put the copied configs in s1's store, then start s1 (deferred by `start`)."""
    kcpps = cluster.root / "s1" / "store" / "kcpps"
    kcpps.mkdir(parents=True)
    for name, config in configs.items():
        (kcpps / f"{name}.kcpps").write_text(json.dumps(config))
    cluster.start_slave("s1")
    cluster.wait_healthy("s1")


def slave_status(cluster: Cluster) -> dict[str, Any]:
    with cluster.master.client() as client:
        answer = client.get(f"{SITE}/jobs", params={"node_id": "s1"})
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


def served_streams(cluster: Cluster) -> int:
    with cluster.master.client() as client:
        streams: int = client.get(f"{SITE}/jobs").json()["served"]["streams"]
    return streams


def shared_file(cluster: Cluster, digest: str, name: str) -> Path:
    store = cluster.slaves["s1"].store
    return store / "model-assets" / "sha256" / digest[:2] / digest / name


def record(cluster: Cluster, model: str) -> dict[str, Any]:
    with cluster.master.client() as client:
        records = client.get("/router/v1/models").json()["models"]
    found: dict[str, Any] = next(r for r in records if r["public_id"] == model)
    return found


def test_a_copied_portable_config_waits_for_the_peer_transfer_then_answers(
    tmp_path: Path, cleanup: list[Cluster]
) -> None:
    cluster, digest, weights = start(tmp_path, 3 * MIB + 17)
    cleanup.append(cluster)
    config = export(cluster)
    assert config["model_param_hash"] == digest
    assert config["model_param_filename"] == "chat.sim.json"
    assert "model_param" not in config and str(weights) not in json.dumps(config)

    install_portable(cluster, {"chat-copy": config})
    before = wait_for(lambda: record(cluster, "chat-copy"))
    assert before["asset_state"] == "unresolved"
    assert before["unresolved_fields"] == ["model_param"]
    # Same weights and settings as its origin: the same identity, whatever the path.
    assert before["config_hash"] == record(cluster, "chat")["config_hash"]
    assert before["model_hash"] == record(cluster, "chat")["model_hash"]

    with cluster.master.client() as client:
        refused = client.post("/router/v1/load", json={"model": "chat-copy"})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "model_assets_unresolved"
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "s1"}).json()
        assert all(not b["loaded_models"] for b in state["backends"])
        assert served_streams(cluster) == 0

        answer = client.post(
            "/v1/chat/completions",
            json={"model": "chat-copy", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "chat-copy"

    target = shared_file(cluster, digest, "chat.sim.json")
    assert target.read_bytes() == weights.read_bytes()
    assert not target.with_name("chat.sim.json.partial").exists()
    # The copied file stays portable; the node runs a copy that names the local file.
    assert "model_param" not in json.loads(
        (cluster.slaves["s1"].store / "kcpps" / "chat-copy.kcpps").read_text()
    )
    resolved = json.loads(
        (cluster.slaves["s1"].store / "resolved-kcpps" / "chat-copy.kcpps").read_text()
    )
    assert resolved["model_param"] == str(target) and "model_param_hash" not in resolved
    (job,) = slave_status(cluster)["jobs"]
    assert job["state"] == "done" and job["model_id"] == "chat-copy"
    (result,) = job["fields"]
    assert result["resolved"] and result["source"] == "peer_sha256"
    assert result["transfer"]["bytes_done"] == result["transfer"]["bytes_total"] == 3 * MIB + 17
    assert served_streams(cluster) == 1
    # The copy was hashed as it arrived; the hash cache has it, so nothing reads it again.
    cache = json.loads((cluster.slaves["s1"].store / "hash-cache.json").read_text())
    assert cache["entries"][str(target)]["sha256"] == digest
    with cluster.master.client() as client:
        both = {cluster.master.base_url, cluster.slaves["s1"].base_url}

        def holders() -> bool:
            # The master's answer for this hash is cached for 5 s from the slave's lookup.
            found = client.get(f"{SITE}/{digest}").json()["assets"]
            return {h["node_url"] for h in found} == both

        wait_for(holders, timeout=15, interval=0.25)
        only = client.get(f"{SITE}/{digest}", params={"node_id": "s1"}).json()["assets"]
        assert [h["node_url"] for h in only] == [cluster.slaves["s1"].base_url]
        assert client.get(f"{SITE}/{digest.upper()}").status_code == 400
    after = wait_for(lambda: (r := record(cluster, "chat-copy")) and "asset_state" not in r and r)
    assert "unresolved_fields" not in after


def test_eight_concurrent_resolvers_of_one_hash_cause_one_stream(
    tmp_path: Path, cleanup: list[Cluster]
) -> None:
    # Paced so the eight resolutions overlap the one transfer.
    cluster, digest, _ = start(tmp_path, 4 * MIB, rate=8 * MIB)
    cleanup.append(cluster)
    config = export(cluster)
    names = [f"copy-{i}" for i in range(8)]
    install_portable(cluster, dict.fromkeys(names, config))

    barrier = threading.Barrier(8)
    answers: list[httpx.Response] = []

    def resolve(name: str) -> None:
        with cluster.master.client() as client:
            barrier.wait()
            answers.append(
                client.post(f"{SITE}/resolve", json={"node_id": "s1", "id": name, "wait": True})
            )

    threads = [threading.Thread(target=resolve, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    assert all(a.json()["state"] == "done" for a in answers)
    assert served_streams(cluster) == 1
    assert shared_file(cluster, digest, "chat.sim.json").stat().st_size == 4 * MIB


def test_a_transfer_killed_half_way_resumes_from_the_partial_file_and_verifies(
    tmp_path: Path, cleanup: list[Cluster]
) -> None:
    size = 12 * MIB + 5
    cluster, digest, weights = start(tmp_path, size, rate=4 * MIB)
    cleanup.append(cluster)
    install_portable(cluster, {"chat-copy": export(cluster)})
    with cluster.master.client() as client:
        started = client.post(f"{SITE}/resolve", json={"node_id": "s1", "id": "chat-copy"})
    assert started.status_code == 200, started.text

    def halfway() -> bool:
        transfers = slave_status(cluster)["transfers"]
        return bool(transfers) and 2 * MIB <= transfers[0]["bytes_done"] < size

    wait_for(halfway, timeout=30)
    # The Nodes page shows it from the node's state.
    with cluster.master.client() as client:
        state = client.get("/router/v1/site/nodes/state", params={"node_id": "s1"}).json()
    (shown,) = state["asset_transfers"]
    assert shown["state"] == "running" and shown["sha256"] == digest
    assert 0 < shown["bytes_done"] < shown["bytes_total"] == size
    cluster.slaves["s1"].kill()
    partial = shared_file(cluster, digest, "chat.sim.json.partial")
    kept = partial.stat().st_size
    assert 0 < kept < size

    cluster.restart_slave("s1")
    cluster.wait_healthy("s1")
    with cluster.master.client() as client:
        done = client.post(
            f"{SITE}/resolve", json={"node_id": "s1", "id": "chat-copy", "wait": True}
        )
    assert done.status_code == 200, done.text
    (result,) = done.json()["fields"]
    assert done.json()["state"] == "done", done.text
    assert result["transfer"]["resumed_from"] == kept
    assert shared_file(cluster, digest, "chat.sim.json").read_bytes() == weights.read_bytes()
    assert not partial.exists()
    assert served_streams(cluster) == 2


def test_a_corrupted_source_is_refused_and_nothing_is_left_behind(
    tmp_path: Path, cleanup: list[Cluster]
) -> None:
    cluster, digest, weights = start(tmp_path, 2 * MIB)
    cleanup.append(cluster)
    install_portable(cluster, {"chat-copy": export(cluster)})
    # Same size and time stamp, other bytes: the source's hash cache still vouches for it,
    # so only the receiver's own check can catch it.
    info = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1:] = b"\n"
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(info.st_atime_ns, info.st_mtime_ns))

    with cluster.master.client() as client:
        done = client.post(
            f"{SITE}/resolve", json={"node_id": "s1", "id": "chat-copy", "wait": True}
        )
        assert done.status_code == 200, done.text
        assert done.json()["state"] == "failed"
        assert "not " + digest in done.json()["error"]
        answer = client.post(
            "/v1/chat/completions",
            json={"model": "chat-copy", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "model_assets_unresolved"
    directory = shared_file(cluster, digest, "x").parent
    assert list(directory.iterdir()) == []
    failed = wait_for(lambda: (r := record(cluster, "chat-copy"))["asset_state"] == "failed" and r)
    assert "not " + digest in failed["asset_error"]


def test_a_symlink_in_the_shared_dir_and_bad_targets_are_refused(
    tmp_path: Path, cleanup: list[Cluster]
) -> None:
    cluster, digest, _ = start(tmp_path, MIB)
    cleanup.append(cluster)
    install_portable(cluster, {"chat-copy": export(cluster)})
    outside = tmp_path / "outside"
    outside.mkdir()
    link = shared_file(cluster, digest, "x").parent.parent
    link.parent.mkdir(parents=True)
    link.symlink_to(outside, target_is_directory=True)

    with cluster.master.client() as client:
        done = client.post(
            f"{SITE}/resolve", json={"node_id": "s1", "id": "chat-copy", "wait": True}
        )
        assert done.json()["state"] == "failed", done.text
        assert "symlink" in done.json()["error"]
        assert list(outside.iterdir()) == []

        for body, param in [
            ({"node_id": "nobody", "id": "chat-copy"}, "node_id"),
            ({"node_id": "s1", "node_url": "http://127.0.0.1:1", "id": "chat-copy"}, "node_url"),
            ({"node_id": "s1"}, "id"),
        ]:
            refused = client.post(f"{SITE}/resolve", json=body)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == param

    with httpx.Client(base_url=cluster.master.base_url, headers=AUTH) as node:
        assert node.get("/router/v1/node/assets/" + "AB" * 32).status_code == 400
        assert node.get("/router/v1/node/assets/" + "ab" * 32).status_code == 404
        bad = node.post("/router/v1/node/assets/lookup", json={"hashes": ["ab" * 32, "x"]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "hashes[1]"
        many = node.post("/router/v1/node/assets/lookup", json={"hashes": ["ab" * 32] * 257})
        assert many.status_code == 400 and many.json()["error"]["param"] == "hashes"
        two = node.get(f"/router/v1/node/assets/{digest}", headers={"Range": "bytes=0-1,4-5"})
        assert two.status_code == 416
        part = node.get(f"/router/v1/node/assets/{digest}", headers={"Range": "bytes=10-19"})
        assert part.status_code == 206
        assert part.headers["content-range"] == f"bytes 10-19/{MIB}"
        assert part.headers["x-content-type-options"] == "nosniff"
        assert len(part.content) == 10
    with httpx.Client(base_url=cluster.master.base_url) as anonymous:
        assert anonymous.get(f"/router/v1/node/assets/{digest}").status_code == 401


def test_a_remote_nodes_config_is_exported_through_the_node_route(
    tmp_path: Path, cleanup: list[Cluster]
) -> None:
    cluster = start_cluster(tmp_path, [], {"s1": [text_model("words")]})
    cleanup.append(cluster)
    weights = tmp_path / "s1" / "weights" / "words-model_param.sim.json"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    with cluster.master.client() as client:
        url = cluster.slaves["s1"].base_url
        answer = client.post(
            f"{SITE}/export", json={"node_id": "s1", "node_url": url, "id": "words"}
        )
        assert answer.status_code == 200, answer.text
        config = answer.json()["config"]
        assert config["model_param_hash"] == digest
        assert config["model_param_filename"] == weights.name
        assert "model_param" not in config
        wrong = client.post(
            f"{SITE}/export",
            json={"node_id": "s1", "node_url": "http://127.0.0.1:1", "id": "words"},
        )
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "node_url"
        missing = client.post(f"{SITE}/export", json={"node_id": "s1", "id": "nope"})
        assert missing.status_code == 404, missing.text


def test_a_file_below_file_roots_with_the_same_name_and_hash_is_used_in_place(
    tmp_path: Path,
) -> None:
    roots = tmp_path / "roots"
    (roots / "a").mkdir(parents=True)
    (roots / "b").mkdir()
    good = roots / "b" / "chat.sim.json"
    digest = padded_weights(good, 50_000)
    # Same name, other bytes: hashed and passed over.
    padded_weights(roots / "a" / "chat.sim.json", 40_000)
    # Same bytes, other name: never hashed (only matching names are).
    (roots / "a" / "renamed.sim.json").write_bytes(good.read_bytes())
    spec = ModelSpec(
        "chat",
        {"contextsize": 4096, "model_param_hash": digest, "model_param_filename": good.name},
    )
    node = start_node(tmp_path, [spec], models={"file_roots": [str(roots)]})
    try:
        with node.client() as client:
            answer = client.post(
                "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert answer.status_code == 200, answer.text
            (job,) = client.get(f"{SITE}/jobs").json()["jobs"]
        (result,) = job["fields"]
        assert result["source"] == "file_root_sha256" and result["transfer"] is None
        assert not (node.store / "model-assets" / "sha256").exists()
        cache = json.loads((node.store / "hash-cache.json").read_text())["entries"]
        assert str(good) in cache and str(roots / "a" / "chat.sim.json") in cache
        assert str(roots / "a" / "renamed.sim.json") not in cache
    finally:
        node.cleanup()
