"""The router's ASGI front: client inference paths and the node protocol, ahead of Django.

`ProxyApp` claims the client paths of `proxy.edge.routes.route_for` and everything under
`/router/v1/node/`; every other request (management API, admin, WebUI) falls through to Django,
a management request only once its admin key is checked, before Django reads its body.

Each request runs linear phases: authorize, read the body (bounded), count it against its
key's limits (`proxy.edge.limits`), handle (which may wait for a model load), stream the
answer, release. While the request is in flight, a client that goes away cancels it, so it
frees its backend slot (and its key's concurrency slot) at once (the server never cancels an
app whose client left): the node's own server says so through its disconnect watch
(`proxy.edge.hooks`), any other server through `http.disconnect`, which a task then waits for.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
from django.conf import settings

from access.identity import ANONYMOUS_CALLER, CALLER_SCOPE_KEY, Caller, caller_of
from access.keys import admin_caller
from access.limits import Ticket
from proxy.edge import limits
from proxy.edge.gate import MASTER_CALLER, Gate, Refusal, bearer_token, parse_address
from proxy.edge.hooks import DISCONNECT_WATCH, DisconnectWatch
from proxy.edge.nodeapi import NODE_PREFIX, node_route
from proxy.edge.routes import route_for
from proxy.edge.tls import CLIENT_CERT_SCOPE_KEY, client_cert_refusal
from proxy.node import Node, get_node
from proxy.observe import health
from proxy.request import JSON, WHOLE_ANSWER, ASGIApp, Ctx, Receive, Scope, Send
from proxy.serving.core import Handler, Route
from routerproject import request_ids
from routerproject.api import admin_key_required
from routerproject.errors import RouterError, error_body, is_anthropic_path, is_ollama_path

logger = logging.getLogger(__name__)


# -- the ASGI application -------------------------------------------------------------------


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _with_request_id(send: Send, request_id: str) -> Send:
    """`send` that adds the request ID to the answer Django (or the WebUI) starts."""
    header = (request_ids.HEADER, request_id.encode("ascii"))

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), header]}
        await send(message)

    return sending


def _too_big(limit: int) -> RouterError:
    return RouterError(
        413, f"request body is larger than the limit of {limit} bytes", code="body_too_large"
    )


def _client_gone(ctx: Ctx, task: asyncio.Task[Any]) -> None:
    if not ctx.finished:
        ctx.disconnected = True
        task.cancel()


def _resolve(path: str) -> tuple[Route, bool] | None:
    """A client path's route, or a node path's (True: a cluster call); None for the rest,
    which the management views answer."""
    route = route_for(path)
    if route is not None:
        return route, False
    if not path.startswith(NODE_PREFIX):
        return None
    return node_route(path), True


class ProxyApp:
    """Claims the inference paths; hands every other request to `fallback` (Django)."""

    def __init__(self, fallback: Any, *, node_getter: Callable[[], Node] = get_node) -> None:
        self.fallback: ASGIApp = fallback
        self.node_getter = node_getter
        self._gate: Gate | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        request_id = request_ids.from_header(_header(scope, request_ids.HEADER))
        token = request_ids.bind(request_id)
        try:
            await self._http(scope, receive, send, request_id)
        finally:
            request_ids.unbind(token)

    async def _http(self, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        path = scope["path"]
        refusal, gate = self._guard(scope, path)
        if refusal is not None:
            ctx = Ctx(scope, receive, send, path, scope["method"])
            await ctx.start(refusal.status, [(b"content-type", JSON), *refusal.headers])
            await ctx.end(refusal.body(path))
            return
        resolved = _resolve(path)
        if resolved is None:
            await self._management(scope, receive, _with_request_id(send, request_id), gate)
            return
        (methods, handler, needs_key), cluster_call = resolved
        ctx = Ctx(scope, receive, send, path, scope["method"], request_id=request_id)
        if WHOLE_ANSWER in scope.get("extensions", ()):
            ctx.whole_send = send
        node = self.node_getter()
        ticket: Ticket | None = None
        try:
            if cluster_call:
                # The cluster token opens only node routes, and every node route needs it.
                self._authorize_node(ctx, node)
                scope[CALLER_SCOPE_KEY] = MASTER_CALLER
            if ctx.method not in methods:
                await self._method_not_allowed(ctx, methods)
                return
            if not cluster_call:
                scope[CALLER_SCOPE_KEY] = (
                    self._authorize(ctx, gate) if needs_key else ANONYMOUS_CALLER
                )
            ticket = await self._take_in(ctx, node, cluster_call)
            await self._run(ctx, node, handler)
        except RouterError as err:
            if not ctx.started:
                await ctx.error(err)
            else:
                await self._abort_stream(ctx, err)
        except asyncio.CancelledError:
            if not ctx.disconnected:
                raise
        except Exception:
            logger.exception("unhandled error on %s", ctx.path)
            internal = RouterError(500, "internal router error", type="server_error")
            if not ctx.started:
                await ctx.error(internal)
            else:
                await self._abort_stream(ctx, internal)
        finally:
            limits.release(ticket)
            health.finish(ctx, node, cluster_call=cluster_call)

    async def _take_in(self, ctx: Ctx, node: Node, cluster_call: bool) -> Ticket | None:
        """Read the body and count the request against its key's limits (a 429 raised past
        one); the ticket to give back when it ends. A node-protocol call was counted where
        the client sent it."""
        if ctx.method == "POST":
            await self._read_body(ctx, node.config.server.max_body_bytes)
        return None if cluster_call else limits.admit(ctx, caller_of(ctx.scope))

    def _guard(self, scope: Scope, path: str) -> tuple[Refusal | None, Gate]:
        """The address and browser rules again, for requests that did not come through the
        node's front door (which applies them before reading the body); and the gate whose key
        rules the request is then held to."""
        config = self.node_getter().config
        gate = self._gate
        if gate is None or gate.config is not config:
            # Django's list: the same hosts, plus the test client's when Django's test
            # environment added it.
            hosts = settings.ALLOWED_HOSTS
            gate = self._gate = Gate(
                config,
                browser_hosts=None
                if "*" in hosts
                else [host.strip("[]").lower() for host in hosts],
            )

        def header(name: bytes) -> bytes | None:
            return _header(scope, name)

        client = scope.get("client")
        peer = parse_address(client[0]) if client else None
        refusal = gate.address_refusal(peer, header, path) or gate.host_refusal(path, header)
        return refusal, gate

    async def _management(self, scope: Scope, receive: Receive, send: Send, gate: Gate) -> None:
        path, method = scope["path"], scope["method"]
        # `send` already adds the request ID: this context must not add it twice.
        ctx = Ctx(scope, receive, send, path, method)
        # The admin keys of Django's settings, as this check always read them (the same list
        # as the node's config in a router process; tests change the settings alone).
        config_keys = tuple(key.encode() for key in settings.ROUTER.auth.admin_keys)
        token = bearer_token(ctx.header(b"authorization"))
        caller = admin_caller(token, config_keys, gate.keys())
        if caller is None:
            if admin_key_required(path, method):
                await ctx.error(
                    RouterError(401, "a valid admin key is required", type="unauthorized")
                )
                return
            # A public page (the WebUI, the schema) or no route: nobody in particular.
            caller = ANONYMOUS_CALLER
        scope[CALLER_SCOPE_KEY] = caller
        refusal = gate.write_refusal(method, path, ctx.header)
        if refusal is not None:
            await ctx.error(refusal.error())
            return
        await self.fallback(scope, receive, send)

    async def _run(self, ctx: Ctx, node: Node, handler: Handler) -> None:
        task = asyncio.current_task()
        assert task is not None
        watch: DisconnectWatch | None = None
        watcher: asyncio.Future[None] | None = None
        if DISCONNECT_WATCH in ctx.scope.get("extensions", ()):
            # The node's own server tells us when the client leaves: no task needed.
            watch = DisconnectWatch(partial(_client_gone, ctx, task))
            await ctx.send({"type": DISCONNECT_WATCH, "watch": watch})
        else:
            watcher = asyncio.ensure_future(self._watch_disconnect(ctx, task))
        # Counted for shutdown: forwarded and relayed requests hold no runtime of this node.
        node.requests.begin()
        try:
            await handler(ctx, node)
        finally:
            node.requests.end()
            if watch is not None:
                watch.cancel()
            if watcher is not None:
                watcher.cancel()

    @staticmethod
    async def _watch_disconnect(ctx: Ctx, task: asyncio.Task[Any]) -> None:
        while True:
            message = await ctx.receive()
            if message["type"] == "http.disconnect":
                _client_gone(ctx, task)
                return

    @staticmethod
    async def _abort_stream(ctx: Ctx, err: RouterError) -> None:
        # Headers are out, so the status cannot change: say what went wrong in the stream's own
        # format and close it, so the client sees an error rather than a silent truncation.
        if ctx.finished:
            return
        if is_ollama_path(ctx.path):
            await ctx.end(orjson.dumps({"error": err.message}) + b"\n")
        elif is_anthropic_path(ctx.path):
            # Anthropic's stream error event, which its SDKs raise as the error it carries.
            await ctx.end(b"event: error\ndata: " + error_body(ctx.path, err) + b"\n\n")
        else:
            await ctx.end(b"data: " + orjson.dumps(err.envelope()) + b"\n\n")

    @staticmethod
    async def _method_not_allowed(ctx: Ctx, methods: frozenset[str]) -> None:
        allow = ", ".join(sorted(methods)).encode()
        err = RouterError(405, f"method {ctx.method} is not allowed on {ctx.path}")
        await ctx.start(405, [(b"content-type", JSON), (b"allow", allow)])
        await ctx.end(error_body(ctx.path, err))

    @staticmethod
    def _authorize(ctx: Ctx, gate: Gate) -> Caller:
        caller = gate.client_caller(ctx.header)
        if caller is None:
            raise RouterError(401, "a valid inference key is required", type="unauthorized")
        return caller

    @staticmethod
    def _authorize_node(ctx: Ctx, node: Node) -> None:
        token = node.config.cluster.token
        if not token or node.role == "standalone":
            raise RouterError(401, "cluster token is required", type="unauthorized")
        if node.config.server.tls_client_ca_file is not None and not ctx.scope.get(
            CLIENT_CERT_SCOPE_KEY
        ):
            # Before the token's verdict, so a caller without the certificate cannot test tokens.
            raise client_cert_refusal().error()
        header = ctx.header(b"authorization") or b""
        given = header[7:].strip() if header.startswith(b"Bearer ") else b""
        ok = False
        for accepted in (token, *node.config.cluster.previous_tokens):
            ok |= hmac.compare_digest(given, accepted.encode())
        if not ok:
            raise RouterError(401, "invalid cluster token", type="unauthorized")

    @staticmethod
    async def _read_body(ctx: Ctx, limit: int) -> None:
        length = ctx.header(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _too_big(limit)
        parts: list[bytes] = []
        size = 0
        while True:
            message = await ctx.receive()
            if message["type"] == "http.disconnect":
                ctx.disconnected = True
                raise asyncio.CancelledError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_big(limit)
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        ctx.body = parts[0] if len(parts) == 1 else b"".join(parts)
