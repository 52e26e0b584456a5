"""The site inventory on real nodes: a standalone node, and a master asking its slaves."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import CLUSTER_TOKEN, Cluster, start_cluster, start_node, text_model

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
URL = "/router/v1/site/inventory"
NODE_KEYS = {
    "node_id",
    "node_url",
    "source",
    "role",
    "backend_mode",
    "available",
    "hardware",
    "models",
    "files",
    "error",
    "build_version",
}


def model_files(root: Path) -> Path:
    """A file root with two model files, and beside it a file that must never be listed."""
    models = root / "models"
    (models / "vision").mkdir(parents=True)
    (models / "big.gguf").write_bytes(b"w" * 2048)
    (models / "vision" / "proj.gguf").write_bytes(b"p" * 16)
    outside = root / "private"
    outside.mkdir()
    (outside / "secret.key").write_text("not for the inventory")
    (models / "secret-link.gguf").symlink_to(outside / "secret.key")
    (models / "private-dir").symlink_to(outside, target_is_directory=True)
    return models


def paths(entry: dict[str, Any]) -> list[str]:
    return [f["path"] for f in entry["files"]["entries"]]


def assert_memory_read(entry: dict[str, Any]) -> None:
    hardware = entry["hardware"]
    assert hardware["cpu_count"] == os.cpu_count()
    if Path("/proc/meminfo").exists():
        memory = hardware["memory"]
        assert memory["kind"] in ("ram", "vram")
        assert 0 <= memory["used_bytes"] <= memory["total_bytes"] and memory["total_bytes"] > 0
    else:
        assert hardware["memory"] is None and hardware["note"]


def test_a_standalone_node_lists_itself_and_files_only_on_request(tmp_path: Path) -> None:
    roots = model_files(tmp_path)
    node = start_node(tmp_path, [text_model("chat")], models={"file_roots": [str(roots)]})
    try:
        with node.client() as client:
            plain = client.get(URL)
            assert plain.status_code == 200, plain.text
            doc = plain.json()
            assert (doc["role"], doc["node_id"], doc["node_url"]) == ("standalone", "node-a", "")
            assert doc["recipes"] == []
            assert [r["local_id"] for r in doc["models"]] == ["chat"]
            (entry,) = doc["nodes"]
            assert set(entry) == NODE_KEYS
            assert entry["source"] == "local" and entry["available"] is True
            assert entry["backend_mode"] == "sim" and entry["error"] == ""
            assert [m["local_id"] for m in entry["models"]] == ["chat"]
            assert entry["files"] is None  # no scan without include_files
            assert_memory_read(entry)

            with_files = client.get(URL, params={"include_files": "true"}).json()
            (entry,) = with_files["nodes"]
            assert paths(entry) == ["big.gguf", "vision/proj.gguf"]
            big = entry["files"]["entries"][0]
            assert big["root"] == str(roots) and big["size"] == 2048
            assert entry["files"]["truncated"] is False
            assert "secret" not in plain.text + str(with_files)

            refused = client.get(URL, params={"include_files": "please"})
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "include_files"
            assert client.delete(URL).status_code == 404
            # The node protocol's inventory needs a cluster token, which a standalone node has
            # none of.
            assert client.get("/router/v1/node/site/inventory", headers=AUTH).status_code == 401
    finally:
        node.cleanup()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("inventory")
    roots = model_files(root / "s1")
    c = start_cluster(
        root,
        [text_model("main")],
        {"s1": [text_model("one")], "s2": [text_model("two")]},
        per_slave_sections={"s1": {"models": {"file_roots": [str(roots)]}}},
    )
    try:
        yield c
    finally:
        c.cleanup()


def inventory(c: Cluster, **params: str) -> dict[str, Any]:
    with c.master.client() as client:
        resp = client.get(URL, params=params)
        assert resp.status_code == 200, resp.text
        doc: dict[str, Any] = resp.json()
        return doc


def test_the_master_lists_every_node_with_a_slaves_files(cluster: Cluster) -> None:
    doc = inventory(cluster, include_files="true")
    assert (doc["role"], doc["node_id"]) == ("master", "master")
    by_node = {n["node_id"]: n for n in doc["nodes"]}
    assert list(by_node) == ["master", "s1", "s2"]
    master, s1, s2 = by_node["master"], by_node["s1"], by_node["s2"]
    assert (master["source"], master["role"]) == ("master", "master")
    assert (s1["source"], s1["role"], s1["node_url"]) == (
        "slave",
        "slave",
        cluster.slaves["s1"].base_url,
    )
    assert all(n["available"] and n["error"] == "" for n in doc["nodes"])
    assert all(set(n) == NODE_KEYS for n in doc["nodes"])
    # Each node's own records under their local IDs; the cluster view at the top.
    assert [m["local_id"] for m in s1["models"]] == ["one"]
    assert [m["local_id"] for m in s2["models"]] == ["two"]
    assert {(r["node_id"], r["local_id"]) for r in doc["models"]} == {
        ("master", "main"),
        ("s1", "one"),
        ("s2", "two"),
    }
    for entry in doc["nodes"]:
        assert_memory_read(entry)
        assert entry["build_version"] == master["build_version"]
    # The slave's files came through the master; nodes without roots list none.
    assert paths(s1) == ["big.gguf", "vision/proj.gguf"]
    assert paths(master) == [] and paths(s2) == []
    assert "secret" not in str(doc)
    assert all(n["files"] is None for n in inventory(cluster)["nodes"])


def test_a_slave_answers_its_own_inventory_only_to_the_cluster(cluster: Cluster) -> None:
    with cluster.slaves["s1"].client() as client:
        assert client.get(URL).status_code == 404  # site routes do not exist on a slave
        node_path = "/router/v1/node/site/inventory"
        assert client.get(node_path).status_code == 401
        own = client.get(node_path, params={"include_files": "1"}, headers=AUTH).json()
        assert (own["node_id"], own["source"], own["role"]) == ("s1", "local", "slave")
        assert paths(own) == ["big.gguf", "vision/proj.gguf"]
        refused = client.get(node_path, params={"include_files": "x"}, headers=AUTH)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "include_files"


def test_a_killed_slave_is_marked_and_the_rest_still_answers(cluster: Cluster) -> None:
    cluster.slaves["s2"].kill()
    try:
        doc = inventory(cluster, include_files="true")
        by_node = {n["node_id"]: n for n in doc["nodes"]}
        s2 = by_node["s2"]
        assert s2["available"] is False and s2["error"]
        assert s2["hardware"] is None and s2["files"] is None
        # What the master last heard from it is still shown.
        assert [m["local_id"] for m in s2["models"]] == ["two"]
        assert by_node["master"]["available"] and by_node["s1"]["available"]
        assert paths(by_node["s1"]) == ["big.gguf", "vision/proj.gguf"]
    finally:
        # The other tests of the module, in whatever order they run, expect s2 up.
        cluster.restart_slave("s2")
        cluster.wait_healthy("s2")
