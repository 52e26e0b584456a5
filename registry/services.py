"""Services over the node's models: records, explicit load and unload, node state."""

from __future__ import annotations

import time
from typing import Any

from proxy.backends import Lane
from proxy.node import Node
from registry.cluster import RemoteNode
from registry.identity import Assignment, IdentityKey
from registry.kcpps import ModelConfig
from routerproject.errors import RouterError

UNLOAD_TARGETS = ("text", "image", "embeddings", "voice", "music", "all")


def model_records(*, node: Node) -> list[dict[str, Any]]:
    """Every model record of the cluster view (this node's own on a slave or standalone)."""
    node.cluster.rebuild()  # refresh this node's own `loaded` flags
    return node.cluster.records()


def _lanes(cfg: ModelConfig) -> list[Lane]:
    lanes: list[Lane] = []
    if cfg.has_llm or cfg.has_embeddings:
        lanes.append("text")
    if cfg.has_image:
        lanes.append("image")
    if cfg.has_voice:
        lanes.append("whisper")
    return lanes


def _resolve(node: Node, model_id: str) -> ModelConfig:
    cfg = node.catalog.configs.get(model_id) or node.catalog.image_ids.get(model_id)
    if cfg is None:
        raise RouterError(404, f'model "{model_id}" was not found', code="model_not_found")
    return cfg


def _owner(node: Node, model_id: str) -> tuple[str, str, str]:
    """(node_id, node_url, local_id) of the replica to act on for a public model ID."""
    replicas = node.cluster.by_public_id.get(model_id) or node.cluster.by_public_image_id.get(
        model_id
    )
    if not replicas:
        raise RouterError(404, f'model "{model_id}" was not found', code="model_not_found")
    local = [r for r in replicas if r.is_local]
    if local:
        return local[0].node_id, "", local[0].local_id
    healthy = [r for r in replicas if r.available]
    if not healthy:
        raise RouterError(
            503,
            f'model "{model_id}" is unavailable: its node is not healthy',
            type="backend_error",
            code="node_unavailable",
        )
    return healthy[0].node_id, healthy[0].node_url, healthy[0].local_id


async def _remote_call(node: Node, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    from registry.nodeclient import NodeCallError

    assert node.client is not None
    try:
        status, doc = await node.client.call_json(
            "POST", url, path, json=body, timeout=node.config.backend.load_timeout
        )
    except NodeCallError as exc:
        raise RouterError(502, f"node at {url} failed: {exc}", type="backend_error") from exc
    if not 200 <= status < 300:
        message = doc.get("error", {}).get("message", str(doc)) if isinstance(doc, dict) else doc
        raise RouterError(status if status >= 400 else 502, str(message), type="backend_error")
    return doc if isinstance(doc, dict) else {"ok": True}


async def model_load(*, node: Node, model_id: str) -> dict[str, Any]:
    """Explicit load of a public model ID, on the node that owns it."""
    owner, url, local_id = _owner(node, model_id)
    if url:
        result = await _remote_call(node, url, "/router/v1/node/load", {"model": local_id})
        result["node_id"] = owner
        return result
    return await model_load_local(node=node, model_id=local_id)


async def model_unload(*, node: Node, model_id: str | None, target: str | None) -> dict[str, Any]:
    if model_id:
        owner, url, local_id = _owner(node, model_id)
        if url:
            result = await _remote_call(node, url, "/router/v1/node/unload", {"model": local_id})
            result["node_id"] = owner
            return result
        return await model_unload_local(node=node, model_id=local_id, target=target)
    return await model_unload_local(node=node, model_id=None, target=target)


async def model_load_local(*, node: Node, model_id: str) -> dict[str, Any]:
    """Load every lane the config needs, waiting for running requests like any other switch."""
    cfg = _resolve(node, model_id)
    started = time.monotonic()
    loaded: list[str] = []
    for lane in _lanes(cfg):
        runtime = node.runtimes.runtime_for(cfg, lane)
        await runtime.load(cfg)
        loaded.append(lane)
    return {
        "ok": True,
        "node_id": node.node_id,
        "model": cfg.local_id,
        "lanes": loaded,
        "duration_ms": round((time.monotonic() - started) * 1000.0, 1),
    }


async def model_unload_local(
    *, node: Node, model_id: str | None, target: str | None
) -> dict[str, Any]:
    unloaded: list[str] = []
    if model_id:
        cfg = _resolve(node, model_id)
        for runtime, current in node.runtimes.loaded():
            if current.filename == cfg.filename and await runtime.unload():
                unloaded.append(runtime.lane)
    else:
        lanes = {
            "text": ["text"],
            "embeddings": ["text"],
            "voice": ["whisper"],
            "music": [],
            "image": ["image"],
            "all": ["text", "image", "whisper"],
        }[target or "all"]
        for lane in lanes:
            if await node.runtimes.runtimes[lane].unload():  # type: ignore[index]
                unloaded.append(lane)
    return {"ok": True, "node_id": node.node_id, "unloaded": unloaded}


def node_state(*, node: Node) -> dict[str, Any]:
    backends = []
    active = []
    for runtime in node.runtimes.all():
        status = runtime.status()
        loaded = []
        if runtime.current is not None:
            loaded.append(
                {
                    "model_id": runtime.current.local_id,
                    "lane": runtime.lane,
                    "runtime_id": runtime.lane,
                    "generation": runtime.generation,
                    "borrowed": False,
                }
            )
            active.extend([runtime.current.local_id] * runtime.active)
        backends.append(
            {
                "id": f"{runtime.lane}-runtime",
                "display_name": status["family"] or runtime.lane,
                "mode": node.config.backend.mode,
                "lifecycle_state": status["state"],
                "loaded_models": loaded,
                "active": status["active"],
                "waiting": status["waiting"],
                "loading": status["loading"],
                "last_error": status["last_error"],
                "pid": status["pid"],
                "base_url": runtime.launch.base_url if runtime.launch else None,
            }
        )
    return {
        "node_id": node.node_id,
        "role": node.config.cluster.role,
        "backends": backends,
        "active_requests": active,
        "held_requests": [],
        "analytics_buffered": node.recorder.pending(),
    }


def public_ids_save(*, assignments: dict[IdentityKey, Assignment]) -> None:
    """Make the stored assignment table equal `assignments` (idempotent)."""
    from django.db import transaction

    from registry.models import PublicIdAssignment

    with transaction.atomic():
        existing = {
            (r.node_id, r.local_id, r.identity): r for r in PublicIdAssignment.objects.all()
        }
        for key, a in assignments.items():
            row = existing.pop(key, None)
            if row is None:
                PublicIdAssignment.objects.create(
                    node_id=a.node_id,
                    local_id=a.local_id,
                    identity=a.identity,
                    public_id=a.public_id,
                )
            elif row.public_id != a.public_id:
                PublicIdAssignment.objects.filter(pk=row.pk).update(public_id=a.public_id)
        if existing:
            PublicIdAssignment.objects.filter(pk__in=[r.pk for r in existing.values()]).delete()


async def remote_node_state(*, node: Node, remote: RemoteNode) -> dict[str, Any]:
    from registry.nodeclient import NodeCallError

    if node.client is None:
        raise RouterError(502, "this node has no cluster client", type="backend_error")
    try:
        doc = await node.client.call_ok("GET", remote.node_url, "/router/v1/node/state")
    except NodeCallError as exc:
        raise RouterError(
            502, f"node {remote.node_id!r} did not answer: {exc}", type="backend_error"
        ) from exc
    return doc if isinstance(doc, dict) else {}


def cluster_state(*, node: Node) -> dict[str, Any]:
    """`site/nodes/state` without a node: every node's health as the master sees it."""
    return {
        "node_id": node.node_id,
        "role": node.role,
        "revision": node.cluster.revision,
        "nodes": node.cluster.node_summaries(),
    }
