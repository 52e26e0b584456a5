"""Stored keys across a real cluster (a master and a slave, `runrouter` processes): a key made
on the master works on the slave directly within 5 s and stops there within 5 s of its
revocation; model scope on OpenAI, Ollama and Kobold paths and in the model lists; the secret
in no log line of any node."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, Cluster, RouterNode, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration

KEYS = "/router/v1/site/api-keys"
TAKES_EFFECT_SECS = 5.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("keys")
    made = start_cluster(root, [text_model("alpha")], {"s1": [text_model("beta")]})
    try:
        # Both models in the master's view before a key may name them.
        def both() -> bool:
            with made.master.client() as c:
                ids = {m["id"] for m in c.get("/v1/models").json()["data"]}
            return {"alpha", "beta"} <= ids

        wait_for(both, timeout=30)
        # A key for every model: the cluster has stored keys from here on, so a request
        # without one is refused on every node.
        global OPS
        OPS = create(made.master, "ops")["key"]
        yield made
    finally:
        made.cleanup()


OPS = ""
"""The secret of the cluster fixture's key for every model."""


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def create(node: RouterNode, name: str, **fields: Any) -> dict[str, Any]:
    with node.client() as c:
        response = c.post(KEYS, json={"name": name, **fields})
    assert response.status_code == 201, response.text
    doc: dict[str, Any] = response.json()
    return doc


def status_on(node: RouterNode, secret: str, path: str = "/v1/models") -> int:
    with node.client() as c:
        return c.get(path, headers=bearer(secret)).status_code


def within(deadline_secs: float, started: float, predicate: Any) -> float:
    """Poll `predicate` until true; the seconds it took from `started` (fails past the limit)."""
    wait_for(predicate, timeout=deadline_secs + 1.0, interval=0.05)
    took = time.monotonic() - started
    assert took <= deadline_secs, f"took {took:.2f}s"
    return took


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_key_made_on_the_master_works_on_the_slave_and_stops_when_revoked(
    cluster: Cluster,
) -> None:
    slave = cluster.slaves["s1"]
    started = time.monotonic()
    made = create(cluster.master, "travels")
    secret = made["key"]
    within(TAKES_EFFECT_SECS, started, lambda: status_on(slave, secret) == 200)
    with slave.client() as c:
        assert (
            c.post("/v1/chat/completions", json=chat("beta"), headers=bearer(secret)).status_code
            == 200
        )
        # The Anthropic SDK's header works on the slave too.
        assert c.get("/v1/models", headers={"x-api-key": secret}).status_code == 200
        # Keys exist in the cluster: a request without one is refused on the slave as well.
        assert c.get("/v1/models").status_code == 401
    started = time.monotonic()
    with cluster.master.client() as c:
        assert c.delete(f"{KEYS}/{made['id']}").status_code == 200
    within(TAKES_EFFECT_SECS, started, lambda: status_on(slave, secret) == 401)
    assert status_on(cluster.master, secret) == 401


def test_an_expired_key_stops_on_every_node(cluster: Cluster) -> None:
    from datetime import UTC, datetime, timedelta

    expiry = datetime.now(UTC) + timedelta(seconds=3)
    secret = create(cluster.master, "brief", expires_at=expiry.isoformat())["key"]
    slave = cluster.slaves["s1"]
    wait_for(lambda: status_on(slave, secret) == 200, timeout=TAKES_EFFECT_SECS)
    wait_for(lambda: status_on(slave, secret) == 401, timeout=10)
    assert status_on(cluster.master, secret) == 401


def test_a_scoped_key_is_refused_other_models_on_every_family(cluster: Cluster) -> None:
    # The slave's model: a slave lists and serves its own models, the master the cluster's.
    slave = cluster.slaves["s1"]
    secret = create(cluster.master, "scoped", models=["beta"])["key"]
    wait_for(lambda: status_on(slave, secret) == 200, timeout=TAKES_EFFECT_SECS)
    key = bearer(secret)
    for node in (slave, cluster.master):
        with node.client() as c:
            openai = c.post("/v1/chat/completions", json=chat("alpha"), headers=key)
            assert openai.status_code == 403
            assert openai.json()["error"]["code"] == "model_not_allowed"
            assert openai.json()["error"]["param"] == "model"
            ollama = c.post("/api/chat", json={**chat("alpha"), "stream": False}, headers=key)
            assert ollama.status_code == 403
            assert "model_not_allowed" in ollama.json()["error"]
            kobold = c.post(
                "/api/v1/generate", json={"model": "alpha", "prompt": "hi"}, headers=key
            )
            assert kobold.status_code == 403
            assert kobold.json()["error"]["code"] == "model_not_allowed"
            # The lists show only what the key may use.
            assert [m["id"] for m in c.get("/v1/models", headers=key).json()["data"]] == ["beta"]
            tags = c.get("/api/tags", headers=key).json()["models"]
            assert [m["name"] for m in tags] == ["beta"]
            # What it may use it gets, wherever the model lives.
            allowed = c.post("/v1/chat/completions", json=chat("beta"), headers=key)
            assert allowed.status_code == 200, allowed.text


def test_a_key_made_with_the_command_reaches_the_slave(cluster: Cluster) -> None:
    master = cluster.master
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
    if master.db is not None:
        env["DATABASE_URL"] = master.db.url
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "manage.py"),
            "create_api_key",
            "--config",
            str(master.config_path),
            "--name",
            "scripted",
        ],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Timed from the command's exit (its row is committed by then), not from its start: a
    # Django process starting on a loaded machine is not the cluster's delay.
    started = time.monotonic()
    secret = next(line for line in done.stdout.splitlines() if line.startswith("rk-"))
    # Written by another process: the master notices the row (it looks every second), then
    # pushes it.
    within(TAKES_EFFECT_SECS, started, lambda: status_on(cluster.slaves["s1"], secret) == 200)


def _logs(node: RouterNode) -> str:
    parts = [node.output()]
    for path in Path(node.store).rglob("*.log*"):
        parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def test_the_secret_is_in_no_log_line_of_any_node(cluster: Cluster) -> None:
    slave = cluster.slaves["s1"]
    made = create(cluster.master, "quiet", models=["alpha"])
    secret = made["key"]
    wait_for(lambda: status_on(slave, secret) == 200, timeout=TAKES_EFFECT_SECS)
    for node in (cluster.master, slave):
        with node.client() as c:
            c.post("/v1/chat/completions", json=chat("alpha"), headers=bearer(secret))
            c.post("/v1/chat/completions", json=chat("beta"), headers=bearer(secret))
            c.get("/v1/models", headers={"x-api-key": secret})
            c.get("/router/v1/models", headers=bearer(secret))
    with cluster.master.client() as c:
        c.delete(f"{KEYS}/{made['id']}")
    wait_for(lambda: status_on(slave, secret) == 401, timeout=TAKES_EFFECT_SECS)
    for node in cluster.nodes():
        logs = _logs(node)
        assert secret not in logs
        assert OPS not in logs
        # Not even the random part alone.
        assert secret[3:] not in logs
