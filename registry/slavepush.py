"""The master's push of one document to its slaves (links, settings, guardians, the key table).

Every push goes to all registered slaves at once (or to one that needs to catch up). Delivery
failures are logged only when a slave's outcome for that path changes, so a dead slave does not
flood the log on every tick.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from registry.nodeclient import NodeCallError
from registry.outcomelog import OutcomeLog
from registry.ports import ClusterMember

logger = logging.getLogger(__name__)

_outcomes: dict[tuple[str, str], OutcomeLog] = {}


async def push_to_slaves(
    node: ClusterMember,
    path: str,
    body: Any,
    *,
    only: str | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 (the node client applies it per call)
    what: str | None = None,
) -> dict[str, str]:
    """POST `body` to `path` on every registered slave (or just `only`); node_id → error.

    `what` names the document in log lines (the path by default).
    """
    client = node.client
    if node.role != "master" or client is None:
        return {}
    targets = [
        (n.node_id, n.node_url)
        for n in node.cluster.nodes.values()
        if only is None or n.node_id == only
    ]

    async def one(node_id: str, url: str) -> tuple[str, str]:
        try:
            status, doc = await client.call_json("POST", url, path, json=body, timeout=timeout)
        except NodeCallError as exc:
            return node_id, str(exc)
        if not 200 <= status < 300:
            return node_id, f"HTTP {status}: {doc}"
        return node_id, ""

    results = await asyncio.gather(*(one(nid, url) for nid, url in targets))
    errors = {}
    for node_id, error in results:
        outcome = _outcomes.get((node_id, path))
        if outcome is None:
            outcome = OutcomeLog(logger, f"push of {what or path} to {node_id}")
            _outcomes[(node_id, path)] = outcome
        outcome.note(error)
        if error:
            errors[node_id] = error
    return errors
