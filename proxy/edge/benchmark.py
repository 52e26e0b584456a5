"""Calibrating this node's models: `manage.py benchmark_models` and the Nodes page's Benchmark.

A fresh pair of nodes has no cost fit until `scheduling_min_samples` requests have run on each
model, so a burst goes unpriced (and mostly unlent) until then. A calibration pays that once,
after install: it unloads the model, sends it requests of varying prompt and output sizes (or
image sizes and steps) one after the other, and the first of them loads it again. They are
served in-process by the node's own route handlers, so the analytics rows and the load row
are written by the normal path and the fit rules of analytics/costs.py apply to them unchanged;
the lending ticker refits a model the moment its rows reach the threshold. What was sent, what
each request measured, the load and the fit that resulted are kept in
`<store_dir>/benchmarks/<model>-<UTC time>.json`.

No route here serves inference: the requests never leave the process, so they need no
credential, and only an admin-key or cluster-token call (`/router/v1/benchmarks/run`,
`/router/v1/node/benchmarks/run`) can start a calibration.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from channels.db import database_sync_to_async

from access.identity import ANONYMOUS_CALLER, CALLER_SCOPE_KEY
from analytics.costs import fit_threshold, node_costs_compute
from analytics.fitting import SECTION_IMAGE, SECTION_LLM, fits_to_wire
from analytics.selectors import benchmark_rows, loads_since
from proxy.edge.routes import route_for
from proxy.node import Node
from proxy.observe import health
from proxy.request import JSON, Ctx
from registry.kcpps import ModelConfig
from registry.services import model_unload_local
from routerproject.errors import RouterError

logger = logging.getLogger(__name__)

BENCH_DIR = "benchmarks"
TEXT_PATH = "/v1/chat/completions"
IMAGE_PATH = "/v1/images/generations"
# A 3 x 3 grid of prompt and answer sizes: both work terms of the text fit vary, and never in
# step with each other, so the two slopes can be told apart.
PROMPT_BYTES = (240, 1200, 3600)
OUTPUT_TOKENS = (8, 32, 96)
# Small enough for a consumer GPU to get through the grid in a minute or two.
IMAGE_SIDES = (256, 384, 512)
IMAGE_STEPS = (4, 8)
# Without a stated window a model is assumed to hold at least this many tokens.
DEFAULT_CONTEXT_TOKENS = 2048
FILLER = "north river stone lamp field cloud orchard copper meadow harbor lantern quiet "
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Probe:
    """One calibration request: where it goes, its body, and the sizes it asks for."""

    path: str
    body: bytes
    sizes: dict[str, int]


def _count(min_samples: int, grid: int) -> int:
    """Requests per model: the fit threshold, and at least one pass over the grid."""
    return max(fit_threshold(min_samples), grid)


def text_probes(model: str, count: int, context_tokens: int | None) -> list[Probe]:
    """Chat requests over the prompt x answer grid, cycled until there are `count`."""
    window = context_tokens or DEFAULT_CONTEXT_TOKENS
    # The filler runs at about 4 bytes a token; half the window in bytes leaves room for the
    # longest answer whatever the tokenizer makes of it. A small window scales the whole grid
    # down rather than capping it, which would leave one size and a term the fit cannot use.
    prompt_scale = min(1.0, (window // 2) / max(PROMPT_BYTES))
    output_scale = min(1.0, (window // 4) / max(OUTPUT_TOKENS))
    prompts = sorted({max(16, int(size * prompt_scale)) for size in PROMPT_BYTES})
    outputs = sorted({max(1, int(size * output_scale)) for size in OUTPUT_TOKENS})
    grid = list(itertools.product(prompts, outputs))
    probes: list[Probe] = []
    for index, (prompt_bytes, max_tokens) in enumerate(
        itertools.islice(itertools.cycle(grid), count)
    ):
        text = (FILLER * (prompt_bytes // len(FILLER) + 1))[:prompt_bytes]
        # A different first line each time: a backend's prompt cache reuses a common prefix,
        # and a prefill it skipped would measure nothing.
        content = f"List {index:03d}. Continue it: {text}"
        doc = {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        }
        probes.append(
            Probe(
                TEXT_PATH,
                orjson.dumps(doc),
                {"prompt_bytes": prompt_bytes, "max_tokens": max_tokens},
            )
        )
    return probes


def image_probes(model: str, count: int) -> list[Probe]:
    """Image requests over the size x steps grid, cycled until there are `count`."""
    grid = list(itertools.product(IMAGE_SIDES, IMAGE_STEPS))
    probes: list[Probe] = []
    for side, steps in itertools.islice(itertools.cycle(grid), count):
        doc = {
            "model": model,
            "prompt": "a lighthouse at dusk",
            "size": f"{side}x{side}",
            "steps": steps,
        }
        probes.append(
            Probe(IMAGE_PATH, orjson.dumps(doc), {"width": side, "height": side, "steps": steps})
        )
    return probes


async def serve_in_process(node: Node, probe: Probe, request_id: str) -> tuple[int, bytes]:
    """Run one request through this node's own handler for its path; (status, answer body).

    The same handler a client's request reaches after the front door, without it: the
    caller is this node, so there is no key to check and no key's limits to count against.
    """
    route = route_for(probe.path)
    if route is None:
        raise RuntimeError(f"no route serves {probe.path}")
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": probe.path,
        "query_string": b"",
        "headers": [(b"content-type", JSON)],
        "client": None,
        CALLER_SCOPE_KEY: ANONYMOUS_CALLER,
    }
    status = 0
    parts: list[bytes] = []
    never = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        else:
            parts.append(bytes(message.get("body", b"")))

    async def receive() -> dict[str, Any]:
        await never.wait()  # nobody disconnects from an in-process call
        return {"type": "http.disconnect"}

    ctx = Ctx(scope, receive, send, probe.path, "POST", body=probe.body, request_id=request_id)
    node.requests.begin()
    try:
        await route[1](ctx, node)
    except RouterError as err:
        if not ctx.started:
            await ctx.error(err)
    except Exception:
        # As the edge answers a client: the calibration records the 500 and goes on.
        logger.exception("calibration request %s failed", request_id)
        if not ctx.started:
            await ctx.error(RouterError(500, "internal router error", type="server_error"))
    finally:
        node.requests.end()
        health.finish(ctx, node, cluster_call=False)
    return status, b"".join(parts)


def _public_id(node: Node, cfg: ModelConfig, image: bool) -> str:
    """The ID this node's own replica of `cfg` answers to (a master may suffix a clash)."""
    table = node.cluster.by_public_image_id if image else node.cluster.by_public_id
    for public_id, replicas in table.items():
        if any(r.is_local and r.local_id == cfg.local_id for r in replicas):
            return public_id
    return (cfg.image_id or cfg.local_id) if image else cfg.local_id


def _error_text(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace")
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", ""))
    return str(err or "")[:200]


async def _send_all(node: Node, probes: Sequence[Probe], tag: str) -> list[dict[str, Any]]:
    """Send the probes one after the other (one at a time: each duration is the model's alone,
    and a linked owner never holds or lends them, which needs a backlog)."""
    sent: list[dict[str, Any]] = []
    for index, probe in enumerate(probes):
        request_id = f"bench-{tag}-{index:03d}"
        started = time.monotonic()
        status, body = await serve_in_process(node, probe, request_id)
        entry: dict[str, Any] = {
            "request_id": request_id,
            "path": probe.path,
            **probe.sizes,
            "status": status,
            "wall_ms": round((time.monotonic() - started) * 1000.0, 1),
        }
        if status != 200:
            entry["error"] = _error_text(body)
        sent.append(entry)
    return sent


def _fit_doc(node: Node, model_id: str, section: str) -> dict[str, Any] | None:
    settings = node.lending.settings
    costs = node_costs_compute(
        now=datetime.now(UTC),
        window_secs=settings.sample_window_secs,
        min_samples=settings.min_samples,
    )
    fit = costs.models.get((model_id, section))
    if fit is None:
        return None
    row: dict[str, Any] = fits_to_wire({(model_id, section): fit}, {}, {})["models"][0]
    return row


def _measured(sent: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Each sent request gets what its analytics row measured (the fit's own numbers)."""
    by_id = {row["request_id"]: row for row in rows}
    for entry in sent:
        row = by_id.get(entry["request_id"])
        if row is None:
            continue
        entry["duration_ms"] = round(float(row["duration_ms"]), 1)
        for key in ("prompt_tokens", "output_tokens"):
            if row[key]:
                entry[key] = row[key]


async def calibrate_lane(node: Node, cfg: ModelConfig, image: bool) -> dict[str, Any]:
    """Unload `cfg`, send it its probes (the first loads it) and read back what they measured."""
    min_samples = node.lending.settings.min_samples
    public_id = _public_id(node, cfg, image)
    if image:
        probes = image_probes(public_id, _count(min_samples, len(IMAGE_SIDES) * len(IMAGE_STEPS)))
    else:
        grid = len(PROMPT_BYTES) * len(OUTPUT_TOKENS)
        probes = text_probes(public_id, _count(min_samples, grid), cfg.slot_context)
    started_ms = time.time() * 1000.0
    unloaded = await model_unload_local(node=node, model_id=cfg.local_id, target=None)
    tag = f"{_SAFE.sub('_', cfg.local_id)[:40]}-{uuid.uuid4().hex[:8]}"
    sent = await _send_all(node, probes, tag)
    await node.recorder.flush()
    rows = await database_sync_to_async(benchmark_rows)(request_ids=[s["request_id"] for s in sent])
    _measured(sent, rows)
    loads = await database_sync_to_async(loads_since)(
        config_filename=cfg.filename, since_ms=started_ms
    )
    section = SECTION_IMAGE if image else SECTION_LLM
    model_id = rows[0]["model_id"] if rows else (cfg.image_id if image else cfg.local_id)
    fit = await database_sync_to_async(_fit_doc)(node, str(model_id), section)
    return {
        "lane": "image" if image else "text",
        "model_id": model_id,
        "public_id": public_id,
        "unloaded": unloaded["unloaded"],
        "load_ms": next((ld["duration_ms"] for ld in loads if ld["success"]), None),
        "loads": loads,
        "requests": sent,
        "ok": sum(1 for s in sent if s["status"] == 200),
        "fit": fit,
    }


def _file_name(local_id: str, at: datetime) -> str:
    return f"{_SAFE.sub('_', local_id)}-{at.strftime('%Y%m%dT%H%M%SZ')}.json"


async def calibrate_model(node: Node, cfg: ModelConfig) -> dict[str, Any]:
    """Calibrate every lane of one model that has a cost fit, and keep the result on disk."""
    began = datetime.now(UTC)
    lanes: list[dict[str, Any]] = []
    if cfg.has_llm:
        lanes.append(await calibrate_lane(node, cfg, image=False))
    if cfg.has_image:
        lanes.append(await calibrate_lane(node, cfg, image=True))
    finished = datetime.now(UTC)
    doc: dict[str, Any] = {
        "node_id": node.node_id,
        "model": cfg.local_id,
        "config_filename": cfg.filename,
        "started_at": began.isoformat(),
        "finished_at": finished.isoformat(),
        "min_samples": node.lending.settings.min_samples,
        "lanes": lanes,
        "fitted": bool(lanes) and all(lane["fit"] is not None for lane in lanes),
    }
    folder = Path(node.config.cluster.store_dir) / BENCH_DIR
    path = folder / _file_name(cfg.local_id, began)
    text = json.dumps(doc, indent=2, sort_keys=True)

    def write() -> None:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    await asyncio.to_thread(write)
    doc["file"] = str(path)
    return doc


def parse_models(value: Any) -> list[str] | None:
    """A request's `models`: absent or null for every model, else a list of local IDs."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise RouterError(400, "models must be a non-empty list of model IDs", param="models")
    if not all(isinstance(name, str) and name for name in value):
        raise RouterError(400, "models must name each model by a non-empty string", param="models")
    return list(value)


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    """A result without its request list: what the Nodes page and the command's table show."""
    lanes = [
        {
            "lane": lane["lane"],
            "model_id": lane["model_id"],
            "requests": len(lane["requests"]),
            "ok": lane["ok"],
            "load_ms": lane["load_ms"],
            "fit": lane["fit"],
        }
        for lane in doc["lanes"]
    ]
    keys = ("model", "started_at", "finished_at", "file", "fitted", "min_samples")
    return {**{key: doc[key] for key in keys}, "lanes": lanes}


def kept_results(folder: Path, models: set[str]) -> dict[str, dict[str, Any]]:
    """The newest kept result of each of `models`, so a restarted node still shows them.

    A file that cannot be read or does not look like a result is passed over: it is the
    operator's folder too.
    """
    newest: dict[str, dict[str, Any]] = {}
    # The names end in a sortable UTC time, so the last file of a model is its newest.
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
            if doc.get("model") in models:
                newest[doc["model"]] = _summary({**doc, "file": str(path)})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            logger.warning("benchmark file %s is not a result; passed over", path)
    return newest


class Benchmarks:
    """This node's calibrations: one run at a time (it unloads and loads models), its models
    one after the other, and the last result of each model (read back from the folder when
    the node starts)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._task: asyncio.Task[None] | None = None
        self._pending: list[str] = []
        self._current: str | None = None
        self._results: dict[str, dict[str, Any]] = kept_results(
            Path(node.config.cluster.store_dir) / BENCH_DIR, set(node.catalog.configs)
        )

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def targets(self, models: Sequence[str] | None) -> list[ModelConfig]:
        """The configs to calibrate: those named, or every enabled text or image model."""
        configs = self.node.catalog.configs
        if models is None:
            chosen = [
                cfg
                for local_id, cfg in sorted(configs.items())
                if (cfg.has_llm or cfg.has_image) and local_id not in self.node.disabled
            ]
            if not chosen:
                raise RouterError(
                    400, "this node has no enabled text or image model to benchmark", param="models"
                )
            return chosen
        found: list[ModelConfig] = []
        for name in models:
            cfg = configs.get(name)
            if cfg is None:
                raise RouterError(
                    404,
                    f'model "{name}" is not a config on node {self.node.node_id}',
                    param="models",
                    code="model_not_found",
                )
            if name in self.node.disabled:
                raise RouterError(
                    409, f'model "{name}" is disabled; enable it first', code="model_disabled"
                )
            if not (cfg.has_llm or cfg.has_image):
                raise RouterError(
                    400, f'model "{name}" has no text or image lane to fit', param="models"
                )
            if cfg not in found:
                found.append(cfg)
        return found

    def start(self, models: Sequence[str] | None) -> dict[str, Any]:
        """Start calibrating in the background; the status with the run in it."""
        if self.running:
            raise RouterError(
                409,
                f"a benchmark is already running on node {self.node.node_id}",
                code="benchmark_running",
            )
        cfgs = self.targets(models)
        self._pending = [cfg.local_id for cfg in cfgs]
        for local_id in self._pending:
            self._results.pop(local_id, None)
        self._task = asyncio.ensure_future(self._run(cfgs))
        return self.status()

    async def _run(self, cfgs: Sequence[ModelConfig]) -> None:
        for cfg in cfgs:
            self._pending.remove(cfg.local_id)
            self._current = cfg.local_id
            try:
                self._results[cfg.local_id] = _summary(await calibrate_model(self.node, cfg))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.exception("benchmark of %s failed", cfg.local_id)
                self._results[cfg.local_id] = {"model": cfg.local_id, "error": str(exc)}
            finally:
                self._current = None

    def status(self) -> dict[str, Any]:
        return {
            "node_id": self.node.node_id,
            "running": self.running,
            "current": self._current,
            "pending": list(self._pending),
            "results": [self._results[key] for key in sorted(self._results)],
        }

    async def stop(self) -> None:
        """Shutdown: send no more calibration requests."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
