"""Helpers for bench/lending.py: the offline optimum, bursts, cluster polling, decision rows.

Everything here talks to real router processes started by ``tests.harness`` on loopback;
every wait is bounded and polls a condition instead of sleeping for a fixed time.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

from tests.harness import CLUSTER_TOKEN, Cluster, RouterNode

AUTH_HEADERS = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
HTTP_TIMEOUT_SECS = 60.0
BURST_TIMEOUT_SECS = 120.0
POLL_INTERVAL_SECS = 0.1
DECISIONS_LIMIT = 5000
# The decision log reaches the database within about a second; rows are re-read until two
# reads a little apart agree, so a count is never taken from a half-flushed log.
DECISIONS_SETTLE_SECS = 1.2
DECISIONS_SETTLE_TIMEOUT_SECS = 15.0


def optimum_ms(n: int, owner_ms: float, helper_ms: float, switch_ms: float) -> tuple[float, int]:
    """Best makespan of ``n`` jobs split between owner and helper, and the helper's share.

    The owner takes ``owner_ms`` per job; the helper ``helper_ms`` per job plus a one-time
    ``switch_ms`` if it gets any job at all.
    """
    best, best_k = owner_ms * n, 0
    for k in range(1, n + 1):
        span = max(owner_ms * (n - k), switch_ms + helper_ms * k)
        if span < best:
            best, best_k = span, k
    return best, best_k


def percentile(values: Iterable[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(0, math.ceil(pct / 100.0 * len(ordered)) - 1)
    return ordered[rank]


JSON_HEADERS = {"Content-Type": "application/json"}


def chat_body(model: str, max_tokens: int, content: str = "hi") -> bytes:
    """One encoding for every request: the fits are uniform and price only work within 10 %
    of what they saw, so warm-up and burst bodies must be byte for byte the same size (httpx
    and aiohttp serialise JSON with different separators)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass
class Burst:
    """The outcome of ``n`` identical requests sent at once."""

    started_wall_ms: int
    makespan_ms: float
    statuses: list[int]
    models: list[str]
    latencies_ms: list[float]

    @property
    def ok(self) -> bool:
        return all(status == 200 for status in self.statuses)


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, t0: float
) -> tuple[int, str, float]:
    async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
        raw = await resp.read()
        status = resp.status
    model = ""
    if status == 200:
        doc = json.loads(raw)
        model = str(doc.get("model", "")) if isinstance(doc, dict) else ""
    return status, model, (time.perf_counter() - t0) * 1000.0


async def burst(node: RouterNode, model: str, n: int, max_tokens: int) -> Burst:
    """Send ``n`` identical chat requests to ``node`` at once; makespan to the last answer."""
    url = node.base_url + "/v1/chat/completions"
    body = chat_body(model, max_tokens)
    timeout = aiohttp.ClientTimeout(total=BURST_TIMEOUT_SECS)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        started_wall_ms = int(time.time() * 1000)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_one(session, url, body, t0) for _ in range(n)))
    return Burst(
        started_wall_ms=started_wall_ms,
        makespan_ms=max(r[2] for r in results),
        statuses=[r[0] for r in results],
        models=[r[1] for r in results],
        latencies_ms=[r[2] for r in results],
    )


def wait_until(
    predicate: Callable[[], Any], *, timeout_secs: float, what: str, interval: float = 0.1
) -> Any:
    """Poll ``predicate`` until it returns something truthy; RuntimeError naming ``what``."""
    deadline = time.monotonic() + timeout_secs
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_secs:.0f}s waiting for {what}")
        time.sleep(interval)


def runtime_status(node: RouterNode) -> dict[str, Any]:
    """The node's own runtime status (what the master's planner polls)."""
    resp = httpx.get(
        node.base_url + "/router/v1/node/runtime-status",
        headers=AUTH_HEADERS,
        timeout=HTTP_TIMEOUT_SECS,
    )
    resp.raise_for_status()
    doc: dict[str, Any] = resp.json()
    return doc


def priced(status: Mapping[str, Any], model_id: str, *, tokens: bool = False) -> bool:
    """Whether a runtime status publishes a text fit (and token profile) for ``model_id``."""
    costs = status.get("costs") or {}
    fit = any(
        row.get("model_id") == model_id and row.get("section") == "llm"
        for row in costs.get("models", [])
    )
    if not tokens:
        return fit
    return fit and any(row.get("model_id") == model_id for row in costs.get("tokens", []))


def fitted_ms(status: Mapping[str, Any], model_id: str) -> float | None:
    """The published per-job price (fit base) of ``model_id``; work is uniform in this bench."""
    costs = status.get("costs") or {}
    for row in costs.get("models", []):
        if row.get("model_id") == model_id and row.get("section") == "llm":
            return round(float(row.get("base_ms", 0.0)), 1)
    return None


def load_priced(status: Mapping[str, Any], config_filename: str) -> bool:
    costs = status.get("costs") or {}
    return any(row.get("config_filename") == config_filename for row in costs.get("loads", []))


@dataclass
class ClusterOps:
    """Management calls on one benchmark cluster (through its master)."""

    cluster: Cluster
    owner: str = "o"
    helper: str = "h"
    log: list[str] = field(default_factory=list)

    @property
    def master(self) -> RouterNode:
        return self.cluster.master

    def node(self, name: str) -> RouterNode:
        return self.cluster.slaves[name]

    def _client(self) -> httpx.Client:
        return self.master.client(timeout=HTTP_TIMEOUT_SECS)

    def load(self, model: str) -> None:
        with self._client() as client:
            resp = client.post("/router/v1/load", json={"model": model})
        if resp.status_code != 200:
            raise RuntimeError(f"load {model}: {resp.status_code} {resp.text}")

    def ask(self, node_name: str, model: str, max_tokens: int) -> float:
        """One direct request to a slave; its latency in ms."""
        t0 = time.perf_counter()
        with self.node(node_name).client(timeout=HTTP_TIMEOUT_SECS) as client:
            resp = client.post(
                "/v1/chat/completions", content=chat_body(model, max_tokens), headers=JSON_HEADERS
            )
        if resp.status_code != 200:
            raise RuntimeError(f"{model} on {node_name}: {resp.status_code} {resp.text}")
        return (time.perf_counter() - t0) * 1000.0

    def link(self, owner_model: str, helper_model: str, *, restore: bool = False) -> None:
        body = {
            "anchor": {"node_id": self.owner, "model_id": owner_model},
            "lends_to": [
                {
                    "node_id": self.helper,
                    "model_id": helper_model,
                    "load_if_unloaded": True,
                    "restore_after_borrow": restore,
                }
            ],
            "acknowledge_different_weights": True,
        }
        with self._client() as client:
            resp = client.post("/router/v1/site/text-routing-groups", json=body)
        if resp.status_code != 200 or "node_errors" in resp.json():
            raise RuntimeError(f"link: {resp.status_code} {resp.text}")
        self._wait_enrolled(owner_model, True)

    def unlink(self, owner_model: str) -> None:
        with self._client() as client:
            resp = client.delete(
                "/router/v1/site/text-routing-groups",
                params={"node_id": self.owner, "model_id": owner_model},
            )
        if resp.status_code != 200 or "node_errors" in resp.json():
            raise RuntimeError(f"unlink: {resp.status_code} {resp.text}")
        self._wait_enrolled(owner_model, False)

    def _wait_enrolled(self, owner_model: str, enrolled: bool) -> None:
        # The owner lists a text queue entry for each enrolled model once the links reach it.
        def check() -> bool:
            queue = runtime_status(self.node(self.owner)).get("text_queue") or []
            present = any(q.get("model_id") == owner_model for q in queue)
            return present == enrolled

        wait_until(check, timeout_secs=20, what=f"owner enrollment = {enrolled}")

    def settings(self, values: Mapping[str, str]) -> None:
        with self._client() as client:
            resp = client.post("/router/v1/site/offload/settings", json={"values": dict(values)})
        if resp.status_code != 200:
            raise RuntimeError(f"settings: {resp.status_code} {resp.text}")

    def effective_settings(self) -> dict[str, Any]:
        with self._client() as client:
            doc: dict[str, Any] = client.get("/router/v1/site/offload/settings").json()
        return doc

    def decisions(self, since_ms: int) -> list[dict[str, Any]]:
        with self._client() as client:
            doc = client.get(
                "/router/v1/site/offload/decisions",
                params={"limit": str(DECISIONS_LIMIT), "since_ms": str(since_ms)},
            ).json()
        if "node_errors" in doc:
            raise RuntimeError(f"decisions: {doc['node_errors']}")
        rows: list[dict[str, Any]] = doc["records"]
        return rows

    def settled_decisions(self, since_ms: int) -> list[dict[str, Any]]:
        """Decision rows since ``since_ms`` once two reads a little apart agree."""
        deadline = time.monotonic() + DECISIONS_SETTLE_TIMEOUT_SECS
        rows = self.decisions(since_ms)
        while True:
            time.sleep(DECISIONS_SETTLE_SECS)
            again = self.decisions(since_ms)
            if len(again) == len(rows) or time.monotonic() > deadline:
                return again
            rows = again


def summarize_decisions(rows: list[dict[str, Any]], owner: str) -> dict[str, Any]:
    """Counts and prices from one run's decision rows (plan rows on the master)."""
    plans = [r for r in rows if r.get("kind") == "plan"]
    lent = [r for r in rows if r.get("outcome") == "lent" and r.get("node_id") == owner]
    granted = [r for r in plans if r.get("outcome") == "granted"]
    outcomes: dict[str, int] = {}
    for row in plans:
        key = f"{row.get('outcome')}/{row.get('reason') or '-'}"
        outcomes[key] = outcomes.get(key, 0) + 1
    other: dict[str, int] = {}
    for row in rows:
        if row.get("kind") == "plan" or row.get("outcome") == "lent":
            continue
        key = f"{row.get('kind')}:{row.get('outcome')}/{row.get('reason') or '-'}"
        other[key] = other.get(key, 0) + 1
    first_priced = next(
        (r for r in reversed(plans) if r.get("keep_ms") and r.get("service_ms")), None
    )
    return {
        "lent": len(lent),
        "max_lent_out": max((int(r.get("lent_out", 0)) for r in lent), default=0),
        "granted_slots": sorted({int(r.get("slots", 0)) for r in granted}),
        "plan_outcomes": outcomes,
        "other_outcomes": other,
        "returned": sum(1 for r in rows if r.get("outcome") == "returned"),
        "relay_refused": sum(1 for r in rows if r.get("outcome") == "relay_refused"),
        "first_priced_plan": _price_fields(first_priced),
    }


def _price_fields(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    keys = (
        "outcome",
        "reason",
        "pending_count",
        "backlog_count",
        "keep_ms",
        "switch_ms",
        "restore_ms",
        "service_ms",
        "owner_job_ms",
        "service_source",
        "helper_idle_ms",
        "slots",
    )
    return {key: _round(row.get(key, 0)) for key in keys}


def _round(value: Any) -> Any:
    return round(value, 1) if isinstance(value, float) else value
