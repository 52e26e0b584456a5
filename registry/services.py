"""Services over the node's models: records, explicit load and unload, node state."""

from __future__ import annotations

import time
from typing import Any

from proxy.backends import Lane
from proxy.node import Node
from registry.kcpps import ModelConfig
from routerproject.errors import RouterError

UNLOAD_TARGETS = ("text", "image", "embeddings", "voice", "music", "all")


def _source(node: Node) -> str:
    return "master" if node.config.cluster.role == "master" else "local"


def model_records(*, node: Node) -> list[dict[str, Any]]:
    records = []
    for cfg in sorted(node.catalog.configs.values(), key=lambda c: c.local_id):
        records.append(
            cfg.to_record(
                node_id=node.node_id,
                node_url=node.config.cluster.public_url,
                source=_source(node),
                available=True,
                loaded=node.runtimes.is_loaded(cfg),
            )
        )
    return records


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


async def model_load(*, node: Node, model_id: str) -> dict[str, Any]:
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
        "model": cfg.local_id,
        "lanes": loaded,
        "duration_ms": round((time.monotonic() - started) * 1000.0, 1),
    }


async def model_unload(*, node: Node, model_id: str | None, target: str | None) -> dict[str, Any]:
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
    return {"ok": True, "unloaded": unloaded}


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
