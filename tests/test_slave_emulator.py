"""The slave emulator (bench/slaves.py) answers the node protocol as a real slave does.

One real master with one real slave and one emulated slave: each node route the master calls is
asked of both slaves, and the emulator's answer must have the real answer's shape (the same
keys at every level, values of the same JSON types: a schema inferred from the real answer,
objects closed, validated as the OpenAPI checks validate). The master's own documented answers
built from the emulated slave's data (its records, state, summary, folds, timeline, usage and
inventory) must match the OpenAPI document, and pushes must leave the emulated slave with the
fingerprints the real one has, so the master cannot tell them apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from bench.slaves import SlaveFarm
from lending.planner import Lease
from tests.emulated import FarmThread
from tests.harness import CLUSTER_TOKEN, Cluster, free_port, start_cluster, text_model, wait_for
from tests.test_openapi import assert_matches

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
EMU = "emu0000"

# Every GET of the node protocol a master sends to a slave (the site pages' fan-outs included).
GET_ROUTES = (
    "models",
    "runtime-status",
    "state",
    "offload/summary",
    "offload/decisions",
    "offload/decisions/folded",
    "offload/timeline",
    "audit",
    "usage",
    "offload/borrowed",
    "site/inventory",
    "limits",
)


def shape(value: Any) -> dict[str, Any]:
    """A JSON schema any answer of this one's shape passes: same keys, same JSON types."""
    if isinstance(value, dict):
        return {
            "type": "object",
            "properties": {key: shape(item) for key, item in value.items()},
            "required": sorted(value),
            "additionalProperties": False,
        }
    if isinstance(value, list):
        if not value:
            return {"type": "array"}
        # Each item of the emulator's list must have the shape of one of the real list's items
        # (a loaded runtime has a pid, an empty one has none).
        kinds = {json.dumps(shape(item), sort_keys=True): shape(item) for item in value}
        return {"type": "array", "items": {"anyOf": list(kinds.values())}}
    if value is None:
        return {}  # a field the real slave leaves empty: any value is its shape
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    return {"type": "string"}


def assert_same_shape(what: str, real: Any, emulated: Any) -> None:
    errors = [
        f"{list(e.absolute_path)}: {e.message}"
        for e in Draft202012Validator(shape(real)).iter_errors(emulated)
    ]
    assert errors == [], f"{what}: the emulator's answer differs from the real slave's"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, FarmThread]]:
    root: Path = tmp_path_factory.mktemp("emulator")
    port = free_port()
    farm = SlaveFarm(master_url="", token=CLUSTER_TOKEN, ports=[port], key_pull=True)
    runner = FarmThread(farm)
    runner.run(farm.start())
    c = start_cluster(
        root,
        [],
        {"real": [text_model("chat"), text_model("chat2")]},
        extra_slave_urls=[farm.urls[0]],
        # A setting off its default: every slave that registers is caught up with pushes.
        master_sections={"cluster": {"offload_probe_idle": "100ms"}},
    )
    try:
        farm.master_url = c.master.base_url
        runner.run(farm.register_all())
        c.wait_healthy("real", EMU)
        with c.master.client() as client:
            for owner, helper in (
                (("real", "chat"), (EMU, f"{EMU}-m0")),
                ((EMU, f"{EMU}-m0"), ("real", "chat")),
            ):
                link = {
                    "anchor": {"node_id": owner[0], "model_id": owner[1]},
                    "lends_to": [{"node_id": helper[0], "model_id": helper[1]}],
                    "acknowledge_different_weights": True,
                }
                resp = client.post("/router/v1/site/text-routing-groups", json=link)
                assert resp.status_code == 200, resp.text
        wait_for(lambda: farm.slaves[0].links.get("text"))
        yield c, runner
    finally:
        c.cleanup()
        runner.close()


def _get(url: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url + "/router/v1/node/" + path, headers=AUTH, timeout=30, **kwargs)


def test_every_answer_a_master_asks_for_has_the_real_slaves_shape(
    cluster: tuple[Cluster, FarmThread],
) -> None:
    c, runner = cluster
    real, emulated = c.slaves["real"].base_url, runner.farm.urls[0]
    for path in GET_ROUTES:
        a, b = _get(real, path), _get(emulated, path)
        assert (a.status_code, b.status_code) == (200, 200), path
        assert_same_shape(path, a.json(), b.json())
    # Queue stats only list enrolled models: both slaves own and help in a link now.
    queues = [_get(u, "runtime-status").json()["text_queue"] for u in (real, emulated)]
    assert all(queues), queues


def test_pushes_leave_the_emulated_slave_with_the_real_ones_fingerprints(
    cluster: tuple[Cluster, FarmThread],
) -> None:
    c, runner = cluster
    real = _get(c.slaves["real"].base_url, "models").json()
    emulated = _get(runner.farm.urls[0], "models").json()
    master = _get(c.master.base_url, "runtime-status").json()
    # The master runs a setting off its default and pushed it: both slaves run the master's.
    assert emulated["settings_fingerprint"] == real["settings_fingerprint"]
    assert emulated["settings_fingerprint"] == master["settings_fingerprint"]
    assert emulated["api_keys_fingerprint"] == real["api_keys_fingerprint"]
    assert runner.farm.pushes["settings"] >= 1


def test_the_masters_documented_answers_built_from_the_emulator_match_the_document(
    cluster: tuple[Cluster, FarmThread],
) -> None:
    c, _ = cluster
    with c.master.client() as client:
        models = client.get("/router/v1/models").json()
        assert f"{EMU}-m0" in {m["public_id"] for m in models["models"]}
        assert_matches("/router/v1/models", "GET", 200, models)
        state = client.get("/router/v1/site/nodes/state", params={"node_id": EMU})
        assert state.status_code == 200
        assert state.json()["node_id"] == EMU
        assert_matches("/router/v1/site/nodes/state", "GET", 200, state.json())
        for path in (
            "/router/v1/site/offload/summary",
            "/router/v1/site/offload/decisions/folded",
            "/router/v1/site/offload/timeline",
            "/router/v1/site/inventory",
        ):
            resp = client.get(path)
            assert resp.status_code == 200, path
            assert not resp.json().get("node_errors"), (path, resp.json())
            assert_matches(path, "GET", 200, resp.json())
        usage = client.get("/router/v1/site/usage", params={"since_ms": "0"})
        assert not usage.json().get("node_errors")
        assert_matches("/router/v1/site/usage", "GET", 200, usage.json())


def test_posted_answers_and_refusals_match_the_real_slaves(
    cluster: tuple[Cluster, FarmThread],
) -> None:
    c, runner = cluster
    targets = {"real": (c.slaves["real"].base_url, "chat"), EMU: (runner.farm.urls[0], f"{EMU}-m0")}
    answers: dict[str, list[tuple[int, Any]]] = {}
    for node_id, (url, model) in targets.items():
        lease = Lease("text", node_id, model, "x", "y", True, False, 1, False, 1000, 5.0, None, 2.0)
        calls = [
            ("offload/grant", lease.to_wire()),
            ("offload/grant", {}),
            ("models/state", {"node_id": node_id, "local_id": model, "enabled": True}),
            ("models/state", {"node_id": node_id, "local_id": "absent", "enabled": True}),
            ("models/state", {"node_id": "someone-else", "local_id": model, "enabled": True}),
            ("load", {}),
        ]
        got = []
        for path, body in calls:
            resp = httpx.post(f"{url}/router/v1/node/{path}", json=body, headers=AUTH, timeout=30)
            got.append((resp.status_code, resp.json()))
        for path in ("models", "no/such/route"):
            resp = httpx.get(f"{url}/router/v1/node/{path}", headers={"Authorization": "Bearer x"})
            got.append((resp.status_code, resp.json()))
        answers[node_id] = got
    for (status, real), (emulated_status, emulated) in zip(
        answers["real"], answers[EMU], strict=True
    ):
        assert status == emulated_status, (real, emulated)
        assert_same_shape(f"HTTP {status}", real, emulated)
    assert [s for s, _ in answers[EMU]] == [200, 400, 200, 404, 409, 400, 401, 401]


def test_a_request_through_the_master_reaches_the_emulated_slave(
    cluster: tuple[Cluster, FarmThread],
) -> None:
    c, runner = cluster
    body = {"model": f"{EMU}-m0", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    before = runner.farm.slaves[0].served
    with c.master.client() as client:
        routed = client.post("/v1/chat/completions", json=body)
    real = httpx.post(
        c.slaves["real"].base_url + "/router/v1/node/inference/v1/chat/completions",
        json={**body, "model": "chat"},
        headers=AUTH,
        timeout=30,
    )
    assert routed.status_code == 200, routed.text
    assert runner.farm.slaves[0].served == before + 1
    assert_same_shape("chat completion", real.json(), routed.json())
