"""`init_node` output starts a working cluster: a master and a slave written by the command,
started by the command line it prints, the slave registered, and a request through the
master answered by the slave's model.

Nothing here writes the nodes' configs but `manage.py init_node` (run as the operator would,
as a process of its own); the test only adds to the master the line the slave's run printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gguf_files import write_gguf
from tests.harness import (
    REPO,
    TEMPLATES,
    RouterNode,
    _PgDatabase,
    free_port,
    sim_weights,
    spawn_node,
    wait_for,
)

pytestmark = pytest.mark.integration

START_HEADING = "Start this node with:"


def init_node(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "init_node", *args],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def printed_start(output: str) -> list[str]:
    """The command line the output says starts the node."""
    lines = output.splitlines()
    return shlex.split(lines[lines.index(START_HEADING) + 1])


def start_printed(output: str, port: int) -> RouterNode:
    """Run the printed start line as it is, on a database of the node's own (not waited for)."""
    argv = printed_start(output)
    config_path = Path(argv[argv.index("--config") + 1])
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
    suite_db = os.environ.get("DATABASE_URL", "")
    db = None
    if suite_db.startswith(("postgres://", "postgresql://")):
        # The suite's PostgreSQL run: each node a throwaway database, as the harness gives.
        db = _PgDatabase(suite_db, TEMPLATES.pg(suite_db))
        env["DATABASE_URL"] = db.url
    return spawn_node(argv, env, port, config_path.parent / "router-store", config_path, db=db)


def keys(config_path: Path) -> dict[str, Any]:
    return yaml.safe_load(config_path.read_text())["auth"]


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[dict[str, Any]]:
    master_port, slave_port = free_port(), free_port()
    models = tmp_path / "slave-models"
    models.mkdir()
    (models / "chat.sim.json").write_text(json.dumps(sim_weights()))
    # A real GGUF too: the slave offers it as its header describes it (no backend starts
    # until a request asks for it, and none does here).
    write_gguf(models / "gemma" / "gemma-3-4b-it-Q4_K_M.gguf", "gemma3", context=131072)
    write_gguf(models / "gemma" / "mmproj-gemma-3-4b-it-f16.gguf", "clip")
    master_cfg = tmp_path / "master" / "config.yaml"
    slave_cfg = tmp_path / "slave" / "config.yaml"
    master_out = init_node(
        "--role",
        "master",
        "--out",
        str(master_cfg),
        "--bind",
        f"127.0.0.1:{master_port}",
        "--node-id",
        "boss",
    )
    join = re.search(r"rjoin1:[A-Za-z0-9_-]+", master_out)
    assert join is not None, master_out
    slave_out = init_node(
        "--role",
        "slave",
        "--join",
        join.group(),
        "--out",
        str(slave_cfg),
        "--bind",
        f"127.0.0.1:{slave_port}",
        "--node-id",
        "worker",
        "--models-dir",
        str(models),
    )
    added = re.search(r"^    - http://\S+$", slave_out, re.MULTILINE)
    assert added is not None, slave_out
    text = master_cfg.read_text()
    master_cfg.write_text(text.replace("  slave_urls:\n", f"  slave_urls:\n{added.group()}\n"))
    started: list[RouterNode] = []
    try:
        # Both at once, as machines boot: in no set order.
        started.append(start_printed(master_out, master_port))
        started.append(start_printed(slave_out, slave_port))
        for node in started:
            node.wait_ready()
        yield {"master": started[0], "slave": started[1], "master_cfg": master_cfg}
    finally:
        for node in started:
            node.cleanup()


def test_init_node_output_starts_a_master_and_a_slave_that_serve_through_the_master(
    nodes: dict[str, Any],
) -> None:
    master, slave = nodes["master"], nodes["slave"]
    auth = keys(nodes["master_cfg"])
    admin = {"Authorization": f"Bearer {auth['admin_keys'][0]}"}
    client_key = {"Authorization": f"Bearer {auth['inference_keys'][0]}"}
    with httpx.Client(base_url=master.base_url, timeout=60) as client:

        def registered() -> bool:
            state = client.get("/router/v1/site/nodes/state", headers=admin).json()
            found = {n["node_id"]: n for n in state.get("cluster", {}).get("nodes", [])}
            return bool(found.get("worker", {}).get("healthy"))

        wait_for(registered, timeout=60, interval=0.2)
        records = client.get("/router/v1/models", headers=admin).json()["models"]
        by_id = {r["local_id"]: r for r in records}
        assert {(r["node_id"], r["local_id"]) for r in records} == {
            ("worker", "chat"),
            ("worker", "gemma-3-4b-it-Q4_K_M"),
        }
        gemma = by_id["gemma-3-4b-it-Q4_K_M"]
        assert gemma["backend_mode"] == "llama_sdcpp" and gemma["context_size"] == 8192
        assert gemma["has_multimodal"] is True and gemma["has_llm"] is True
        request_id = uuid.uuid4().hex
        answer = client.post(
            "/v1/chat/completions",
            headers={**client_key, "X-Request-Id": request_id},
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "chat"
        # The master holds no model: the keys it wrote guard it, and without one it refuses.
        refused = client.post("/v1/chat/completions", json={"model": "chat", "messages": []})
        assert refused.status_code == 401

    def ran_on_slave() -> bool:
        rows = slave.query("SELECT request_id FROM analytics_requests")
        return any(request_id in row for row in rows)

    wait_for(ran_on_slave, timeout=20, interval=0.2)
