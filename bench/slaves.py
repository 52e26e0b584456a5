"""A slave emulator: one asyncio process that answers the node protocol for N slaves.

Each emulated slave listens on its own loopback port (the master's `cluster.slave_urls` names
every slave by URL) and answers what a real slave answers to what a master asks: its snapshot
(`node/models`, also the register body), `runtime-status`, `state`, the pushes (links,
lending settings, guardians, the key table), grants, model state, load and unload, the site
fan-outs (summary, decisions, folds, timeline, usage, audit, inventory) and lent or forwarded
inference requests, answered after a simulated duration. It also does what a slave does on
its own: registers with the master at start and every `sync_interval`, pulls the key table
every second (registry/keysync.py) and reports queue events (`offload/event`) for the
backlogs a bench gives it.

Nothing here is product code: it exists so that a real master can be driven with a thousand
nodes on one machine (bench/scale.py). The shapes of its answers are checked against a real
slave's by tests/test_slave_emulator.py.

Run on its own (e.g. to look at a 300-node cluster in the WebUI; the master's config must list
the same URLs in `cluster.slave_urls`):

    .venv/bin/python -m bench.slaves --master http://127.0.0.1:8080 --token T \\
        --nodes 300 --first-port 21000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from access.keys import KeyTable
from lending.keys import KEYS_BY_NAME, LendingSettingError, canonical_value, default_values
from lending.keys import fingerprint as settings_fingerprint
from lending.planner import Lease

logger = logging.getLogger("bench.slaves")

PROTOCOL_VERSION = 2
BUILD_VERSION = "0.1.0"
NODE = "/router/v1/node/"
INFERENCE = "/router/v1/node/inference"
KEYS_PULL_SECS = 1.0
CONTEXT = 4096
# The sim backend's words, so an emulated answer reads like a simulated model's.
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog")


def error(status: int, message: str, kind: str, **extra: Any) -> web.Response:
    """The router's error envelope."""
    body: dict[str, Any] = {"message": message, "type": kind}
    body.update({k: v for k, v in extra.items() if v is not None})
    return web.json_response({"error": body}, status=status)


def model_record(node_id: str, node_url: str, name: str, *, loaded: bool) -> dict[str, Any]:
    """One model record as a slave publishes it (a simulated text model)."""
    digest = hashlib.sha256(name.encode()).hexdigest()
    weights = f"{name}-model_param.sim.json"
    return {
        "public_id": name,
        "local_id": name,
        "filename": f"{name}.kcpps",
        "created": 1_700_000_000,
        "size": 81,
        "has_llm": True,
        "has_image": False,
        "has_embeddings": True,
        "has_multimodal": False,
        "has_voice": False,
        "has_tts": False,
        "has_music": False,
        "model_hash": digest,
        "config_hash": hashlib.sha256(f"config:{name}".encode()).hexdigest(),
        "capabilities": {
            "llm": True,
            "embeddings": {"model": weights, "separate": False},
            "context": CONTEXT,
        },
        "options": {
            "backend_mode": "sim",
            "contextsize": CONTEXT,
            "parallel": 1,
            "model_param": weights,
        },
        "backend_mode": "sim",
        "source": "local",
        "node_id": node_id,
        "node_url": node_url,
        "available": True,
        "loaded": loaded,
        "disabled": False,
        "context_size": CONTEXT,
        "parallel": 1,
        "text_ineligible_reason": None,
    }


def _runtime(
    ident: str, name: str, loaded: list[dict[str, Any]], base_url: str | None = None
) -> dict[str, Any]:
    """A runtime of `node/state`; a loaded one has a backend process (this one) and URL."""
    return {
        "id": ident,
        "display_name": name,
        "mode": "sim",
        "lifecycle_state": "ready" if loaded else "empty",
        "loaded_models": loaded,
        "active": 0,
        "waiting": 0,
        "loading": None,
        "load": None,
        "last_error": "",
        "last_error_at": None,
        "pid": os.getpid() if loaded else None,
        "base_url": base_url if loaded else None,
        "probe_ok": True,
        "realtime_sessions": [],
    }


@dataclass
class Backlog:
    """Held requests of one owner model, as its runtime status reports them."""

    count: int
    prompt_tokens: int = 1000
    output_tokens: int = 200

    def stats(self, model_id: str) -> dict[str, Any]:
        work = [float(self.prompt_tokens * self.count), float(self.output_tokens * self.count)]
        context = self.count * (self.prompt_tokens + self.output_tokens)
        return {
            "model_id": model_id,
            "pending_count": self.count,
            "pending_work": work,
            "pending_context": context,
            "backlog_count": self.count,
            "backlog_work": work,
            "lent_count": 0,
            "lendable_count": self.count,
            "sized_count": self.count,
            "sized_work": work,
            "sized_context": context,
            "sized_cached": [0.0, 0.0],
            "backlog_cached": [0.0, 0.0],
        }


@dataclass
class EmulatedSlave:
    """One slave's state: what it publishes and what the master pushed to it."""

    node_id: str
    port: int
    model_names: list[str]
    duration_ms: float = 0.0
    loaded: str = ""
    settings: dict[str, str] = field(default_factory=default_values)
    keys: KeyTable = field(default_factory=KeyTable)
    links: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    guardians: dict[str, Any] = field(default_factory=dict)
    disabled: set[str] = field(default_factory=set)
    backlogs: dict[str, Backlog] = field(default_factory=dict)
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    active: int = 0
    served: int = 0
    borrowed_served: int = 0
    registered: bool = False
    started_ms: float = field(default_factory=lambda: time.time() * 1000.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def records(self) -> list[dict[str, Any]]:
        out = []
        for name in self.model_names:
            rec = model_record(self.node_id, self.url, name, loaded=name == self.loaded)
            rec["disabled"] = name in self.disabled
            out.append(rec)
        return out

    def snapshot(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "node_url": self.url,
            "role": "slave",
            "models": self.records(),
            "protocol_version": PROTOCOL_VERSION,
            "minimum_protocol_version": PROTOCOL_VERSION,
            "build_version": BUILD_VERSION,
            "settings_fingerprint": settings_fingerprint(self.settings),
            "api_keys_fingerprint": self.keys.fingerprint,
        }

    def enrolled(self, lane: str) -> list[str]:
        mine = set()
        for link in self.links.get(lane, []):
            if link["owner_node_id"] == self.node_id:
                mine.add(link["owner_model_id"])
            if link["helper_node_id"] == self.node_id:
                mine.add(link["helper_model_id"])
        return sorted(mine)

    def queue_stats(self, lane: str) -> list[dict[str, Any]]:
        idle = Backlog(0)
        return [self.backlogs.get(m, idle).stats(m) for m in self.enrolled(lane)]

    def costs(self) -> dict[str, Any]:
        """Cost fits of every model (what a node publishes once it has timed some requests)."""
        return {
            "models": [
                {
                    "model_id": name,
                    "section": "llm",
                    "base_ms": 50.0 + 10.0 * i,
                    "slopes_ms": [0.2, 20.0],
                    "samples": 30,
                }
                for i, name in enumerate(self.model_names)
            ],
            "loads": [
                {"config_filename": f"{name}.kcpps", "load_ms": 2000.0} for name in self.model_names
            ],
            "tokens": [],
        }

    def runtime_status(self) -> dict[str, Any]:
        queued = sum(b.count for b in self.backlogs.values())
        return {
            "node_id": self.node_id,
            "build_version": BUILD_VERSION,
            "backend_mode": "sim",
            "active_requests": self.active,
            "queued_requests": queued,
            "active_text_config": f"{self.loaded}.kcpps" if self.loaded else "",
            "active_image_config": "",
            "text_queue": self.queue_stats("text"),
            "image_queue": self.queue_stats("image"),
            "accepting_borrowed_text": True,
            "accepting_borrowed_image": True,
            "idle_for_ms": 0 if self.active else int(time.time() * 1000.0 - self.started_ms),
            "settings_fingerprint": settings_fingerprint(self.settings),
            "costs": self.costs(),
        }

    def state(self) -> dict[str, Any]:
        loaded = (
            [
                {
                    "model_id": self.loaded,
                    "lane": "text",
                    "runtime_id": "text",
                    "generation": 1,
                    "borrowed": False,
                    "active": self.active,
                }
            ]
            if self.loaded
            else []
        )
        return {
            "node_id": self.node_id,
            "role": "slave",
            "backends": [
                _runtime("text-runtime", "sim", loaded, self.url),
                _runtime("image-runtime", "image", []),
                _runtime("whisper-runtime", "whisper", []),
            ],
            "active_requests": [],
            "held_requests": [],
            "waiting_by_key": [],
            "analytics_buffered": 0,
            "asset_transfers": [],
            "affinity": {"enabled": False, "entries": 0, "models": {}},
        }


Handler = Callable[["SlaveFarm", EmulatedSlave, web.Request], Awaitable[web.StreamResponse]]


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise web.HTTPBadRequest(
            text=json.dumps(
                {"error": {"message": f"invalid JSON body: {exc}", "type": "invalid_request_error"}}
            ),
            content_type="application/json",
        ) from exc


def _not_slave(what: str) -> web.Response:
    return error(409, f"only a slave accepts pushed {what}", "invalid_request_error")


async def on_models(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    if farm.on_poll is not None:
        farm.on_poll(time.monotonic())
    return web.json_response(slave.snapshot())


async def on_runtime_status(
    farm: SlaveFarm, slave: EmulatedSlave, request: web.Request
) -> web.Response:
    farm.status_asks += 1
    return web.json_response(slave.runtime_status())


async def on_state(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    return web.json_response(slave.state())


async def on_links(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    doc = await _json_body(request)
    if not isinstance(doc, dict):
        return error(400, "link snapshot must be a JSON object", "invalid_request_error")
    slave.links = {lane: list(doc.get(lane, [])) for lane in ("image", "text")}
    farm.pushes["links"] += 1
    return web.Response(status=204)


async def on_settings(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    doc = await _json_body(request)
    if not isinstance(doc, dict):
        return error(400, "request body must be a JSON object", "invalid_request_error")
    merged = default_values()
    for key, raw in doc.items():
        if key not in KEYS_BY_NAME:
            continue
        try:
            merged[key] = canonical_value(key, str(raw))
        except (LendingSettingError, ValueError) as exc:
            return error(400, str(exc), "invalid_request_error", param=key)
    slave.settings = merged
    farm.pushes["settings"] += 1
    return web.Response(status=204)


async def on_guardians(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    doc = await _json_body(request)
    slave.guardians = doc if isinstance(doc, dict) else {}
    farm.pushes["guardians"] += 1
    return web.Response(status=204)


async def on_api_keys(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    if request.method == "GET":
        return error(409, "a slave serves no key table", "invalid_request_error", code="not_master")
    try:
        slave.keys = KeyTable.from_wire(await _json_body(request))
    except ValueError as exc:
        return error(400, f"invalid key table: {exc}", "invalid_request_error")
    farm.pushes["keys"] += 1
    return web.Response(status=204)


async def on_grant(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    try:
        lease = Lease.from_wire(await _json_body(request))
    except ValueError as exc:
        return error(400, str(exc), "invalid_request_error")
    if lease.owner_node_id and lease.owner_node_id != slave.node_id:
        return error(
            400,
            "the lease names another owner node",
            "invalid_request_error",
            param="owner_node_id",
        )
    slave.leases[(lease.lane, lease.owner_model_id)] = lease.to_wire()
    return web.json_response(lease.to_wire())


async def on_model_state(
    farm: SlaveFarm, slave: EmulatedSlave, request: web.Request
) -> web.Response:
    doc = await _json_body(request)
    node_id = doc.get("node_id") if isinstance(doc, dict) else None
    if node_id is not None and node_id != slave.node_id:
        return error(
            409,
            f'this is node "{slave.node_id}", not {node_id!r}',
            "invalid_request_error",
            code="wrong_node",
        )
    local_id, enabled = doc.get("local_id"), doc.get("enabled")
    if not isinstance(enabled, bool):
        return error(400, "enabled must be true or false", "invalid_request_error", param="enabled")
    if local_id not in slave.model_names:
        return error(
            404,
            f'model "{local_id}" is not a model config on node "{slave.node_id}"',
            "not_found",
            param="local_id",
            code="model_not_found",
        )
    if enabled:
        slave.disabled.discard(local_id)
    else:
        slave.disabled.add(local_id)
    return web.json_response(slave.snapshot())


async def on_load(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    doc = await _json_body(request)
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, str) or not model:
        return error(400, "model is required", "invalid_request_error", param="model")
    if model not in slave.model_names:
        return error(404, f'model "{model}" is not on this node', "not_found", param="model")
    slave.loaded = model
    return web.json_response(
        {
            "ok": True,
            "node_id": slave.node_id,
            "model": model,
            "lanes": ["text"],
            "duration_ms": 0.0,
        }
    )


async def on_unload(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    unloaded = ["text"] if slave.loaded else []
    slave.loaded = ""
    return web.json_response({"ok": True, "node_id": slave.node_id, "unloaded": unloaded})


async def on_summary(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    return web.json_response(
        {
            "node_id": slave.node_id,
            "build_version": BUILD_VERSION,
            "settings_fingerprint": settings_fingerprint(slave.settings),
            "settings_source": "master" if farm.pushes["settings"] else "local",
            "held_requests": [],
        }
    )


async def on_decisions(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    return web.json_response({"records": []})


async def on_folds(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    farm.fold_asks += 1
    return web.json_response({"folds": [], "rows": 0, "truncated": False})


async def on_impact_rows(
    farm: SlaveFarm, slave: EmulatedSlave, request: web.Request
) -> web.Response:
    """No rows: an emulated slave records no requests."""
    from lending.impact import (
        IMPACT_DECISION_COLUMNS,
        IMPACT_LOAD_COLUMNS,
        IMPACT_REQUEST_COLUMNS,
    )

    def empty(columns: tuple[str, ...]) -> dict[str, list[object]]:
        return {c: [] for c in columns}

    return web.json_response(
        {
            "truncated": False,
            "requests": empty(IMPACT_REQUEST_COLUMNS),
            "loads": empty(IMPACT_LOAD_COLUMNS),
            "decisions": empty(IMPACT_DECISION_COLUMNS),
        }
    )


async def on_timeline(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    step = 15_000
    until = (int(time.time() * 1000) // step + 1) * step
    since = until - 60 * step
    zeros = [0] * 60
    return web.json_response(
        {
            "since_ms": since,
            "until_ms": until,
            "step_ms": step,
            "node": {
                "node_id": slave.node_id,
                "slots": 1,
                "own_ms": zeros,
                "borrowed_ms": zeros,
                "idle_ms": [step] * 60,
                "lent": zeros,
            },
            "owners": [],
        }
    )


async def on_usage(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    return web.json_response({"node_id": slave.node_id, "rows": []})


async def on_audit(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    return web.json_response({"rows": []})


async def on_borrowed(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    return web.json_response({"borrowed": 0})


async def on_limits(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    if request.method == "GET":
        return web.json_response({"node_id": slave.node_id, "keys": {}})
    return error(
        409, "only the master sums key limit counts", "invalid_request_error", code="not_master"
    )


async def on_inventory(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    return web.json_response(
        {
            "node_id": slave.node_id,
            "node_url": slave.url,
            "source": "local",
            "role": "slave",
            "backend_mode": "sim",
            "available": True,
            "hardware": {
                "memory": {"kind": "ram", "total_bytes": 1 << 34, "used_bytes": 1 << 30},
                "cpu_count": 2,
                "note": "",
            },
            "models": slave.records(),
            "files": None,
            "error": "",
            "build_version": BUILD_VERSION,
        }
    )


async def on_register(farm: SlaveFarm, slave: EmulatedSlave, request: web.Request) -> web.Response:
    return error(400, "cluster registry is not enabled", "cluster_error")


async def on_master_only(
    farm: SlaveFarm, slave: EmulatedSlave, request: web.Request
) -> web.Response:
    return error(
        409, "only the master decides on lending", "invalid_request_error", code="not_master"
    )


ROUTES: dict[str, tuple[frozenset[str], Handler]] = {
    "register": (frozenset({"POST"}), on_register),
    "models": (frozenset({"GET"}), on_models),
    "models/state": (frozenset({"POST"}), on_model_state),
    "runtime-status": (frozenset({"GET"}), on_runtime_status),
    "load": (frozenset({"POST"}), on_load),
    "unload": (frozenset({"POST"}), on_unload),
    "state": (frozenset({"GET"}), on_state),
    "routing-links": (frozenset({"POST"}), on_links),
    "offload/settings": (frozenset({"POST"}), on_settings),
    "guardians": (frozenset({"POST"}), on_guardians),
    "api-keys": (frozenset({"GET", "POST"}), on_api_keys),
    "limits": (frozenset({"GET", "POST"}), on_limits),
    "offload/summary": (frozenset({"GET"}), on_summary),
    "offload/decisions": (frozenset({"GET"}), on_decisions),
    "offload/decisions/folded": (frozenset({"GET"}), on_folds),
    "offload/timeline": (frozenset({"GET"}), on_timeline),
    "offload/impact-rows": (frozenset({"GET"}), on_impact_rows),
    "audit": (frozenset({"GET"}), on_audit),
    "usage": (frozenset({"GET"}), on_usage),
    "offload/event": (frozenset({"POST"}), on_master_only),
    "offload/grant": (frozenset({"POST"}), on_grant),
    "offload/request": (frozenset({"POST"}), on_master_only),
    "offload/borrowed": (frozenset({"GET"}), on_borrowed),
    "site/inventory": (frozenset({"GET"}), on_inventory),
}


def _completion(model: str, n: int, serial: int) -> dict[str, Any]:
    words = [WORDS[i % len(WORDS)] for i in range(n)]
    return {
        "id": f"chatcmpl-sim{serial}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": " ".join(words)},
            }
        ],
        "usage": {"prompt_tokens": 19, "completion_tokens": n, "total_tokens": 19 + n},
    }


async def on_inference(
    farm: SlaveFarm, slave: EmulatedSlave, request: web.Request
) -> web.StreamResponse:
    """A forwarded or lent chat request, answered after the node's simulated duration."""
    inner = request.path[len(INFERENCE) :]
    if inner != "/v1/chat/completions" or request.method != "POST":
        return error(404, "endpoint not found", "not_found")
    doc = await _json_body(request)
    model = doc.get("model") if isinstance(doc, dict) else None
    if model not in slave.model_names or model in slave.disabled:
        return error(404, f"model {model!r} not found", "not_found", param="model")
    tokens = doc.get("max_tokens") if isinstance(doc.get("max_tokens"), int) else 16
    slave.active += 1
    try:
        slave.loaded = model
        if slave.duration_ms:
            await asyncio.sleep(slave.duration_ms / 1000.0)
    finally:
        slave.active -= 1
    slave.served += 1
    if request.headers.get("X-Tensors-Offload") == "1":
        slave.borrowed_served += 1
    return web.json_response(_completion(model, max(1, min(tokens, 64)), slave.served))


class SlaveFarm:
    """N emulated slaves on their own loopback ports, in this process's event loop."""

    def __init__(
        self,
        *,
        master_url: str,
        token: str,
        ports: Sequence[int],
        models_per_node: int = 2,
        duration_ms: float = 0.0,
        sync_interval: float = 60.0,
        key_pull: bool = True,
        prefix: str = "emu",
    ) -> None:
        self.master_url = master_url.rstrip("/")
        self.token = token
        self.sync_interval = sync_interval
        self.key_pull = key_pull
        self.slaves: list[EmulatedSlave] = []
        for i, port in enumerate(ports):
            names = [f"{prefix}{i:04d}-m{j}" for j in range(models_per_node)]
            self.slaves.append(
                EmulatedSlave(f"{prefix}{i:04d}", port, names, duration_ms, loaded=names[0])
            )
        self.by_port = {s.port: s for s in self.slaves}
        self.by_id = {s.node_id: s for s in self.slaves}
        self.pushes: dict[str, int] = {"links": 0, "settings": 0, "guardians": 0, "keys": 0}
        self.status_asks = 0
        self.fold_asks = 0
        self.key_pulls = 0
        self.on_poll: Callable[[float], None] | None = None
        """Told the time (monotonic) of every health poll (`node/models`) of any slave."""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.slaves]

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the farm is not started"
        return self._session

    def _authorized(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header.startswith("Bearer ") else ""
        if not given:
            return error(401, "invalid cluster token", "unauthorized")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return error(401, "invalid cluster token", "unauthorized")
        return None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        slave = self.by_port.get(sock[1]) if sock else None
        if slave is None:
            return error(404, "endpoint not found", "not_found")
        if not request.path.startswith(NODE):
            return error(404, "endpoint not found", "not_found")
        refused = self._authorized(request)
        if refused is not None:
            return refused
        if request.path.startswith(INFERENCE + "/"):
            return await on_inference(self, slave, request)
        route = ROUTES.get(request.path[len(NODE) :])
        if route is None:
            return error(404, "endpoint not found", "not_found")
        methods, handler = route
        if request.method not in methods:
            return error(405, "method not allowed", "invalid_request_error")
        return await handler(self, slave, request)

    async def start(self) -> None:
        """Listen on every port (nothing is sent to the master yet)."""
        connector = aiohttp.TCPConnector(limit=256)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=30),
            headers={"Authorization": f"Bearer {self.token}"},
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        for slave in self.slaves:
            site = web.TCPSite(
                self._runner, "127.0.0.1", slave.port, backlog=1024, reuse_address=True
            )
            await site.start()

    async def register(self, slave: EmulatedSlave) -> tuple[int, float]:
        """POST the snapshot to the master: (status, seconds)."""
        t0 = time.perf_counter()
        try:
            async with self.session.post(
                self.master_url + NODE + "register", json=slave.snapshot()
            ) as resp:
                await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError):
            status = 0
        slave.registered = status == 200
        return status, time.perf_counter() - t0

    async def register_all(self) -> list[tuple[int, float]]:
        """Every slave registers at once (what a master restart's storm looks like)."""
        return list(await asyncio.gather(*(self.register(s) for s in self.slaves)))

    async def pull_keys(self, slave: EmulatedSlave) -> None:
        path = f"{self.master_url}{NODE}api-keys?fingerprint={quote(slave.keys.fingerprint)}"
        try:
            async with self.session.get(path) as resp:
                doc = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return
        self.key_pulls += 1
        if isinstance(doc, dict) and "keys" in doc:
            try:
                slave.keys = KeyTable.from_wire(doc)
            except ValueError:
                logger.warning("the master answered a malformed key table")

    async def _slave_loop(self, slave: EmulatedSlave, offset: float) -> None:
        # Spread over the interval, as real slaves started at different moments are.
        await asyncio.sleep(offset)
        next_register = time.monotonic() + self.sync_interval
        while True:
            if self.key_pull:
                await self.pull_keys(slave)
            if time.monotonic() >= next_register:
                await self.register(slave)
                next_register = time.monotonic() + self.sync_interval
            await asyncio.sleep(KEYS_PULL_SECS if self.key_pull else self.sync_interval)

    def run_loops(self) -> None:
        """Start every slave's own loops (periodic registration, key pulls)."""
        count = max(len(self.slaves), 1)
        step = (KEYS_PULL_SECS if self.key_pull else self.sync_interval) / count
        for i, slave in enumerate(self.slaves):
            task = asyncio.ensure_future(self._slave_loop(slave, i * step))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop_loops(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def event(self, slave: EmulatedSlave, model_id: str, backlog: int) -> tuple[Any, float]:
        """Hold `backlog` requests of `model_id` and report the queue event: (answer, seconds)."""
        slave.backlogs[model_id] = Backlog(backlog)
        body = {
            "lane": "text",
            "owner_node_id": slave.node_id,
            "model_id": model_id,
            "trigger": "enqueued",
        }
        t0 = time.perf_counter()
        async with self.session.post(self.master_url + NODE + "offload/event", json=body) as resp:
            doc = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"offload/event answered {resp.status}: {doc}")
        return doc, time.perf_counter() - t0

    async def close(self) -> None:
        await self.stop_loops()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()


def free_ports(count: int, first: int) -> list[int]:
    """`count` loopback ports no socket holds now, from `first` up."""
    out: list[int] = []
    port = first
    while len(out) < count:
        if port > 65_000:
            raise RuntimeError(f"not enough free ports from {first}")
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                port += 1
                continue
        out.append(port)
        port += 1
    return out


async def _serve(args: argparse.Namespace) -> None:
    farm = SlaveFarm(
        master_url=args.master,
        token=args.token,
        ports=list(range(args.first_port, args.first_port + args.nodes)),
        models_per_node=args.models,
        duration_ms=args.duration_ms,
        sync_interval=args.sync_interval,
        key_pull=not args.no_key_pull,
    )
    await farm.start()
    answers = await farm.register_all()
    ok = sum(1 for status, _ in answers if status == 200)
    print(f"{len(farm.slaves)} emulated slaves on ports {args.first_port}+; {ok} registered")
    farm.run_loops()
    try:
        await asyncio.Event().wait()
    finally:
        await farm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True, help="the master's URL")
    parser.add_argument("--token", required=True, help="the cluster token")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--first-port", type=int, default=21000)
    parser.add_argument("--models", type=int, default=2, help="models per node")
    parser.add_argument("--duration-ms", type=float, default=0.0, help="simulated request time")
    parser.add_argument("--sync-interval", type=float, default=60.0)
    parser.add_argument("--no-key-pull", action="store_true")
    args = parser.parse_args()
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
