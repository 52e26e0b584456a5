"""The audit log on real processes: a master and one slave, every kind of management write.

Each write carries its own X-Request-Id, so a test finds its rows whatever the other tests (in
any order) wrote before it. Rows a slave recorded (what the master pushed to it, writes made
on it directly) are read through the master's route, which asks every node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import (
    Cluster,
    ModelSpec,
    sim_weights,
    start_cluster,
    start_node,
    text_model,
)

pytestmark = pytest.mark.integration

AUDIT = "/router/v1/site/audit"
TEXT = "/router/v1/site/text-routing-groups"
IMAGE = "/router/v1/site/routing-groups"
SETTINGS = "/router/v1/site/offload/settings"
GUARDIANS = "/router/v1/site/guardians"
COOK = "/router/v1/site/cook"
PIC = "pic-pic-sdmodel"


def picture(name: str) -> ModelSpec:
    return ModelSpec(name, {}, {"sdmodel": sim_weights(base_ms=5, image_ms_per_megapixel_step=1)})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("audit")
    seer = ModelSpec(
        "seer",
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(vision=True), "mmproj": sim_weights(vision=True)},
    )
    c = start_cluster(
        root,
        [text_model("own"), picture("pic")],
        {"s1": [text_model("help", output_ms_per_token=2), picture("pic"), seer]},
    )
    try:
        yield c
    finally:
        c.cleanup()


def send(client: httpx.Client, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, str]:
    """The answer and the request ID the write went with."""
    request_id = uuid.uuid4().hex
    answer = client.request(method, path, headers={"X-Request-Id": request_id}, **kwargs)
    return answer, request_id


def rows_of(client: httpx.Client, request_id: str, **filters: Any) -> list[dict[str, Any]]:
    doc = client.get(AUDIT, params={"limit": 1000, **filters}).json()
    return [r for r in doc["rows"] if r["request_id"] == request_id]


def one_row(client: httpx.Client, request_id: str) -> dict[str, Any]:
    (row,) = rows_of(client, request_id)
    return row


def pushed(client: httpx.Client, action: str) -> list[dict[str, Any]]:
    doc = client.get(AUDIT, params={"actor": "master", "action": action, "limit": 1000}).json()
    return [r for r in doc["rows"] if r["node_id"] == "s1"]


def link_body(**extra: Any) -> dict[str, Any]:
    return {
        "anchor": {"node_id": "master", "model_id": "own"},
        "lends_to": [{"node_id": "s1", "model_id": "help"}],
        **extra,
    }


def test_text_links_record_create_update_and_delete_and_a_refusal_records_nothing(
    cluster: Cluster,
) -> None:
    with cluster.master.client() as client:
        refused, refused_id = send(client, "POST", TEXT, json=link_body())
        assert refused.status_code == 400  # different weights, not acknowledged
        assert rows_of(client, refused_id) == []

        made, made_id = send(
            client, "POST", TEXT, json=link_body(acknowledge_different_weights=True)
        )
        assert made.status_code == 200, made.text
        row = one_row(client, made_id)
        assert (row["actor"], row["action"], row["target"]) == (
            "config key",
            "link.create",
            "text master/own",
        )
        assert row["before"] == {"links": []}
        assert [ln["helper_model_id"] for ln in row["after"]["links"]] == ["help"]
        assert row["node_id"] == "master"

        changed, changed_id = send(
            client,
            "POST",
            TEXT,
            json=link_body(
                lends_to=[{"node_id": "s1", "model_id": "help", "restore_after_borrow": True}]
            ),
        )
        assert changed.status_code == 200, changed.text
        update = one_row(client, changed_id)
        assert update["action"] == "link.update"
        assert update["before"]["links"][0]["restore_after_borrow"] is False
        assert update["after"]["links"][0]["restore_after_borrow"] is True

        gone, gone_id = send(
            client, "DELETE", TEXT, params={"node_id": "master", "model_id": "own"}
        )
        assert gone.status_code == 200
        delete = one_row(client, gone_id)
        assert delete["action"] == "link.delete" and delete["after"] == {"links": []}
        assert delete["before"] == update["after"]


def test_image_links_are_recorded_too(cluster: Cluster) -> None:
    body = {
        "anchor": {"node_id": "master", "model_id": PIC},
        "lends_to": [{"node_id": "s1", "model_id": PIC}],
    }
    with cluster.master.client() as client:
        made, made_id = send(client, "POST", IMAGE, json=body)
        assert made.status_code == 200, made.text
        assert one_row(client, made_id)["target"] == f"image master/{PIC}"
        gone, gone_id = send(client, "DELETE", IMAGE, params={"node_id": "master", "model_id": PIC})
        assert gone.status_code == 200
        row = one_row(client, gone_id)
        assert row["action"] == "link.delete" and len(row["before"]["links"]) == 1


def test_what_the_master_pushes_is_recorded_on_the_slave_once_per_change(
    cluster: Cluster,
) -> None:
    body = link_body(
        lends_to=[{"node_id": "s1", "model_id": "help", "load_if_unloaded": False}],
        acknowledge_different_weights=True,
    )
    with cluster.master.client() as client:
        start = len(pushed(client, "link.update"))
        assert client.post(TEXT, json=body).status_code == 200
        rows = pushed(client, "link.update")
        assert len(rows) == start + 1
        newest = rows[0]
        assert newest["after"]["text"][0]["load_if_unloaded"] is False
        # The same set again: the master pushes it, but the slave runs nothing new.
        assert client.post(TEXT, json=body).status_code == 200
        assert len(pushed(client, "link.update")) == start + 1
        assert (
            client.delete(TEXT, params={"node_id": "master", "model_id": "own"}).status_code == 200
        )
        assert len(pushed(client, "link.update")) == start + 2


def test_settings_writes_are_recorded_here_and_their_push_on_the_slave(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        bad, bad_id = send(client, "POST", SETTINGS, json={"values": {"nope": 1}})
        assert bad.status_code == 400 and rows_of(client, bad_id) == []
        start = len(pushed(client, "settings.update"))
        saved, saved_id = send(
            client, "POST", SETTINGS, json={"values": {"offload_probe_idle": "7s"}}
        )
        assert saved.status_code == 200, saved.text
        row = one_row(client, saved_id)
        assert row["action"] == "settings.update"
        assert row["after"]["offload_probe_idle"] == "7s"
        assert "offload_probe_idle" not in row["before"]
        slave_rows = pushed(client, "settings.update")
        assert len(slave_rows) == start + 1
        assert slave_rows[0]["after"] == {"offload_probe_idle": "7s"}

        reset, reset_id = send(client, "DELETE", SETTINGS, params={"key": "offload_probe_idle"})
        assert reset.status_code == 200
        row = one_row(client, reset_id)
        assert row["action"] == "settings.reset"
        assert "offload_probe_idle" not in row["after"]
        assert len(pushed(client, "settings.update")) == start + 2


def test_guardian_writes_are_recorded_and_a_refused_one_is_not(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        bad, bad_id = send(client, "POST", GUARDIANS, json={"cluster": "own"})
        assert bad.status_code == 400 and rows_of(client, bad_id) == []
        start = len(pushed(client, "guardian.update"))
        saved, saved_id = send(client, "POST", GUARDIANS, json={"models": {"own": "seer"}})
        assert saved.status_code == 200, saved.text
        row = one_row(client, saved_id)
        assert (row["action"], row["target"]) == ("guardian.update", "model own")
        assert row["after"]["models"] == [{"model_id": "own", "guardian_id": "seer"}]
        assert len(pushed(client, "guardian.update")) == start + 1
        cleared, cleared_id = send(
            client, "DELETE", GUARDIANS, params={"scope": "model", "key": "own"}
        )
        assert cleared.status_code == 200
        row = one_row(client, cleared_id)
        assert row["action"] == "guardian.delete" and row["after"]["models"] == []


def test_load_unload_disable_and_enable_are_recorded(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        loaded, load_id = send(client, "POST", "/router/v1/load", json={"model": "own"})
        assert loaded.status_code == 200, loaded.text
        row = one_row(client, load_id)
        assert (row["action"], row["target"]) == ("model.load", "own")
        unloaded, unload_id = send(client, "POST", "/router/v1/unload", json={"model": "own"})
        assert unloaded.status_code == 200, unloaded.text
        assert one_row(client, unload_id)["action"] == "model.unload"

        assert client.post("/router/v1/load", json={"model": "own"}).status_code == 200
        state = client.get("/router/v1/site/nodes/state").json()
        backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
        generation = backend["loaded_models"][0]["generation"]
        body = {
            "node_id": "master",
            "backend_id": "text-runtime",
            "runtime_id": "text",
            "expected_generation": generation,
        }
        stale, stale_id = send(
            client,
            "POST",
            "/router/v1/site/nodes/unload",
            json={**body, "expected_generation": generation + 5},
        )
        assert stale.status_code == 409 and rows_of(client, stale_id) == []
        runtime, runtime_id = send(client, "POST", "/router/v1/site/nodes/unload", json=body)
        assert runtime.status_code == 200, runtime.text
        row = one_row(client, runtime_id)
        assert (row["action"], row["target"]) == ("model.unload", "master/text-runtime/text")

        path = "/router/v1/site/models/state"
        off, off_id = send(
            client, "POST", path, json={"node_id": "s1", "local_id": "help", "enabled": False}
        )
        assert off.status_code == 200, off.text
        row = one_row(client, off_id)
        assert (row["action"], row["target"]) == ("model.disable", "s1/help")
        assert (row["before"], row["after"]) == ({"enabled": True}, {"enabled": False})
        on, on_id = send(
            client, "POST", path, json={"node_id": "s1", "local_id": "help", "enabled": True}
        )
        assert on.status_code == 200
        assert one_row(client, on_id)["action"] == "model.enable"


def test_a_write_made_on_a_slave_directly_is_recorded_there_and_read_on_the_master(
    cluster: Cluster,
) -> None:
    with cluster.slaves["s1"].client() as slave:
        loaded, load_id = send(slave, "POST", "/router/v1/load", json={"model": "help"})
        assert loaded.status_code == 200, loaded.text
        assert slave.get(AUDIT).status_code == 404  # a site route: not on a slave
    with cluster.master.client() as client:
        row = one_row(client, load_id)
        assert (row["node_id"], row["action"], row["target"]) == ("s1", "model.load", "help")


def test_recipes_are_recorded_when_stored_replaced_and_deleted(cluster: Cluster) -> None:
    body = {
        "id": "audit-combo",
        "components": [
            {"kind": "text", "node_id": "master", "model_id": "own"},
            {"kind": "image", "node_id": "s1", "model_id": "pic"},
        ],
    }
    with cluster.master.client() as client:
        bad, bad_id = send(client, "POST", f"{COOK}/apply", json={**body, "components": []})
        assert bad.status_code == 400 and rows_of(client, bad_id) == []
        made, made_id = send(client, "POST", f"{COOK}/apply", json=body)
        assert made.status_code == 200, made.text
        row = one_row(client, made_id)
        assert (row["action"], row["target"], row["before"]) == (
            "recipe.create",
            "audit-combo",
            None,
        )
        again, again_id = send(client, "POST", f"{COOK}/apply", json={**body, "overwrite": True})
        assert again.status_code == 200
        assert one_row(client, again_id)["action"] == "recipe.update"
        gone, gone_id = send(client, "DELETE", f"{COOK}/audit-combo")
        assert gone.status_code == 200
        row = one_row(client, gone_id)
        assert (row["action"], row["after"]) == ("recipe.delete", None)
        assert row["before"]["id"] == "audit-combo"


def test_pages_of_the_whole_cluster_follow_each_other(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        for value in ("3s", "4s", "5s"):
            client.post(SETTINGS, json={"values": {"offload_probe_idle": value}})
        client.delete(SETTINGS)
        everything = client.get(AUDIT, params={"limit": 1000}).json()["rows"]
        assert {r["node_id"] for r in everything} == {"master", "s1"}
        seen: list[tuple[str, int]] = []
        params: dict[str, Any] = {"limit": 3}
        while True:
            doc = client.get(AUDIT, params=params).json()
            seen.extend((r["node_id"], r["id"]) for r in doc["rows"])
            if doc["next_before"] is None:
                break
            params["before"] = doc["next_before"]
        assert seen == [(r["node_id"], r["id"]) for r in everything]
        at = [r["at_ms"] for r in everything]
        assert at == sorted(at, reverse=True)
        since = everything[0]["at_ms"]
        recent = client.get(AUDIT, params={"since_ms": since}).json()["rows"]
        assert recent and all(r["at_ms"] >= since for r in recent)
        bad = client.get(AUDIT, params={"limit": "many"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_a_stored_admin_key_is_the_actor_of_its_writes(tmp_path: Path) -> None:
    node = start_node(tmp_path, [text_model("solo")])
    body = {"values": {"offload_probe_idle": "7s"}}
    try:
        with node.client() as client:
            made = client.post("/router/v1/site/api-keys", json={"name": "boss", "role": "admin"})
            assert made.status_code == 201, made.text
            secret = made.json()["key"]
            # An admin-role key now exists: the management API needs an admin credential.
            assert client.post(SETTINGS, json=body).status_code == 401
        with node.client(headers={"Authorization": f"Bearer {secret}"}) as boss:
            answer, request_id = send(boss, "POST", SETTINGS, json=body)
            assert answer.status_code == 200, answer.text
            row = one_row(boss, request_id)
            assert (row["actor"], row["action"]) == ("boss", "settings.update")
            created = rows_of_action(boss, "api_key.create")
            assert [(r["actor"], r["target"]) for r in created] == [("config key", "boss")]
            assert secret not in str(created)
    finally:
        node.stop()
        node.cleanup()


def rows_of_action(client: httpx.Client, action: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = client.get(AUDIT, params={"action": action}).json()["rows"]
    return rows
