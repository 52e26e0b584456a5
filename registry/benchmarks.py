"""Starting and reading model calibrations on any node of the cluster (`/router/v1/benchmarks`,
`/router/v1/benchmarks/run`).

The calibration itself runs on the node that holds the model (proxy/edge/benchmark.py): its
requests must be served by that node's own runtimes for its own fits. A master reaches another
node through the node protocol (`/router/v1/node/benchmarks[/run]`) with the cluster token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from registry.nodeclient import NodeCallError
from registry.ports import Calibrations, RegistryNode
from routerproject.errors import RouterError

NODE_PATH = "/router/v1/node/benchmarks"


def _local(node: RegistryNode) -> Calibrations:
    if node.benchmarks is None:
        raise RouterError(503, "this node runs no benchmarks", type="backend_error")
    return node.benchmarks


async def _remote(
    node: RegistryNode, node_id: str, method: str, path: str, body: dict[str, Any] | None
) -> dict[str, Any]:
    remote = node.cluster.nodes.get(node_id)
    if remote is None:
        raise RouterError(404, f'node "{node_id}" is not known', type="not_found", param="node_id")
    if node.client is None:
        raise RouterError(502, "this node has no cluster client", type="backend_error")
    try:
        status, doc = await node.client.call_json(method, remote.node_url, path, json=body)
    except NodeCallError as exc:
        raise RouterError(
            502, f'node "{node_id}" did not answer: {exc}', type="backend_error"
        ) from exc
    if 200 <= status < 300 and isinstance(doc, dict):
        return doc
    err = doc.get("error") if isinstance(doc, dict) else None
    err = err if isinstance(err, dict) else {}
    message = f'node "{node_id}" refused: {err.get("message") or doc}'
    if status in (400, 404, 409):
        # The node's own verdict (an unknown model, a run already under way) as it is.
        kind = err.get("type") or ("not_found" if status == 404 else "invalid_request_error")
        raise RouterError(
            status, message, type=str(kind), param=err.get("param"), code=err.get("code")
        )
    raise RouterError(502, message, type="backend_error")


async def benchmark_start(
    *, node: RegistryNode, node_id: str | None, models: Sequence[str] | None
) -> dict[str, Any]:
    """Start calibrating `models` of node `node_id` (default this node); that node's status."""
    if not node_id or node_id == node.node_id:
        return _local(node).start(models)
    body: dict[str, Any] = {"node_id": node_id}
    if models is not None:
        body["models"] = list(models)
    return await _remote(node, node_id, "POST", NODE_PATH + "/run", body)


async def benchmark_status(*, node: RegistryNode, node_id: str | None) -> dict[str, Any]:
    """The calibrations of node `node_id` (default this node): running, pending, results."""
    if not node_id or node_id == node.node_id:
        return _local(node).status()
    return await _remote(node, node_id, "GET", NODE_PATH, None)
