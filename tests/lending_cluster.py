"""What the lending integration tests share: a node's runtime status and cost state, bursts of
concurrent requests at one node, and the master's decision log once it has settled."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from tests.harness import CLUSTER_TOKEN, Cluster, wait_for

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


def status(c: Cluster, node: str) -> dict[str, Any]:
    with c.slaves[node].client() as client:
        doc: dict[str, Any] = client.get("/router/v1/node/runtime-status", headers=AUTH).json()
    return doc


def priced(c: Cluster, node: str, model: str) -> bool:
    costs = status(c, node).get("costs", {})
    fitted = any(m.get("model_id") == model for m in costs.get("models", []))
    profiled = any(t.get("model_id") == model for t in costs.get("tokens", []))
    return fitted and profiled


def burst(c: Cluster, bodies: list[dict[str, Any]], node: str = "o") -> list[httpx.Response]:
    out: list[httpx.Response] = []
    lock = threading.Lock()

    def call(body: dict[str, Any]) -> None:
        with c.slaves[node].client(timeout=120) as client:
            resp = client.post("/v1/chat/completions", json=body)
            resp.read()
        with lock:
            out.append(resp)

    threads = [threading.Thread(target=call, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def decisions(c: Cluster, since_ms: int) -> list[dict[str, Any]]:
    with c.master.client() as client:
        doc = client.get(
            "/router/v1/site/offload/decisions", params={"limit": "5000", "since_ms": since_ms}
        ).json()
    assert "node_errors" not in doc, doc
    records: list[dict[str, Any]] = doc["records"]
    return records


def settled_decisions(c: Cluster, since_ms: int) -> list[dict[str, Any]]:
    """The log once two reads agree: rows reach the database in batches about a second apart."""
    seen: list[list[dict[str, Any]]] = [decisions(c, since_ms)]

    def stable() -> bool:
        seen.append(decisions(c, since_ms))
        return len(seen[-1]) == len(seen[-2]) and len(seen[-1]) > 0

    wait_for(stable, timeout=15, interval=1.2)
    return seen[-1]


def now_ms() -> int:
    return int(time.time() * 1000)
