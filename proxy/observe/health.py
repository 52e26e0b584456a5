"""What an operator sees of each request and of the node: the access line, `/metrics`,
`/healthz` and `/readyz`.

One access line per client request (logger `router.access`, INFO): request ID, method, path,
the model asked, the node and backend that served it, the helper it was lent to, status, bytes
sent and milliseconds. Work another node sends here (`/router/v1/node/inference/…`) gets its
line too, so a request forwarded or lent can be followed across nodes by its ID. The node
protocol's routine calls (health polls, runtime status, registrations) and the probes of
orchestrators go at DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.db import database_sync_to_async

from access.keys import admin_caller, current_table
from proxy.node import Node
from proxy.observe import metrics
from proxy.request import Ctx
from routerproject.errors import RouterError
from routerproject.logfast import RecordMaker

access = logging.getLogger("router.access")

ACCESS_FORMAT = "%s %s model=%s node=%s backend=%s lent_to=%s key=%s status=%d bytes=%d ms=%.1f"
OPS_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
CLIENT_CLOSED = 499
READY_DB_TIMEOUT_SECS = 2.0


def finish(ctx: Ctx, node: Node, *, cluster_call: bool) -> None:
    """The request is over: count it and write its access line."""
    path = ctx.path
    counted = not cluster_call or path.startswith(metrics.NODE_INFERENCE_PREFIX)
    if path in OPS_PATHS or not counted:
        if access.isEnabledFor(logging.DEBUG):
            _line(ctx, node, logging.DEBUG, _status(ctx), time.monotonic())
        return
    now = time.monotonic()
    status = _status(ctx)
    metrics.request_finished(ctx, node, status, now)
    if access.isEnabledFor(logging.INFO):
        _line(ctx, node, logging.INFO, status, now)


def _status(ctx: Ctx) -> int:
    if ctx.disconnected and not ctx.finished:
        return CLIENT_CLOSED
    return ctx.status or 500


def _line(ctx: Ctx, node: Node, level: int, status: int, now: float) -> None:
    ms = round((now - ctx.t0) * 1000.0, 1)
    fields: dict[str, Any] = {
        "event": "access",
        "request_id": request_id(ctx),
        "method": ctx.method,
        "path": ctx.path,
        "model": ctx.model[:200],
        "node": ctx.served_node or node.node_id,
        "backend": ctx.backend,
        "lent": bool(ctx.lent_to),
        "lent_to": ctx.lent_to,
        "key_name": ctx.key_name,
        "status": status,
        "bytes": ctx.sent_bytes,
        "ms": ms,
    }
    args = (
        ctx.method,
        ctx.path,
        fields["model"] or "-",
        fields["node"],
        ctx.backend or "-",
        ctx.lent_to or "-",
        fields["key_name"] or "-",
        status,
        ctx.sent_bytes,
        ms,
    )
    # The record `access.log` would make, less its walk up the stack for the caller's file and
    # line (no log format shows them; it cost more than any field of the line) and less
    # makeRecord's generic work (routerproject/logfast.py): one line per request, so it counts.
    # The request ID leads every line already (the format's `[id]`).
    record = _records.make(level, ACCESS_FORMAT, args, fields)
    access.handle(record)


# The caller is `_line`, named from its code object: a frame object held in a local there would
# be a reference cycle (the frame holds its locals) keeping the record, the request's context and
# its callers' frames alive until a collection, every request.
_records = RecordMaker(access, _line.__code__)


def request_id(ctx: Ctx) -> str:
    # The ID the answer carries: the client's own, or the one the node made for it.
    return ctx.request_id


# -- /metrics, /healthz, /readyz ------------------------------------------------------------------


async def handle_ping(ctx: Ctx, node: Node) -> None:
    """`/ping`: the process answers."""
    await ctx.json(200, {"status": "healthy"})


async def handle_metrics(ctx: Ctx, node: Node) -> None:
    """Prometheus text format; behind an admin key (config or stored) when admin keys exist."""
    header = ctx.header(b"authorization") or b""
    token = header[7:].strip() if header.startswith(b"Bearer ") else b""
    config_keys = tuple(key.encode() for key in node.config.auth.admin_keys)
    if admin_caller(token, config_keys, current_table()) is None:
        raise RouterError(401, "a valid admin key is required", type="unauthorized")
    await ctx.respond(200, metrics.exposition(node), metrics.CONTENT_TYPE)


async def handle_healthz(ctx: Ctx, node: Node) -> None:
    """The process serves: nothing else is asked (a liveness check must not fail on a busy
    database and get a working node restarted)."""
    await ctx.json(200, {"status": "ok", "node_id": node.node_id})


async def handle_readyz(ctx: Ctx, node: Node) -> None:
    """200 when the node can take traffic, else 503 naming every check that failed."""
    checks = await readiness(node)
    failed = {name: why for name, why in checks.items() if why}
    doc = {
        "status": "ready" if not failed else "not_ready",
        "node_id": node.node_id,
        "role": node.role,
        "checks": {name: why or "ok" for name, why in checks.items()},
    }
    await ctx.json(200 if not failed else 503, doc)


_migrations_applied = False


def _database_check() -> str:
    """'' when the database answers and every migration is applied, else why not."""
    global _migrations_applied
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        if not _migrations_applied:
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
            if plan:
                return f"{len(plan)} migrations not applied"
            # Applied migrations stay applied while the process lives: ask once.
            _migrations_applied = True
    except Exception as exc:
        return f"database: {type(exc).__name__}: {exc}"
    return ""


async def readiness(node: Node) -> dict[str, str]:
    """Each check's failure reason, '' for a check that passed."""
    checks: dict[str, str] = {}
    try:
        checks["database"] = await asyncio.wait_for(
            database_sync_to_async(_database_check)(), READY_DB_TIMEOUT_SECS
        )
    except TimeoutError:
        checks["database"] = f"database did not answer within {READY_DB_TIMEOUT_SECS:g}s"
    if not node.cluster.view_ready:
        checks["registry"] = "cluster view not ready: the first round of health polls is not over"
    else:
        checks["registry"] = "" if node.ready else "startup is not over"
    if node.role == "slave":
        registered = node.sync is not None and node.sync.registered_at is not None
        checks["registered"] = "" if registered else "not registered with the master"
    return checks
