"""The node protocol (`/router/v1/node/...`): what nodes of one cluster ask each other.

Every route here needs the cluster token (checked by ProxyApp before any handler runs). The
routes run on the router's event loop because they read and change its in-memory state:
registry snapshots, runtimes, workload.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import orjson

from access.audit import arecord_push
from access.keyheader import KEY_NAME_HEADER_BYTES, key_name_from_header
from proxy.edge.routes import route_for
from proxy.node import Node, catch_up_if_stale
from proxy.request import Ctx, parse_json_body
from proxy.serving.core import GET, POST, Handler
from registry import services
from registry.api.serializers import NodeModelStateSerializer, RuntimeUnloadSerializer
from registry.cluster import MINIMUM_PROTOCOL_VERSION, PROTOCOL_VERSION, SnapshotRejected
from routerproject.api import validated
from routerproject.errors import RouterError, error_body

NODE_PREFIX = "/router/v1/node/"
PATHSEND = "http.response.pathsend"
INFERENCE_PREFIX = "/router/v1/node/inference"
ANY = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})

Route = tuple[frozenset[str], Handler, bool]
GET_POST = GET | POST


async def handle_register(ctx: Ctx, node: Node) -> None:
    try:
        doc = orjson.loads(ctx.body)
    except orjson.JSONDecodeError as exc:
        raise RouterError(400, f"invalid JSON body: {exc}") from exc
    if node.role != "master":
        raise RouterError(400, "cluster registry is not enabled", type="cluster_error")
    try:
        remote = node.cluster.register(doc)
    except SnapshotRejected as exc:
        raise RouterError(exc.status, exc.message, type=exc.type, code=exc.code) from exc
    catch_up_if_stale(node, remote.node_id, doc)
    await ctx.json(
        200,
        {
            "ok": True,
            "protocol_version": PROTOCOL_VERSION,
            "minimum_protocol_version": MINIMUM_PROTOCOL_VERSION,
        },
    )


async def handle_models(ctx: Ctx, node: Node) -> None:
    await ctx.json(200, node.snapshot())


async def handle_runtime_status(ctx: Ctx, node: Node) -> None:
    await ctx.json(200, node.runtime_status())


def _local_model(node: Node, doc: dict[str, Any]) -> str:
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise RouterError(400, "model is required", param="model")
    return model


async def handle_load(ctx: Ctx, node: Node) -> None:
    model = _local_model(node, parse_json_body(ctx))
    await ctx.json(200, await services.model_load_local(node=node, model_id=model))


async def handle_unload(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx) if ctx.body.strip() else {}
    model = doc.get("model")
    target = doc.get("target")
    if model is not None and not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    if target is not None and target not in services.UNLOAD_TARGETS:
        raise RouterError(400, "target is not valid", param="target")
    await ctx.json(
        200, await services.model_unload_local(node=node, model_id=model or None, target=target)
    )


async def handle_model_state(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    node_id = doc.get("node_id")
    if node_id is not None and node_id != node.node_id:
        # The master's idea of who answers at this URL is out of date: change nothing here.
        raise RouterError(409, f'this is node "{node.node_id}", not {node_id!r}', code="wrong_node")
    fields = validated(NodeModelStateSerializer(data=doc))
    snapshot = await services.model_state_set_local(node=node, **fields)
    await ctx.json(200, snapshot)


async def handle_state(ctx: Ctx, node: Node) -> None:
    await ctx.json(200, services.node_state(node=node))


async def handle_state_unload(ctx: Ctx, node: Node) -> None:
    """The master's generation-checked unload of one of this node's runtimes."""
    fields = validated(RuntimeUnloadSerializer(data=parse_json_body(ctx)))
    node_id = fields.pop("node_id")
    if node_id != node.node_id:
        # The master's idea of who answers at this URL is out of date: unload nothing here.
        raise RouterError(409, f'this is node "{node.node_id}", not {node_id!r}', code="wrong_node")
    await ctx.json(200, await services.runtime_unload_local(node=node, **fields))


def _slave_only(node: Node, what: str) -> None:
    # Only a slave runs what its master pushes; anything else answering 204 would hide a
    # misconfigured cluster (two masters, or a push aimed at the wrong node).
    if node.role != "slave":
        raise RouterError(409, f"only a slave accepts pushed {what}", code="not_slave")


async def handle_routing_links(ctx: Ctx, node: Node) -> None:
    from lending.links import parse_snapshot

    _slave_only(node, "links")
    snapshot = parse_snapshot(parse_json_body(ctx))
    before = {lane: list(links) for lane, links in node.lending.links.items()}
    node.lending.set_links(snapshot)
    after = {lane: list(links) for lane, links in node.lending.links.items()}
    await arecord_push("link.update", "links (pushed by the master)", before, after)
    await ctx.respond(204, b"")


async def handle_guardians(ctx: Ctx, node: Node) -> None:
    from guardians.store import Guardians

    _slave_only(node, "guardians")
    before = node.guardians.as_audit()
    node.guardians = Guardians.from_dict(parse_json_body(ctx))
    after = node.guardians.as_audit()
    await arecord_push("guardian.update", "guardians (pushed by the master)", before, after)
    await ctx.respond(204, b"")


async def handle_api_keys(ctx: Ctx, node: Node) -> None:
    """POST: a slave takes the master's key table (hashes, never secrets). GET: the master
    answers a slave's pull, `?fingerprint=` being the slave's (registry/keysync.py)."""
    from registry.keysync import keys_answer, keys_receive

    if ctx.method == "GET":
        if node.role == "slave":
            raise RouterError(409, "a slave serves no key table", code="not_master")
        query = parse_qs(ctx.scope.get("query_string", b"").decode("latin-1"))
        await ctx.json(200, keys_answer(query.get("fingerprint", [None])[0]))
        return
    _slave_only(node, "keys")
    try:
        await keys_receive(node, parse_json_body(ctx))
    except ValueError as exc:
        raise RouterError(400, f"invalid key table: {exc}") from exc
    await ctx.respond(204, b"")


async def handle_offload_settings(ctx: Ctx, node: Node) -> None:
    from lending.keys import KEYS_BY_NAME, LendingSettingError, canonical_value

    _slave_only(node, "settings")
    doc = parse_json_body(ctx)
    values: dict[str, str] = {}
    for key, raw in doc.items():
        if key not in KEYS_BY_NAME:
            continue  # a newer master may send keys this build does not know
        try:
            values[key] = canonical_value(key, str(raw))
        except (LendingSettingError, ValueError) as exc:
            raise RouterError(400, str(exc), param=key) from exc
    before = dict(node.lending.values)
    node.lending.apply_settings(values, source="master")
    after = dict(node.lending.values)
    # Only what changed: the row says which settings the push moved, not all of them.
    changed = sorted(k for k in after if before.get(k) != after[k])
    await arecord_push(
        "settings.update",
        "lending settings (pushed by the master)",
        {k: before.get(k) for k in changed},
        {k: after[k] for k in changed},
    )
    await ctx.respond(204, b"")


async def handle_offload_summary(ctx: Ctx, node: Node) -> None:
    from lending.selectors import lending_summary

    await ctx.json(200, lending_summary(node=node))


async def handle_offload_decisions(ctx: Ctx, node: Node) -> None:
    from urllib.parse import parse_qsl

    from channels.db import database_sync_to_async

    from lending.decisions import decisions_query, parse_decision_filters

    query = dict(parse_qsl(ctx.scope.get("query_string", b"").decode("latin-1")))
    filters = parse_decision_filters(query, default_limit=200, max_limit=5000)
    await node.decisions.flush()
    records = await database_sync_to_async(decisions_query)(**filters)
    await ctx.json(200, {"records": records})


async def handle_audit(ctx: Ctx, node: Node) -> None:
    """This node's audit rows, for the master's `GET /router/v1/site/audit`."""
    from urllib.parse import parse_qsl

    from channels.db import database_sync_to_async

    from access.api.audit import audit_query_parse
    from access.audit import audit_query

    query = dict(parse_qsl(ctx.scope.get("query_string", b"").decode("latin-1")))
    rows = await database_sync_to_async(audit_query)(**audit_query_parse(query))
    await ctx.json(200, {"rows": rows})


async def handle_offload_decision_folds(ctx: Ctx, node: Node) -> None:
    from urllib.parse import parse_qsl

    from channels.db import database_sync_to_async

    from lending.decisions import decisions_fold, parse_decision_filters

    query = dict(parse_qsl(ctx.scope.get("query_string", b"").decode("latin-1")))
    filters = parse_decision_filters(query, default_limit=1, max_limit=1)
    filters.pop("limit")
    await node.decisions.flush()
    await ctx.json(200, await database_sync_to_async(decisions_fold)(**filters))


async def handle_offload_timeline(ctx: Ctx, node: Node) -> None:
    import time
    from urllib.parse import parse_qsl

    from channels.db import database_sync_to_async

    from lending.timeline import lane_slots, timeline_local, timeline_window

    query = dict(parse_qsl(ctx.scope.get("query_string", b"").decode("latin-1")))
    since, until, step = timeline_window(query, now_ms=int(time.time() * 1000))
    await node.decisions.flush()
    doc = await database_sync_to_async(timeline_local)(
        node_id=node.node_id,
        since_ms=since,
        until_ms=until,
        step_ms=step,
        slots=lane_slots(node.catalog.configs.values()),
    )
    await ctx.json(200, doc)


async def handle_offload_impact_rows(ctx: Ctx, node: Node) -> None:
    """This node's rows for the master's lending impact (lending/impact.py)."""
    from urllib.parse import parse_qsl

    from channels.db import database_sync_to_async

    from lending.impact import impact_rows, impact_window

    query = dict(parse_qsl(ctx.scope.get("query_string", b"").decode("latin-1")))
    since_s, until_s = impact_window(query)
    raw_fit = query.get("fit_since_ms", "")
    fit_since_s = int(raw_fit) / 1000 if raw_fit.isdigit() else None
    await node.decisions.flush()
    await node.recorder.flush()
    doc = await database_sync_to_async(impact_rows)(
        since_s=since_s, until_s=until_s, fit_since_s=fit_since_s
    )
    await ctx.json(200, doc)


async def handle_usage(ctx: Ctx, node: Node) -> None:
    """This node's own usage rows for the master's `site/usage` (analytics/usage.py)."""
    import time
    from urllib.parse import parse_qsl

    from channels.db import database_sync_to_async

    from analytics.usage import parse_usage_query, usage_local

    query = dict(parse_qsl(ctx.scope.get("query_string", b"").decode("latin-1")))
    usage = parse_usage_query(query, now_ms=int(time.time() * 1000))
    await node.recorder.flush()
    rows = await database_sync_to_async(usage_local)(node_id=node.node_id, query=usage)
    await ctx.json(200, {"node_id": node.node_id, "rows": rows})


async def handle_offload_event(ctx: Ctx, node: Node) -> None:
    from lending.master import get_master

    if node.role != "master":
        raise RouterError(409, "only the master decides on lending", code="not_master")
    doc = parse_json_body(ctx)
    for key in ("owner_node_id", "model_id"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            raise RouterError(400, f"{key} is required", param=key)
    lease = await get_master(node).on_event(doc)
    await ctx.json(200, {"lease": lease.to_wire()} if lease is not None else {})


async def handle_offload_grant(ctx: Ctx, node: Node) -> None:
    from lending.planner import Lease

    doc = parse_json_body(ctx)
    if isinstance(doc, dict) and doc.get("cleared") is True:
        await _clear_lease(ctx, node, doc)
        return
    try:
        lease = Lease.from_wire(doc)
    except ValueError as exc:
        raise RouterError(400, str(exc)) from exc
    if lease.owner_node_id and lease.owner_node_id != node.node_id:
        raise RouterError(400, "the lease names another owner node", param="owner_node_id")
    node.owner.apply(lease.lane, lease.owner_model_id, lease)
    await ctx.json(200, lease.to_wire())


async def _clear_lease(ctx: Ctx, node: Node, doc: dict[str, Any]) -> None:
    """The master dropped this owner's lease: no more lending (or refilling) under it."""
    lane, model = doc.get("lane"), doc.get("owner_model_id")
    if lane not in ("text", "image"):
        raise RouterError(400, "lane must be text or image", param="lane")
    if not isinstance(model, str) or not model:
        raise RouterError(400, "owner_model_id must be a model ID", param="owner_model_id")
    owner = doc.get("owner_node_id")
    if owner and owner != node.node_id:
        raise RouterError(400, "the lease names another owner node", param="owner_node_id")
    node.owner.apply(lane, model, None)
    await ctx.json(200, {"lane": lane, "owner_model_id": model, "cleared": True})


async def handle_offload_request(ctx: Ctx, node: Node) -> None:
    """Relay a lent request to the leased helper (master only); 409 when it cannot."""
    from lending.flow import offload_returned, relayed_key_share
    from lending.master import RelayRefused, get_master
    from registry.bodies import set_body_model

    if node.role != "master":
        raise RouterError(409, "only the master relays lent requests", code="not_master")
    owner = (ctx.header(b"x-tensors-offload-owner") or b"").decode()
    model = (ctx.header(b"x-tensors-offload-owner-model") or b"").decode()
    path = (ctx.header(b"x-tensors-offload-path") or b"").decode()
    lane = "text" if ctx.header(b"x-tensors-offload-lane") == b"text" else "image"
    route = route_for(path)
    if not owner or not model or route is None or not path.startswith("/") or path.startswith("//"):
        raise RouterError(400, "lent request needs owner, model and a valid inference path")
    master = get_master(node)
    # The owner's key: the helper (this master, or the node it relays to) records it.
    ctx.relayed_key_name = key_name_from_header(ctx.header(KEY_NAME_HEADER_BYTES))
    lease = master.lease_for(lane, owner, model)
    content_type = (ctx.header(b"content-type") or b"application/json").decode("latin-1")
    if lease is not None and lease.helper_node_id == node.node_id:
        # The helper is this master: serve in-process, no public_url needed.
        ctx.path = path
        ctx.borrowed = True
        ctx.offload_load = lease.load_helper_model
        ctx.offload_restore = lease.restore_helper_model
        try:
            ctx.body = set_body_model(ctx.body, lease.helper_model_id)
        except ValueError:
            pass
        await route[1](ctx, node)
        return
    try:
        async with master.open_helper(
            lane=lane,
            owner_node=owner,
            owner_model=model,
            path=path,
            body=ctx.body,
            content_type=content_type,
            request_id=ctx.request_id,
            key_name=ctx.relayed_key_name,
            key_share=relayed_key_share(ctx),
        ) as resp:
            ctype = resp.headers.get("Content-Type", "application/json").encode("latin-1")
            if _streamed(ctype):
                await ctx.start(resp.status, [(b"content-type", ctype)])
                async for chunk in resp.content.iter_any():
                    await ctx.chunk(chunk)
                await ctx.end()
                return
            body = await _whole_answer(resp, master, lane, owner, model, ctx.request_id)
            await ctx.respond(resp.status, body, ctype)
    except RelayRefused as exc:
        raise offload_returned(str(exc)) from exc


def _streamed(content_type: bytes) -> bool:
    return content_type.startswith((b"text/event-stream", b"application/x-ndjson"))


async def _whole_answer(
    resp: Any, master: Any, lane: str, owner: str, model: str, request_id: str
) -> bytes:
    """The helper's whole answer, read before the owner is sent a byte.

    A helper that dies after its headers leaves a body its own framing (length or chunks)
    shows to be cut short. Read here whole, that is an error before anything went on: the
    owner gets its 409 and runs the request itself, instead of passing a truncated answer
    (or an error the client could not retry) to its client. Streams go on as they come: their
    first bytes are already the client's.
    """

    import aiohttp

    try:
        data: bytes = await resp.read()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise master.refuse_cut(lane, owner, model, request_id, exc) from exc
    return data


async def handle_offload_borrowed(ctx: Ctx, node: Node) -> None:
    """The stall check's question: does this node still run borrowed work?"""
    queued = sum(1 for queue in node.lending.queues.values() for e in queue.pending() if e.borrowed)
    await ctx.json(200, {"borrowed": node.restore.borrowed_in_flight + queued})


async def handle_site_inventory(ctx: Ctx, node: Node) -> None:
    """This node's own inventory entry, for the master's `site/inventory`."""
    from urllib.parse import parse_qs

    from registry.inventory import include_files_parse, inventory_local

    query = parse_qs(ctx.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    include_files = include_files_parse(query.get("include_files", [None])[-1])
    await ctx.json(200, await inventory_local(node=node, include_files=include_files))


# -- model assets (registry/assets/) --------------------------------------------------------


def _this_node(node: Node, doc: dict[str, Any]) -> None:
    node_id = doc.get("node_id")
    if node_id is not None and node_id != node.node_id:
        # The master's idea of who answers at this URL is out of date: change nothing here.
        raise RouterError(409, f'this is node "{node.node_id}", not {node_id!r}', code="wrong_node")


def _model_id(doc: dict[str, Any]) -> str:
    value = doc.get("id")
    if not isinstance(value, str) or not value:
        raise RouterError(400, "id is required", param="id")
    return value


async def handle_assets_lookup(ctx: Ctx, node: Node) -> None:
    from registry.assets.routes import parse_hashes

    hashes = parse_hashes(parse_json_body(ctx), body_bytes=len(ctx.body))
    await ctx.json(200, {"assets": await node.assets.lookup_local(hashes)})


async def handle_assets_lookup_cluster(ctx: Ctx, node: Node) -> None:
    from registry.assets.routes import parse_hashes

    if node.role != "master":
        raise RouterError(409, "only the master answers for the cluster", code="not_master")
    hashes = parse_hashes(parse_json_body(ctx), body_bytes=len(ctx.body))
    await ctx.json(200, {"assets": await node.assets.lookup_cluster(hashes)})


async def handle_asset_stream(ctx: Ctx, node: Node) -> None:
    """One verified file of this node, whole or from one byte range on (a resumed pull)."""
    from registry.assets.pull import STREAM_PREFIX
    from registry.assets.routes import parse_range

    found = await node.assets.open_for_serving(ctx.path[len(STREAM_PREFIX) :])
    header = ctx.header(b"range")
    try:
        span = parse_range(header.decode("latin-1") if header is not None else None, found.size)
    except RouterError as err:
        # RFC 9110 15.5.17: the refusal says how large the file is, so the client can ask again.
        unsatisfied = [(b"content-range", f"bytes */{found.size}".encode())]
        await ctx.respond(err.status, error_body(ctx.path, err), extra=unsatisfied)
        return
    first, last = span if span is not None else (0, found.size - 1)
    length = last - first + 1 if found.size else 0
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"content-length", str(length).encode()),
        (b"content-disposition", f'attachment; filename="{found.filename}"'.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"accept-ranges", b"bytes"),
    ]
    if span is not None:
        headers.append((b"content-range", f"bytes {first}-{last}/{found.size}".encode()))
    node.assets.served_streams += 1
    node.assets.served_bytes += length
    await ctx.start(206 if span is not None else 200, headers)
    if PATHSEND in ctx.scope.get("extensions", {}) and not node.config.models.asset_serve_rate:
        # The server reads the file as the socket drains: no copy of it piles up in memory.
        ctx.finished = True
        await ctx.send({"type": PATHSEND, "path": found.path, "offset": first, "length": length})
        return
    async for block in node.assets.read_file(found.path, first, length):
        await ctx.chunk(block)
    await ctx.end()


async def handle_site_asset_export(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    _this_node(node, doc)
    await ctx.json(200, {"config": await node.assets.export(_model_id(doc))})


async def handle_site_asset_resolve(ctx: Ctx, node: Node) -> None:
    from registry.assets.routes import local_resolve

    doc = parse_json_body(ctx)
    _this_node(node, doc)
    wait = doc.get("wait", False)
    if not isinstance(wait, bool):
        raise RouterError(400, "wait must be true or false", param="wait")
    await ctx.json(200, await local_resolve(node.assets, _model_id(doc), wait=wait))


async def handle_site_asset_bind(ctx: Ctx, node: Node) -> None:
    from registry.assets.routes import local_bind

    doc = parse_json_body(ctx)
    _this_node(node, doc)
    await ctx.json(200, await local_bind(node.assets, doc))


async def handle_site_asset_substitute(ctx: Ctx, node: Node) -> None:
    from registry.assets.substitute import local_substitute

    doc = parse_json_body(ctx)
    _this_node(node, doc)
    await ctx.json(200, await local_substitute(node.assets, doc))


async def handle_site_asset_jobs(ctx: Ctx, node: Node) -> None:
    await ctx.json(200, node.assets.status())


async def handle_site_asset_job(ctx: Ctx, node: Node) -> None:
    from registry.assets.routes import local_job

    await ctx.json(200, local_job(node.assets, ctx.path.rsplit("/", 1)[1]))


async def handle_limits(ctx: Ctx, node: Node) -> None:
    """POST: the master takes a slave's per-key limit counts and answers with the rest of the
    cluster's (registry/limitsync.py). GET: the counts as this node sees them."""
    from registry.limitsync import limits_answer, limits_view

    if ctx.method == "GET":
        await ctx.json(200, limits_view(node.node_id))
        return
    if node.role != "master":
        raise RouterError(409, "only the master sums key limit counts", code="not_master")
    doc = parse_json_body(ctx)
    node_id = doc.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise RouterError(400, "node_id must be a non-empty string", param="node_id")
    try:
        answer = limits_answer(node_id, doc)
    except ValueError as exc:
        raise RouterError(400, str(exc), param="keys") from exc
    await ctx.json(200, answer)


async def handle_benchmarks(ctx: Ctx, node: Node) -> None:
    """This node's calibrations: the one running and the last result of each model."""
    if node.benchmarks is None:
        raise RouterError(503, "this node runs no benchmarks", type="backend_error")
    await ctx.json(200, node.benchmarks.status())


async def handle_benchmarks_run(ctx: Ctx, node: Node) -> None:
    """`{"models": [...]}`: start calibrating (the master's `/router/v1/benchmarks/run` for
    models of this node)."""
    from proxy.edge.benchmark import parse_models

    if node.benchmarks is None:
        raise RouterError(503, "this node runs no benchmarks", type="backend_error")
    doc = parse_json_body(ctx) if ctx.body.strip() else {}
    _this_node(node, doc)
    await ctx.json(202, node.benchmarks.start(parse_models(doc.get("models"))))


async def handle_not_found(ctx: Ctx, node: Node) -> None:
    raise RouterError(404, "endpoint not found", type="not_found")


NODE_ROUTES: dict[str, Route] = {
    "/router/v1/node/register": (POST, handle_register, False),
    "/router/v1/node/models": (GET, handle_models, False),
    "/router/v1/node/models/state": (POST, handle_model_state, False),
    "/router/v1/node/runtime-status": (GET, handle_runtime_status, False),
    "/router/v1/node/load": (POST, handle_load, False),
    "/router/v1/node/unload": (POST, handle_unload, False),
    "/router/v1/node/state": (GET, handle_state, False),
    "/router/v1/node/state/unload": (POST, handle_state_unload, False),
    "/router/v1/node/routing-links": (POST, handle_routing_links, False),
    "/router/v1/node/offload/settings": (POST, handle_offload_settings, False),
    "/router/v1/node/guardians": (POST, handle_guardians, False),
    "/router/v1/node/api-keys": (GET_POST, handle_api_keys, False),
    "/router/v1/node/limits": (GET_POST, handle_limits, False),
    "/router/v1/node/benchmarks": (GET, handle_benchmarks, False),
    "/router/v1/node/benchmarks/run": (POST, handle_benchmarks_run, False),
    "/router/v1/node/offload/summary": (GET, handle_offload_summary, False),
    "/router/v1/node/offload/decisions": (GET, handle_offload_decisions, False),
    "/router/v1/node/offload/decisions/folded": (GET, handle_offload_decision_folds, False),
    "/router/v1/node/offload/timeline": (GET, handle_offload_timeline, False),
    "/router/v1/node/offload/impact-rows": (GET, handle_offload_impact_rows, False),
    "/router/v1/node/audit": (GET, handle_audit, False),
    "/router/v1/node/usage": (GET, handle_usage, False),
    "/router/v1/node/offload/event": (POST, handle_offload_event, False),
    "/router/v1/node/offload/grant": (POST, handle_offload_grant, False),
    "/router/v1/node/offload/request": (POST, handle_offload_request, False),
    "/router/v1/node/offload/borrowed": (GET, handle_offload_borrowed, False),
    "/router/v1/node/site/inventory": (GET, handle_site_inventory, False),
    "/router/v1/node/assets/lookup": (POST, handle_assets_lookup, False),
    "/router/v1/node/assets/lookup-cluster": (POST, handle_assets_lookup_cluster, False),
    "/router/v1/node/site/model-assets/export": (POST, handle_site_asset_export, False),
    "/router/v1/node/site/model-assets/resolve": (POST, handle_site_asset_resolve, False),
    "/router/v1/node/site/model-assets/jobs": (GET, handle_site_asset_jobs, False),
    "/router/v1/node/site/model-assets/bind": (POST, handle_site_asset_bind, False),
    "/router/v1/node/site/model-assets/substitute": (POST, handle_site_asset_substitute, False),
}
ASSET_STREAM_PREFIX = "/router/v1/node/assets/"
ASSET_JOB_PREFIX = "/router/v1/node/site/model-assets/jobs/"


def _inner(handler: Handler, inner_path: str) -> Handler:
    async def run(ctx: Ctx, node: Node) -> None:
        # Served through this node's own pipeline, exactly as a client request to it would be.
        # Only here, behind the cluster token, is the borrowed mark read from a header.
        ctx.path = inner_path
        ctx.relayed_key_name = key_name_from_header(ctx.header(KEY_NAME_HEADER_BYTES))
        if ctx.header(b"x-tensors-offload") == b"1":
            ctx.borrowed = True
            ctx.offload_load = ctx.header(b"x-tensors-offload-load") == b"1"
            ctx.offload_restore = ctx.header(b"x-tensors-offload-restore") == b"1"
        # A master sending a request to the guardian on the text-only model's own node asks
        # that node to load its model back afterwards.
        ctx.guardian_restore = ctx.header(b"x-tensors-guardian-restore") == b"1"
        await handler(ctx, node)

    return run


def node_route(path: str) -> Route:
    route = NODE_ROUTES.get(path)
    if route is not None:
        return route
    if path.startswith(ASSET_STREAM_PREFIX) and "/" not in path[len(ASSET_STREAM_PREFIX) :]:
        return (GET, handle_asset_stream, False)
    if path.startswith(ASSET_JOB_PREFIX) and "/" not in path[len(ASSET_JOB_PREFIX) :]:
        return (GET, handle_site_asset_job, False)
    if path.startswith(INFERENCE_PREFIX + "/"):
        inner = path[len(INFERENCE_PREFIX) :]
        if inner.startswith("//") or inner.startswith("/\\"):
            return (ANY, handle_not_found, False)
        client_route = route_for(inner)
        if client_route is not None:
            methods, handler, _ = client_route
            return (methods, _inner(handler, inner), False)
    return (ANY, handle_not_found, False)
