"""Ask every node of the cluster the same question, concurrently; a node that fails is reported,
never waited on past the control timeout and never allowed to spoil the others' answers.

The timeout is one deadline for the whole question, not one per node: with a thousand nodes
the calls do not all start at once, and a page must not wait for the last one's own timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from lending.ports import LendingNode
from registry.nodeclient import NodeCallError


async def gather_remote(
    node: LendingNode,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    node_ids: set[str] | None = None,
    deadline: float | None = None,
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """GET `path` on every registered node (or those in `node_ids`): answers and node_errors.

    `deadline`: seconds for all of them (`cluster.control_timeout` by default); a node that has
    not answered by then is in node_errors.
    """
    client = node.client
    targets = [n for n in node.cluster.nodes.values() if node_ids is None or n.node_id in node_ids]
    if client is None or not targets:
        return {}, []
    query = f"?{urlencode(params)}" if params else ""
    limit = node.config.cluster.control_timeout if deadline is None else deadline

    async def one(node_id: str, url: str, healthy: bool) -> tuple[str, Any, str]:
        if not healthy:
            return node_id, None, "node is not healthy"
        try:
            return node_id, await client.call_ok("GET", url, path + query, timeout=limit), ""
        except NodeCallError as exc:
            return node_id, None, str(exc)

    tasks = {asyncio.ensure_future(one(n.node_id, n.node_url, n.healthy)): n for n in targets}
    done, late = await asyncio.wait(tasks, timeout=limit)
    for task in late:
        task.cancel()
    # Their cancellation is immediate (no call outlives the deadline): collect it.
    await asyncio.gather(*late, return_exceptions=True)
    results = [task.result() for task in done]
    results += [(tasks[task].node_id, None, f"no answer within {limit:g} s") for task in late]
    answers = {nid: doc for nid, doc, err in results if not err}
    errors = [{"node_id": nid, "error": err} for nid, _, err in sorted(results) if err]
    return answers, errors
