"""Calibrating a node's models (`manage.py benchmark_models`, `/router/v1/benchmarks/run`) on a real
master and slave with simulated backends: the node publishes a cost fit for each model it
calibrated, and keeps what it sent and measured in `<store_dir>/benchmarks/`."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, Cluster, ModelSpec, sim_weights, start_cluster, wait_for
from tests.test_openapi import assert_matches

pytestmark = pytest.mark.integration

# Every request of the grid costs differently: base + prompt tokens + output tokens, each term
# well above a busy machine's timing noise.
TEXT = ModelSpec(
    "chat",
    {"contextsize": 4096, "parallel": 1},
    {
        "model_param": sim_weights(
            load_ms=120, base_ms=10, prompt_ms_per_token=0.2, output_ms_per_token=3
        )
    },
)
IMAGE = ModelSpec(
    "paint",
    {},
    {"sdmodel": sim_weights(load_ms=80, base_ms=5, image_ms_per_megapixel_step=4)},
)
IMAGE_ID = "paint-paint-sdmodel"
# Each term costs clearly more than a busy machine's timing noise: a slope lost in the noise
# could come out negative, which the fit rules take as unpriceable.
OTHER = ModelSpec(
    "other",
    {"contextsize": 4096, "parallel": 1},
    {"model_param": sim_weights(base_ms=20, prompt_ms_per_token=0.05, output_ms_per_token=0.5)},
)
# The default scheduling_min_samples: the calibration sends at least this many per lane.
DEFAULT_MIN_SAMPLES = 20
ROUTE = "/router/v1/benchmarks"
RUN = "/router/v1/benchmarks/run"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("bench")
    running = start_cluster(root, [], {"h": [TEXT, IMAGE, OTHER]})
    try:
        yield running
    finally:
        running.cleanup()


def _status(cluster: Cluster) -> dict[str, Any]:
    with cluster.slaves["h"].client() as client:
        doc: dict[str, Any] = client.get("/router/v1/node/runtime-status", headers=_token()).json()
    return doc


def _token() -> dict[str, str]:
    from tests.harness import CLUSTER_TOKEN

    return {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


def _fit(cluster: Cluster, model_id: str, section: str) -> dict[str, Any] | None:
    costs = _status(cluster).get("costs") or {}
    for row in costs.get("models", []):
        if row["model_id"] == model_id and row["section"] == section:
            return dict(row)
    return None


def _files(cluster: Cluster, model: str) -> list[Path]:
    return sorted((cluster.slaves["h"].store / "benchmarks").glob(f"{model}-*.json"))


def _idle(cluster: Cluster, via: str = "h") -> dict[str, Any]:
    node = cluster.slaves["h"] if via == "h" else cluster.master
    params = {} if via == "h" else {"node_id": "h"}

    def done() -> dict[str, Any] | None:
        with node.client() as client:
            answer = client.get("/router/v1/benchmarks", params=params)
        assert answer.status_code == 200, answer.text
        doc: dict[str, Any] = answer.json()
        assert_matches(ROUTE, "GET", 200, doc)
        return None if doc["running"] else doc

    found: dict[str, Any] = wait_for(done, timeout=60.0, interval=0.1)
    return found


def test_benchmark_models_gives_a_fresh_model_its_fit_and_keeps_the_requests(
    cluster: Cluster,
) -> None:
    assert _fit(cluster, "chat", "llm") is None
    slave = cluster.slaves["h"]
    argv = ["manage.py", "benchmark_models", "--config", str(slave.config_path), "--models", "chat"]
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 model(s) benchmarked and fitted" in proc.stdout
    # The ticker refits as soon as the rows reach the threshold: no minute's wait.
    fit = wait_for(lambda: _fit(cluster, "chat", "llm"), timeout=20.0)
    assert fit["samples"] >= DEFAULT_MIN_SAMPLES
    # Both terms varied: a fit that scales with the work, not one uniform price.
    assert "uniform_work" not in fit and "constant_work" not in fit
    # Tens of milliseconds of timing noise on a busy machine are small beside what an answer
    # of 96 tokens costs (288 ms), so the answer's slope comes back close to the model's.
    assert fit["slopes_ms"][0] > 0
    assert fit["slopes_ms"][1] == pytest.approx(3.0, rel=0.25)
    (path,) = _files(cluster, "chat")
    doc = json.loads(path.read_text())
    (lane,) = doc["lanes"]
    requests = lane["requests"]
    assert len(requests) >= DEFAULT_MIN_SAMPLES
    assert all(r["status"] == 200 and r["duration_ms"] > 0 for r in requests)
    assert len({r["prompt_bytes"] for r in requests}) >= 2
    assert len({r["max_tokens"] for r in requests}) >= 2
    # The model was unloaded first, so the first request loaded it: one measured load.
    assert lane["load_ms"] >= 120
    assert lane["fit"]["samples"] == fit["samples"]
    assert str(path) in proc.stdout


def test_the_master_starts_a_benchmark_on_the_node_that_holds_the_model(
    cluster: Cluster,
) -> None:
    with cluster.master.client() as client:
        answer = client.post(RUN, json={"node_id": "h", "models": [IMAGE_ID]})
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["param"] == "models"
    with cluster.master.client() as client:
        answer = client.post(RUN, json={"node_id": "h", "models": ["paint"]})
    assert answer.status_code == 202, answer.text
    assert answer.json()["node_id"] == "h"
    assert_matches(RUN, "POST", 202, answer.json())
    doc = _idle(cluster, via="master")
    (result,) = [r for r in doc["results"] if r["model"] == "paint"]
    assert result["fitted"], result
    (lane,) = result["lanes"]
    assert lane["lane"] == "image" and lane["requests"] >= DEFAULT_MIN_SAMPLES
    assert wait_for(lambda: _fit(cluster, IMAGE_ID, "image"), timeout=20.0)
    assert _files(cluster, "paint")
    rows = cluster.master.query(
        "SELECT target FROM audit_log WHERE action = %s", ("model.benchmark",)
    )
    assert ("h/paint",) in rows


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"models": []}, 400, "models"),
        ({"models": "chat"}, 400, "models"),
        ({"models": [""]}, 400, "models[0]"),
        ({"models": ["nope"]}, 404, "models"),
        ({"node_id": "nowhere"}, 404, "node_id"),
    ],
)
def test_a_bad_benchmark_request_is_refused_and_starts_nothing(
    cluster: Cluster, body: dict[str, Any], status: int, param: str
) -> None:
    with cluster.master.client() as client:
        answer = client.post(RUN, json={"node_id": "h", **body})
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param
    assert_matches(RUN, "POST", status, answer.json())
    assert not _idle(cluster)["running"]


def test_a_second_benchmark_waits_for_the_first(cluster: Cluster) -> None:
    with cluster.slaves["h"].client() as client:
        first = client.post(RUN, json={"models": ["other"]})
        second = client.post(RUN, json={"models": ["other"]})
    assert first.status_code == 202, first.text
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "benchmark_running"
    assert_matches(RUN, "POST", 409, second.json())
    doc = _idle(cluster)
    assert [r["fitted"] for r in doc["results"] if r["model"] == "other"] == [True]


def _enable(cluster: Cluster, local_id: str, enabled: bool) -> None:
    body = {"node_id": "h", "local_id": local_id, "enabled": enabled}
    with cluster.master.client() as client:
        client.post("/router/v1/site/models/state", json=body).raise_for_status()


def test_without_models_every_enabled_text_and_image_model_is_calibrated(
    cluster: Cluster,
) -> None:
    # chat is disabled here: the first test needs it never calibrated, whatever the order.
    _enable(cluster, "chat", False)
    try:
        with cluster.master.client() as client:
            refused = client.post(RUN, json={"node_id": "h", "models": ["chat"]})
            started = client.post(RUN, json={"node_id": "h"})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "model_disabled"
        assert started.status_code == 202, started.text
        doc = started.json()
        assert sorted([*doc["pending"], *filter(None, [doc["current"]])]) == ["other", "paint"]
        done = _idle(cluster)
        results = {r["model"]: r for r in done["results"]}
        assert results["other"]["fitted"] and results["paint"]["fitted"]
        # chat keeps whatever result an earlier test left it: this run did not touch it.
        before = {r["model"]: r for r in doc["results"]}
        assert results.get("chat") == before.get("chat")
    finally:
        _enable(cluster, "chat", True)


@pytest.fixture
def slave_settings(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process reads the slave's config, as `manage.py --config` on its machine would."""
    from django.conf import settings

    from routerproject.config import load_config

    monkeypatch.setattr(
        settings, "ROUTER", load_config(cluster.slaves["h"].config_path, environ={})
    )


def _command(*args: str) -> str:
    from django.core.management import call_command

    out = io.StringIO()
    call_command("benchmark_models", *args, stdout=out)
    return out.getvalue()


def test_the_command_names_the_routers_refusal_and_a_dry_run_sends_nothing(
    cluster: Cluster, slave_settings: None
) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r'answered 404: model "nope" is not a config on node h'):
        _command("--models", "nope")
    port = cluster.slaves["h"].port
    out = _command("--dry-run", "--models", "chat, other")
    url = f"http://127.0.0.1:{port}{RUN}"
    assert out.strip() == f'would POST {url} {{"models": ["chat", "other"]}}'
    assert not _idle(cluster)["running"]


def test_a_restarted_node_still_shows_its_kept_results(cluster: Cluster) -> None:
    with cluster.slaves["h"].client() as client:
        started = client.post(RUN, json={"models": ["other"]})
    assert started.status_code == 202, started.text
    before = {r["model"]: r for r in _idle(cluster)["results"]}
    # A file in the folder that is no result is passed over, not fatal.
    (cluster.slaves["h"].store / "benchmarks" / "notes.json").write_text("not json")
    cluster.restart_slave("h")
    cluster.wait_healthy("h")
    after = {r["model"]: r for r in _idle(cluster)["results"]}
    assert after == before
