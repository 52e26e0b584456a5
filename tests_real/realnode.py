"""Router nodes in front of real llama-server processes (tests/harness.py does the starting)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx

from tests.harness import RouterNode, start_node

# Loading a 253 MB GGUF takes about a second on an idle machine; a busy one is far slower.
LOAD_TIMEOUT = "180s"


def real_sections(binary: str, **sections: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Config sections for a node whose configs run on llama-server (`backend.mode`)."""
    merged: dict[str, dict[str, Any]] = {
        "backend": {"mode": "llama_sdcpp", "load_timeout": LOAD_TIMEOUT},
        "llama": {"binary_path": binary},
    }
    for name, values in sections.items():
        merged.setdefault(name, {}).update(values)
    return merged


def write_configs(root: Path, configs: dict[str, dict[str, Any]]) -> None:
    """`.kcpps` files where start_node looks for them (its store's kcpps/)."""
    config_dir = root / "store" / "kcpps"
    config_dir.mkdir(parents=True, exist_ok=True)
    for name, raw in configs.items():
        (config_dir / f"{name}.kcpps").write_text(json.dumps(raw))


def start_real_node(
    root: Path, binary: str, configs: dict[str, dict[str, Any]], **sections: dict[str, Any]
) -> RouterNode:
    write_configs(root, configs)
    merged: dict[str, Any] = real_sections(binary, **sections)
    return start_node(root, [], **merged)


def text_backend(client: httpx.Client, node_id: str | None = None) -> dict[str, Any]:
    params = {"node_id": node_id} if node_id else {}
    state = client.get("/router/v1/site/nodes/state", params=params).json()
    backend: dict[str, Any] = next(b for b in state["backends"] if b["id"] == "text-runtime")
    return backend


def backend_props(client: httpx.Client) -> dict[str, Any]:
    """llama-server's own /props (its slot context, among others), asked directly."""
    doc: dict[str, Any] = httpx.get(text_backend(client)["base_url"] + "/props", timeout=30).json()
    return doc


def analytics(client: httpx.Client, kind: str, model: str) -> list[dict[str, Any]]:
    doc = client.get("/router/v1/site/analytics", params={"kind": kind, "limit": 1000}).json()
    return [r for r in doc["records"] if r["model_id"] == model]


def node_rows(node: RouterNode, kind: str, model: str) -> list[dict[str, Any]]:
    """A node's own analytics rows read from its database: a slave has no site API to ask.

    The node flushes its buffer about once a second, so callers poll (tests.harness.wait_for).
    """
    table = {"requests": "analytics_requests", "loads": "analytics_loads"}[kind]
    query = f"SELECT * FROM {table} WHERE model_id = %s ORDER BY id"
    if node.db is not None:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(node.db.url, row_factory=dict_row) as conn:
            return list(conn.execute(query, (model,)).fetchall())
    with sqlite3.connect(node.store / "router.sqlite3") as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(query.replace("%s", "?"), (model,)).fetchall()
    return [dict(row) for row in rows]
