"""Services over the node's models: records, explicit load and unload, node state."""

from __future__ import annotations

import time
from typing import Any

from registry.cluster import RemoteNode
from registry.identity import Assignment, IdentityKey
from registry.kcpps import Lane, ModelConfig
from registry.ports import RegistryNode, RuntimeView
from routerproject.errors import RouterError, echo

UNLOAD_TARGETS = ("text", "image", "embeddings", "voice", "music", "all")


def model_records(*, node: RegistryNode) -> list[dict[str, Any]]:
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


def _resolve(node: RegistryNode, model_id: str) -> ModelConfig:
    cfg = node.catalog.configs.get(model_id) or node.catalog.image_ids.get(model_id)
    if cfg is None:
        raise RouterError(404, f'model "{echo(model_id)}" was not found', code="model_not_found")
    return cfg


def _owner(node: RegistryNode, model_id: str) -> tuple[str, str, str]:
    """(node_id, node_url, local_id) of the replica to act on for a public model ID."""
    replicas = node.cluster.by_public_id.get(model_id) or node.cluster.by_public_image_id.get(
        model_id
    )
    if not replicas:
        raise RouterError(404, f'model "{echo(model_id)}" was not found', code="model_not_found")
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


async def _remote_call(
    node: RegistryNode, url: str, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    from registry.nodeclient import NodeCallError

    assert node.client is not None
    try:
        status, doc = await node.client.call_json(
            "POST", url, path, json=body, timeout=node.config.backend.load_timeout
        )
    except NodeCallError as exc:
        raise RouterError(502, f"node at {url} failed: {exc}", type="backend_error") from exc
    if not 200 <= status < 300:
        err = doc.get("error") if isinstance(doc, dict) else None
        err = err if isinstance(err, dict) else {}
        message = err.get("message", str(doc))
        # The node's code (e.g. model_assets_unresolved) tells the caller what to do next.
        raise RouterError(
            status if status >= 400 else 502,
            str(message),
            type="backend_error",
            code=err.get("code") if 400 <= status < 500 else None,
        )
    return doc if isinstance(doc, dict) else {"ok": True}


async def remote_load(node: RegistryNode, url: str, local_id: str) -> dict[str, Any]:
    """Load a model of another node through its node route."""
    return await _remote_call(node, url, "/router/v1/node/load", {"model": local_id})


async def model_load(*, node: RegistryNode, model_id: str) -> dict[str, Any]:
    """Explicit load of a public model ID (or a split recipe), on the node(s) that own it."""
    recipe = node.recipes.get(model_id)
    if recipe is not None:
        from registry.cook import load

        return await load(node, recipe)
    owner, url, local_id = _owner(node, model_id)
    if url:
        result = await _remote_call(node, url, "/router/v1/node/load", {"model": local_id})
        result["node_id"] = owner
        return result
    return await model_load_local(node=node, model_id=local_id)


async def model_unload(
    *, node: RegistryNode, model_id: str | None, target: str | None
) -> dict[str, Any]:
    if model_id:
        owner, url, local_id = _owner(node, model_id)
        if url:
            result = await _remote_call(node, url, "/router/v1/node/unload", {"model": local_id})
            result["node_id"] = owner
            return result
        return await model_unload_local(node=node, model_id=local_id, target=target)
    return await model_unload_local(node=node, model_id=None, target=target)


async def model_load_local(*, node: RegistryNode, model_id: str) -> dict[str, Any]:
    """Load every lane the config needs, waiting for running requests like any other switch."""
    cfg = _resolve(node, model_id)
    if cfg.local_id in node.disabled:
        # Requests for it answer 404; loading it anyway would only hold memory nobody can use.
        raise RouterError(
            409,
            f'model "{cfg.local_id}" is disabled on node {node.node_id}; enable it first',
            code="model_disabled",
        )
    if cfg.unresolved_fields:
        # Refused before any backend is touched: there are no verified weights to start on.
        raise RouterError(
            409,
            f'model "{cfg.local_id}" has unresolved portable weights '
            f"({', '.join(cfg.unresolved_fields)}) on node {node.node_id}; resolve them first "
            "(POST /router/v1/site/model-assets/resolve) or send a request, which waits for them",
            param="model",
            code="model_assets_unresolved",
        )
    started = time.monotonic()
    loaded: list[str] = []
    # A load the node does for itself is its own work (spec: idle means idle from its own
    # requests and any model load it does for itself): while it runs the node takes no
    # borrowed work, and a helper that just loaded is not idle for probes or switch pricing.
    node.lending.own_begin()
    try:
        for lane in _lanes(cfg):
            runtime = node.runtimes.runtime_for(cfg, lane)
            await runtime.load(cfg)
            loaded.append(lane)
    finally:
        node.lending.own_end()
    return {
        "ok": True,
        "node_id": node.node_id,
        "model": cfg.local_id,
        "lanes": loaded,
        "duration_ms": round((time.monotonic() - started) * 1000.0, 1),
    }


# The runtimes an unload by target type empties (music has no runtime of its own).
_UNLOAD_LANES: dict[str, tuple[Lane, ...]] = {
    "text": ("text",),
    "embeddings": ("text",),
    "voice": ("whisper",),
    "music": (),
    "image": ("image",),
    "all": ("text", "image", "whisper"),
}


async def model_unload_local(
    *, node: RegistryNode, model_id: str | None, target: str | None
) -> dict[str, Any]:
    unloaded: list[str] = []
    if model_id:
        cfg = _resolve(node, model_id)
        for runtime, current in node.runtimes.loaded():
            if current.filename == cfg.filename and await runtime.unload():
                unloaded.append(runtime.lane)
    else:
        for lane in _UNLOAD_LANES[target or "all"]:
            if await node.runtimes.runtimes[lane].unload():
                unloaded.append(lane)
    return {"ok": True, "node_id": node.node_id, "unloaded": unloaded}


def node_runtimes(*, node: RegistryNode) -> list[tuple[str, str, RuntimeView]]:
    """(backend id, runtime id, runtime) for every runtime of this node, in state order.

    The node's own runtimes are named after their lane. Each upstream server has a runtime of
    its own on the text lane, so it is numbered instead: sharing "text-runtime" would make an
    unload by backend id ambiguous. Upstream runtimes are only ever added, so the numbers stay
    put for the life of the process.
    """
    own = {id(runtime): lane for lane, runtime in node.runtimes.runtimes.items()}
    out: list[tuple[str, str, RuntimeView]] = []
    upstream = 0
    for runtime in node.runtimes.all():
        lane = own.get(id(runtime))
        if lane is None:
            upstream += 1
            out.append((f"upstream-{upstream}-runtime", f"upstream-{upstream}", runtime))
        else:
            out.append((f"{lane}-runtime", lane, runtime))
    return out


def _load_under_way(node: RegistryNode, status: dict[str, Any]) -> dict[str, Any] | None:
    """The runtime's load in progress: model, elapsed time, the requests waiting on it, and
    the node's mean load time of that config where it has loaded it before."""
    if not status.get("loading"):
        return None
    config = status.get("loading_config") or ""
    return {
        "model_id": status["loading"],
        "elapsed_ms": round(status.get("loading_elapsed_ms") or 0.0),
        "waiting": status.get("loading_waiting", 0),
        "expected_ms": node.lending.expected_load_ms(config) if config else None,
    }


def node_state(*, node: RegistryNode) -> dict[str, Any]:
    backends = []
    active = []
    for backend_id, runtime_id, runtime in node_runtimes(node=node):
        status = runtime.status()
        loaded = []
        if runtime.current is not None:
            loaded.append(
                {
                    "model_id": runtime.current.local_id,
                    "lane": runtime.lane,
                    "runtime_id": runtime_id,
                    "generation": runtime.generation,
                    "borrowed": node.restore.borrowed_on(runtime) > 0,
                    "active": runtime.active,
                }
            )
            active.extend([runtime.current.local_id] * runtime.active)
        backends.append(
            {
                "id": backend_id,
                "display_name": status["family"] or runtime.lane,
                "mode": node.config.backend.mode,
                "lifecycle_state": status["state"],
                "loaded_models": loaded,
                "active": status["active"],
                "waiting": status["waiting"],
                "loading": status["loading"],
                "load": _load_under_way(node, status),
                "last_error": status["last_error"],
                "last_error_at": status["last_error_at"],
                "pid": status["pid"],
                "base_url": runtime.launch.base_url if runtime.launch else None,
                "probe_ok": status["probe_ok"],
                "realtime_sessions": status.get("realtime_sessions", []),
            }
        )
    return {
        "node_id": node.node_id,
        "role": node.config.cluster.role,
        "backends": backends,
        "active_requests": active,
        "held_requests": node.lending.held_now(),
        "waiting_by_key": node.lending.waiting_by_key(),
        "analytics_buffered": node.recorder.pending(),
        "asset_transfers": _asset_transfers(node),
        "affinity": {
            "enabled": node.cache_affinity,
            "entries": len(node.affinity),
            "models": node.affinity.stats(),
        },
    }


def _asset_transfers(node: RegistryNode) -> list[dict[str, Any]]:
    """Peer and hub copies of model assets on this node: running ones, then the last few."""
    service = getattr(node, "assets", None)  # proxy.node.Node.assets (registry/assets/service.py)
    if service is None:
        return []
    transfers = list(service.transfers.values())
    running = [t for t in transfers if t.state == "running"]
    finished = [t for t in transfers if t.state != "running"][-5:]
    return [t.to_wire() for t in running + finished]


# -- generation-checked unload (the Nodes page's Unload) -----------------------------------


def _runtime_named(node: RegistryNode, backend_id: str, runtime_id: str) -> RuntimeView:
    for bid, rid, runtime in node_runtimes(node=node):
        if bid != backend_id:
            continue
        if rid != runtime_id:
            raise RouterError(
                400,
                f'runtime "{runtime_id}" is not a runtime of backend "{backend_id}" '
                f'on node "{node.node_id}" (it has "{rid}")',
                param="runtime_id",
            )
        return runtime
    known = ", ".join(bid for bid, _, _ in node_runtimes(node=node))
    raise RouterError(
        400,
        f'backend "{backend_id}" is not a backend of node "{node.node_id}" (it has {known})',
        param="backend_id",
    )


def _check_generation(
    node: RegistryNode, backend_id: str, runtime: RuntimeView, expected: int
) -> None:
    current = runtime.current
    if current is not None and runtime.generation == expected:
        return
    now = (
        f'"{current.local_id}" at generation {runtime.generation}'
        if current is not None
        else "nothing"
    )
    raise RouterError(
        409,
        f'{backend_id} on node "{node.node_id}" has {now} loaded now, not generation '
        f"{expected}: nothing was unloaded",
        param="expected_generation",
        code="stale_generation",
    )


async def runtime_unload_local(
    *, node: RegistryNode, backend_id: str, runtime_id: str, expected_generation: int
) -> dict[str, Any]:
    """Unload one runtime of this node if it still holds `expected_generation`.

    Like Runtime.unload(), it waits for the requests on that runtime to finish, and also for
    borrowed requests already admitted to it that have not reached it yet: a lease's work is
    let through, not cut off. While it waits, another model may be switched in; the generation
    is checked again after every wait, so only the load the caller saw is ever unloaded.
    """
    runtime = _runtime_named(node, backend_id, runtime_id)
    while True:
        _check_generation(node, backend_id, runtime, expected_generation)
        if not runtime.is_idle():
            await runtime.wait_idle()
        elif node.restore.borrowed_on(runtime) > 0:
            await node.restore.borrowed_drained(runtime)
        else:
            break
    # Nothing awaited since the last check: unload() finds the runtime idle and marks it
    # stopping before any other request can take it.
    await runtime.unload()
    return node_state(node=node)


async def runtime_unload(
    *, node: RegistryNode, node_id: str, backend_id: str, runtime_id: str, expected_generation: int
) -> dict[str, Any]:
    """Generation-checked unload on any node of the cluster; returns that node's fresh state."""
    from registry.nodeclient import NodeCallError

    if node_id == node.node_id:
        return await runtime_unload_local(
            node=node,
            backend_id=backend_id,
            runtime_id=runtime_id,
            expected_generation=expected_generation,
        )
    remote = node.cluster.nodes.get(node_id)
    if remote is None:
        raise RouterError(404, f'node "{node_id}" is not known', type="not_found", param="node_id")
    if node.client is None:
        raise RouterError(502, "this node has no cluster client", type="backend_error")
    body = {
        "node_id": node_id,
        "backend_id": backend_id,
        "runtime_id": runtime_id,
        "expected_generation": expected_generation,
    }
    try:
        # Bounded by the longest a request may run, not control_timeout: the node answers
        # only once the runtime's requests have drained.
        status, doc = await node.client.call_json(
            "POST",
            remote.node_url,
            "/router/v1/node/state/unload",
            json=body,
            timeout=node.config.backend.request_timeout,
        )
    except NodeCallError as exc:
        raise RouterError(
            502, f'node "{node_id}" did not answer: {exc}', type="backend_error"
        ) from exc
    if not 200 <= status < 300 or not isinstance(doc, dict):
        err = doc.get("error") if isinstance(doc, dict) else None
        if 400 <= status < 500 and isinstance(err, dict):
            # The node's own refusal (a stale generation, an unknown backend) reaches the
            # caller whole: the page tells a stale generation apart by its code.
            raise RouterError(
                status,
                str(err.get("message", "")),
                type=str(err.get("type", "invalid_request_error")),
                code=err.get("code"),
                param=err.get("param"),
            )
        message = err.get("message", "") if isinstance(err, dict) else str(doc)
        raise RouterError(
            502, f'node "{node_id}" failed to unload: {message}', type="backend_error"
        )
    return doc


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


async def remote_node_state(*, node: RegistryNode, remote: RemoteNode) -> dict[str, Any]:
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


async def remote_node_states(
    *, node: RegistryNode
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Every healthy remote node's state, asked at once: (states by node ID, node_errors).

    The Nodes page at a few hundred nodes used to ask for each node's state in turn, one
    request each; this asks them all in parallel within one `cluster.control_timeout`, so the
    page waits for the slowest node rather than for the sum of all of them.
    """
    import asyncio

    from registry.nodeclient import NodeCallError

    remotes = sorted(node.cluster.nodes.values(), key=lambda n: n.node_id)
    client = node.client
    if client is None or not remotes:
        return [], []
    limit = node.config.cluster.control_timeout

    async def one(remote: RemoteNode) -> tuple[Any, str]:
        if not remote.healthy:
            return None, "node is not healthy"
        try:
            return await client.call_ok(
                "GET", remote.node_url, "/router/v1/node/state", timeout=limit
            ), ""
        except NodeCallError as exc:
            return None, str(exc)

    answers = await asyncio.gather(*(one(r) for r in remotes))
    states = [doc for doc, _ in answers if isinstance(doc, dict)]
    errors = [
        {"node_id": r.node_id, "error": err or "not a JSON object"}
        for r, (doc, err) in zip(remotes, answers, strict=True)
        if not isinstance(doc, dict)
    ]
    return states, errors


def cluster_state(*, node: RegistryNode) -> dict[str, Any]:
    """`site/nodes/state` without a node: every node's health as the master sees it."""
    return {
        "node_id": node.node_id,
        "role": node.role,
        "revision": node.cluster.revision,
        "view_ready": node.cluster.view_ready,
        "nodes": node.cluster.node_summaries(),
    }


# -- enabling and disabling models ---------------------------------------------------------


def model_state_save(*, local_id: str, enabled: bool) -> None:
    """Record in this node's database whether one of its models is enabled (idempotent)."""
    from registry.models import ModelState

    if enabled:
        ModelState.objects.filter(local_id=local_id).delete()
    else:
        ModelState.objects.get_or_create(local_id=local_id)


def _unknown_model(node_id: str, local_id: str) -> RouterError:
    return RouterError(
        404,
        f'model "{echo(local_id)}" is not a model config on node "{echo(node_id)}"',
        type="not_found",
        param="local_id",
        code="model_not_found",
    )


async def model_state_set_local(
    *, node: RegistryNode, local_id: str, enabled: bool
) -> dict[str, Any]:
    """Enable or disable one of this node's models; returns this node's snapshot.

    Disabling does not unload: a loaded model stays loaded until it is unloaded or replaced,
    and requests already running or queued on it finish. The reference says only that new
    requests for a disabled model get 404 (reference-cluster §9.1); unloading is the
    operator's own call, so disabling a model and enabling it again costs no reload.
    """
    from channels.db import database_sync_to_async

    if local_id not in node.catalog.configs:
        raise _unknown_model(node.node_id, local_id)
    async with node.model_state_lock:
        # The table first: if the write fails, nothing has changed.
        await database_sync_to_async(model_state_save)(local_id=local_id, enabled=enabled)
        node.disabled = node.disabled - {local_id} if enabled else node.disabled | {local_id}
        node.cluster.rebuild()
    return node.snapshot()


async def model_state_set(
    *, node: RegistryNode, node_id: str, local_id: str, enabled: bool
) -> dict[str, Any]:
    """Enable or disable a model of any node of the cluster; returns that node's snapshot.

    A remote node's answer is taken in at once, as a poll's would be, so the master routes by
    the new state from the moment this returns.
    """
    from registry.cluster import SnapshotRejected
    from registry.nodeclient import NodeCallError

    if node_id == node.node_id:
        return await model_state_set_local(node=node, local_id=local_id, enabled=enabled)
    remote = node.cluster.nodes.get(node_id)
    if remote is None:
        raise RouterError(404, f'node "{node_id}" is not known', type="not_found", param="node_id")
    if not any(rec.get("local_id") == local_id for rec in remote.records):
        raise _unknown_model(node_id, local_id)
    if node.client is None:
        raise RouterError(502, "this node has no cluster client", type="backend_error")
    body = {"node_id": node_id, "local_id": local_id, "enabled": enabled}
    try:
        status, doc = await node.client.call_json(
            "POST", remote.node_url, "/router/v1/node/models/state", json=body
        )
    except NodeCallError as exc:
        raise RouterError(
            502, f'node "{node_id}" did not answer: {exc}', type="backend_error"
        ) from exc
    if not 200 <= status < 300:
        err = doc.get("error") if isinstance(doc, dict) else None
        err = err if isinstance(err, dict) else {}
        message = f'node "{node_id}" refused: {err.get("message") or doc}'
        if status in (400, 404):
            # The node's own verdict on the request (its config went away since the last
            # poll, say) reaches the caller as it is.
            kind = err.get("type") or ("not_found" if status == 404 else "invalid_request_error")
            raise RouterError(status, message, type=str(kind), param=err.get("param"))
        raise RouterError(502, message, type="backend_error")
    try:
        node.cluster.apply_poll(remote.node_url, doc)
    except SnapshotRejected as exc:
        raise RouterError(
            502,
            f'node "{node_id}" answered a snapshot this node refuses: {exc.message}',
            type="backend_error",
        ) from exc
    return dict(doc)
