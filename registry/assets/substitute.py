"""Pointing one portable reference of a config at a verified hub file (reference §7.4).

The config file is rewritten in place, atomically, and only when it has not changed since it
was read; the node then runs the config as loaded from the new file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry import hforigin
from registry.assets.routes import BIND_FIELDS, hub_origin, verify_hub_file
from registry.assets.service import AssetNode, AssetService
from registry.assets.store import check_filename, check_sha256, in_db, write_atomically
from registry.hashing import PATH_FIELDS, PORTABLE_HASH_SUFFIX
from registry.hforigin import HfOrigin
from registry.kcpps import (
    PORTABLE_FILENAME_SUFFIX,
    ModelConfig,
    ModelConfigError,
    load_model_config,
)
from routerproject.errors import RouterError

SUBSTITUTE_FIELDS = BIND_FIELDS | {
    "id",
    "filename",
    "field",
    "position",
    "expected_sha256",
    "confirm",
}
_config_locks: dict[str, asyncio.Lock] = {}


def _fingerprint(path: Path) -> tuple[bytes, str]:
    data = path.read_bytes()
    return data, hashlib.sha256(data).hexdigest()


def _conflict(message: str, param: str) -> RouterError:
    return RouterError(409, message, param=param, code="model_asset_conflict")


def _substituted(
    raw: dict[str, Any],
    name: str,
    position: int | None,
    expected: str,
    new: str,
    hf: str,
    filename: str,
) -> dict[str, Any]:
    """The config with reference (`name`, `position`) moved from `expected` to `new`."""
    hash_key = name + PORTABLE_HASH_SUFFIX
    current = raw.get(hash_key)
    out = dict(raw)
    if isinstance(current, list):
        if position is None or not 0 <= position < len(current):
            raise RouterError(
                400, f"position must index {hash_key} (0..{len(current) - 1})", param="position"
            )
        if current[position] != expected:
            raise _conflict(
                f"{hash_key}[{position}] is {current[position]!r} now, not {expected}", "field"
            )
        hashes = list(current)
        hashes[position] = new
        out[hash_key] = hashes
        names = raw.get(name + PORTABLE_FILENAME_SUFFIX)
        if isinstance(names, list) and len(names) == len(hashes):
            names = list(names)
            names[position] = filename
            out[name + PORTABLE_FILENAME_SUFFIX] = names
        # A list's origins must all be hub references, so a single one is not added to it:
        # the binding stored for the hash serves instead.
        origins = raw.get(name + "_hf")
        if isinstance(origins, list) and len(origins) == len(hashes):
            origins = list(origins)
            origins[position] = hf
            out[name + "_hf"] = origins
        return out
    if position not in (None, 0):
        raise RouterError(400, f"{name} is not a list field: position must be 0", param="position")
    if current != expected:
        raise _conflict(f"{hash_key} is {current!r} now, not {expected}", "field")
    out[hash_key] = new
    out[name + PORTABLE_FILENAME_SUFFIX] = filename
    out[name + "_hf"] = hf
    return out


async def local_substitute(service: AssetService, doc: Mapping[str, Any]) -> dict[str, Any]:
    """Point one portable reference of a config at a verified hub file (reference §7.4)."""
    cfg = _config_asked(service.node, doc)
    change = _change_asked(doc)
    await verify_hub_file(change.origin, change.sha256, doc.get("token"))
    lock = _config_locks.setdefault(str(cfg.path), asyncio.Lock())
    async with lock:
        await _rewrite(service, cfg, change)
    return {"sha256": change.sha256, "hf": change.origin.uri}


@dataclass(frozen=True)
class _Change:
    """Reference (`field`, `position`) of a config goes from `expected` to `sha256`, the file
    `filename` at `origin`."""

    field: str
    position: int | None
    expected: str
    sha256: str
    origin: HfOrigin
    filename: str


def _config_asked(node: AssetNode, doc: Mapping[str, Any]) -> ModelConfig:
    """The config a substitute names, once the body is known to be one."""
    unknown = sorted(set(doc) - SUBSTITUTE_FIELDS)
    if unknown:
        raise RouterError(400, f"{unknown[0]} is not a field of a substitute", param=unknown[0])
    if doc.get("confirm") is not True:
        raise RouterError(
            400, "confirm must be true: the config file is rewritten", param="confirm"
        )
    model_id = doc.get("id")
    cfg = node.catalog.configs.get(model_id) if isinstance(model_id, str) else None
    if cfg is None:
        raise RouterError(
            404,
            f"model {model_id!r} is not a model config on node {node.node_id!r}",
            type="not_found",
            param="id",
            code="model_not_found",
        )
    return cfg


def _change_asked(doc: Mapping[str, Any]) -> _Change:
    name = doc.get("field")
    if name not in PATH_FIELDS:
        raise RouterError(400, "field must be a model path field (e.g. model_param)", param="field")
    position = doc.get("position")
    if position is not None and (not isinstance(position, int) or isinstance(position, bool)):
        raise RouterError(400, "position must be an integer", param="position")
    expected = check_sha256(doc.get("expected_sha256"), "expected_sha256")
    sha256 = check_sha256(doc.get("sha256"), "sha256")
    origin = hub_origin(doc)
    filename = check_filename(origin.path.rsplit("/", 1)[-1], "repository_path")
    return _Change(str(name), position, expected, sha256, origin, filename)


async def _rewrite(service: AssetService, cfg: ModelConfig, change: _Change) -> None:
    """Rewrite the config file with the change, unless it changed meanwhile, and run the
    config as loaded from it."""
    data, before = await asyncio.to_thread(_fingerprint, cfg.path)
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise _conflict(f"{cfg.filename} is not valid JSON now: {exc}", "id") from exc
    if not isinstance(raw, dict):
        raise _conflict(f"{cfg.filename} is not a JSON object now", "id")
    new_raw = _substituted(
        raw,
        change.field,
        change.position,
        change.expected,
        change.sha256,
        change.origin.uri,
        change.filename,
    )
    await in_db(hforigin.bind, change.sha256, change.origin)
    text = json.dumps(new_raw, indent=2).encode()
    _data, now = await asyncio.to_thread(_fingerprint, cfg.path)
    if now != before:
        raise _conflict(f"{cfg.filename} changed while it was being rewritten", "id")
    await asyncio.to_thread(write_atomically, cfg.path, text)
    try:
        fresh = await asyncio.to_thread(
            load_model_config,
            cfg.path,
            default_backend_mode=service.node.config.backend.mode,
            hasher=service.hasher,
        )
    except ModelConfigError as exc:
        raise RouterError(500, f"the rewritten config is refused: {exc}") from exc
    service._install(fresh)
