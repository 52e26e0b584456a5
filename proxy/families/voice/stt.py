"""Selector-less speech-to-text scheduling (a transcription request that names no model).

The choice uses every node's authenticated runtime status (whole-node active + queued work),
in tiers, stopping at the first that yields a pick:

1. a local config that is the locally loaded STT config (it wins even when busy);
2. a remote config its node has loaded as its STT config, shortest active + queued first;
3. any candidate on a wholly idle node;
4. a local candidate, which queues locally (the reference allows this only on a master and
   answers 503 elsewhere; any role queues locally here);
5. a remote candidate on the node with the shortest queue.

Equal candidates rotate: one counter for the whole node advances on every pick. The chosen
replica is reserved (its node's workload goes up) before anything awaits, so concurrent picks
see it and a config about to load is not chosen twice over an idle one. Nodes that do not
answer runtime status stay usable by name but take no part here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from proxy.node import Node
from registry.cluster import Replica
from registry.nodeclient import NodeCallError
from routerproject.errors import RouterError

STATUS_BUDGET_SECS = 5.0
STATUS_CONCURRENCY = 8

_counter = itertools.count()
_reserved: Counter[str] = Counter()


@dataclass(frozen=True)
class _Candidate:
    replica: Replica
    status: dict[str, Any]

    @property
    def workload(self) -> int:
        active = int(self.status.get("active_requests", 0))
        queued = int(self.status.get("queued_requests", 0))
        return active + queued + _reserved[self.replica.node_id]

    @property
    def queued(self) -> int:
        return int(self.status.get("queued_requests", 0)) + _reserved[self.replica.node_id]

    @property
    def loaded(self) -> bool:
        return self.status.get("active_stt_config_filename") == self.replica.record.get("filename")

    @property
    def sort_key(self) -> str:
        return f"{self.replica.node_id}|{self.replica.record.get('filename', '')}"


async def _remote_statuses(node: Node, node_ids: set[str]) -> dict[str, dict[str, Any]]:
    client = node.client
    if client is None or not node_ids:
        return {}
    limit = asyncio.Semaphore(STATUS_CONCURRENCY)
    urls = {n.node_id: n.node_url for n in node.cluster.nodes.values() if n.node_id in node_ids}

    async def one(node_id: str, url: str) -> tuple[str, dict[str, Any] | None]:
        async with limit:
            try:
                doc = await client.call_ok("GET", url, "/router/v1/node/runtime-status")
            except NodeCallError:
                return node_id, None
        if not isinstance(doc, dict) or not doc.get("node_id"):
            return node_id, None
        return node_id, doc

    results: dict[str, dict[str, Any]] = {}
    tasks = [asyncio.ensure_future(one(nid, url)) for nid, url in urls.items()]
    done, pending = await asyncio.wait(tasks, timeout=STATUS_BUDGET_SECS)
    for task in pending:
        task.cancel()
    for task in done:
        node_id, doc = task.result()
        if doc is not None:
            results[node_id] = doc
    return results


def _pick(group: list[_Candidate], key: str = "workload") -> _Candidate:
    best = min(getattr(c, key) for c in group)
    tied = sorted((c for c in group if getattr(c, key) == best), key=lambda c: c.sort_key)
    return tied[next(_counter) % len(tied)]


def choose(local: list[_Candidate], remote: list[_Candidate]) -> _Candidate | None:
    tier1 = [c for c in local if c.loaded]
    if tier1:
        return _pick(tier1)
    tier2 = [c for c in remote if c.loaded]
    if tier2:
        return _pick(tier2)
    tier3 = [c for c in local + remote if c.workload == 0]
    if tier3:
        return _pick(tier3)
    if local:
        return _pick(local)
    if remote:
        return _pick(remote, "queued")
    return None


@contextlib.asynccontextmanager
async def reserve(node: Node) -> AsyncIterator[Replica]:
    voice = [
        r
        for replicas in node.cluster.by_public_id.values()
        for r in replicas
        if r.record.get("has_voice") and r.available and not r.record.get("disabled")
    ]
    local_status = node.runtime_status()
    local = [_Candidate(r, local_status) for r in voice if r.is_local]
    statuses = await _remote_statuses(node, {r.node_id for r in voice if not r.is_local})
    remote = [_Candidate(r, statuses[r.node_id]) for r in voice if r.node_id in statuses]
    picked = choose(local, remote)
    if picked is None:
        raise RouterError(
            503, "no compatible transcription configuration is available", type="backend_error"
        )
    node_id = picked.replica.node_id
    _reserved[node_id] += 1
    try:
        yield picked.replica
    finally:
        _reserved[node_id] -= 1
