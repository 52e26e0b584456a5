"""The `/v1/realtime` WebSocket: one client session relayed to the backend serving its model.

A session names its model as OpenAI's realtime API does (`?model=`) and is pinned to one
replica for its whole life: on this node, a socket to the model's backend (its runtime is held
as one request, so the model is not switched away under the session); on another node, a socket
to that node's node route `/router/v1/node/inference/v1/realtime` with the cluster token, where
the node serves it from its own backend in turn. Text and binary frames pass both ways as they
come; in text frames from the backend, a JSON top-level `model` (and `session.model`) is the
served ID rewritten to the public one. Close codes pass both ways: the client's close closes
the backend socket with the client's code, and the backend's close reaches the client with the
backend's code and reason.

ComfyUI's progress socket `/ws?clientId=…` is relayed the same way, to the image backend of
`?model=` or, without one, of the model a ComfyUI request naming none goes to (the selected
checkpoint, the only image model, else the first by ID); that backend then tells it the
progress of the prompts posted there with the same `client_id`.

Auth: the inference key as `Authorization: Bearer`, or the `openai-insecure-api-key.<key>`
subprotocol the browser SDK sends (proxy/edge/gate.py, which the front door applies before the
upgrade too). A session that cannot start is accepted, told why in one OpenAI-style `error`
event, and closed with code 4000 + the HTTP status it would have had (4400, 4404, 4502, 4503).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode

import aiohttp
import orjson
import uvicorn
from uvicorn._types import ASGISendEvent, WebSocketCloseEvent
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

from access.identity import CALLER_SCOPE_KEY, caller_of
from proxy.edge.caps import Cancellable, Clock
from proxy.edge.gate import KEY_SUBPROTOCOL_PREFIX, MASTER_CALLER, Gate, parse_address
from proxy.edge.nodeapi import INFERENCE_PREFIX
from proxy.edge.tls import CLIENT_CERT_SCOPE_KEY
from proxy.families.media.handlers import COMFY_WS_PATH, default_image_model
from proxy.families.voice.handlers import REALTIME_PATH
from proxy.node import Node, get_node
from proxy.request import Receive, Scope, Send, model_not_allowed
from proxy.runtimes.backends import auth_headers
from proxy.runtimes.runtime import SessionHold
from registry.cluster import Replica
from registry.httpclient import get_session
from registry.kcpps import Lane
from registry.nodeclient import NodeCallError
from registry.routing import Kind, lane_of, resolve
from routerproject.errors import BackendError, RouterError

logger = logging.getLogger(__name__)

NODE_REALTIME_PATH = INFERENCE_PREFIX + REALTIME_PATH
NODE_COMFY_WS_PATH = INFERENCE_PREFIX + COMFY_WS_PATH
# Each WebSocket path a client or a node may open, and the backend path it is relayed to.
WS_PATHS = {
    REALTIME_PATH: REALTIME_PATH,
    NODE_REALTIME_PATH: REALTIME_PATH,
    COMFY_WS_PATH: COMFY_WS_PATH,
    NODE_COMFY_WS_PATH: COMFY_WS_PATH,
}
# How long the backend has to answer a close before its socket is dropped: a relay whose client
# is gone ends within it (the server cancels no relay; `Collector` waits for them).
BACKEND_CLOSE_SECS = 1.0
HEARTBEAT_SECS = 20.0
ERROR_CLOSE_BASE = 4000
# Codes an endpoint may put in a close frame (RFC 6455 §7.4); the others only describe a
# connection that ended without one.
_SENDABLE = frozenset({1000, 1001, 1002, 1003, *range(1007, 1015)}) | frozenset(range(3000, 5000))
NO_CLOSE_FRAME = 1005
GOING_AWAY = 1001
INTERNAL_ERROR = 1011
# What the network or the peer's protocol can throw at a relay: the session ends, no bug.
NETWORK_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)


def sendable(code: int | None, *, fallback: int = GOING_AWAY) -> int:
    """`code` when a close frame may carry it; `fallback` for a connection that just dropped."""
    return code if code is not None and code in _SENDABLE else fallback


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


@dataclass
class Session:
    """What the relay of one session needs once it is pinned."""

    public_id: str
    served_id: str

    def rewrite(self, text: str) -> str:
        """A backend text frame with its served model ID put back to the public one."""
        return _swap_model(text, self.served_id, self.public_id)

    def inward(self, text: str) -> str:
        """A client text frame (a `session.update` naming the model) with the served ID."""
        return _swap_model(text, self.public_id, self.served_id)


def _swap_model(text: str, old: str, new: str) -> str:
    """`text` with a JSON top-level `model`, or `session.model`, of `old` set to `new`."""
    if old == new or '"model"' not in text:
        return text
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if not isinstance(doc, dict):
        return text
    changed = False
    if doc.get("model") == old:
        doc["model"] = new
        changed = True
    inner = doc.get("session")
    if isinstance(inner, dict) and inner.get("model") == old:
        inner["model"] = new
        changed = True
    return orjson.dumps(doc).decode() if changed else text


def _kind(node: Node, model: str) -> Kind:
    """What a realtime session for `model` runs on: a model that speaks first, then a text
    model, then a transcription model (vLLM's realtime transcription)."""
    records = [r.record for r in node.cluster.by_public_id.get(model, ())]
    for kind, flag in (("speech", "has_tts"), ("llm", "has_llm"), ("voice", "has_voice")):
        if any(rec.get(flag) and not rec.get("disabled") for rec in records):
            return kind  # type: ignore[return-value]
    return "speech"  # resolve() then says why it cannot


def _stop_heartbeat(backend: aiohttp.ClientWebSocketResponse) -> None:
    """Cancel a closed socket's heartbeat timer. aiohttp (3.14) re-arms it when bytes arrive
    while the socket closes, and the timer then keeps the socket, its buffers and response
    alive for another heartbeat and pong (~30 s): 3,072 sessions closed at once held ~100 MB."""
    cancel = getattr(backend, "_cancel_heartbeat", None)
    if cancel is not None:
        cancel()


class RealtimeApp:
    """The ASGI application for WebSocket connections (Channels' protocol router)."""

    def __init__(self, *, node_getter: Callable[[], Node] = get_node) -> None:
        self.node_getter = node_getter
        self._gate: Gate | None = None

    def gate(self, node: Node) -> Gate:
        gate = self._gate
        if gate is None or gate.config is not node.config:
            gate = self._gate = Gate(node.config, browser_hosts=None)
        return gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        path = scope["path"]
        inner = WS_PATHS.get(path)
        if inner is None:
            await send({"type": "websocket.close", "code": 1000})
            return
        node = self.node_getter()
        client = scope.get("client")
        gate = self.gate(node)

        def header(name: bytes) -> bytes | None:
            return _header(scope, name)

        # The front door refused these with their HTTP status already; a connection that
        # reached the app another way is refused here (a close before accept is an HTTP 403).
        peer = parse_address(client[0]) if client else None
        if gate.address_refusal(peer, header) or gate.key_refusal("GET", path, header):
            await send({"type": "websocket.close", "code": 1000})
            return
        from_node = path != inner
        scope[CALLER_SCOPE_KEY] = MASTER_CALLER if from_node else gate.client_caller(header)
        relay = Relay(node, scope, receive, send, from_node=from_node, inner=inner)
        await relay.run()


class Relay:
    """One session: pin it, connect the backend side, pass frames until either side closes."""

    def __init__(
        self,
        node: Node,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        from_node: bool,
        inner: str = REALTIME_PATH,
    ) -> None:
        self.node = node
        self.inner = inner
        """The client path of the socket: the backend's own path for it."""
        self.comfy = inner == COMFY_WS_PATH
        self.scope = scope
        self.receive = receive
        self.send = send
        self.from_node = from_node
        self.query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        self.client_gone = False
        self.accepted = False
        self.close_sent = False
        self.offered = [
            p for p in scope.get("subprotocols", ()) if not p.startswith(KEY_PREFIX_TEXT)
        ]
        # When a frame last passed either way (pings and pongs do not count).
        self.last_frame = time.monotonic()

    def _model(self) -> str:
        models = [value.strip() for key, value in self.query if key == "model"]
        if (not models or not models[-1]) and self.comfy:
            # ComfyUI's clients name no model: the one their prompts would go to.
            return default_image_model(self.node)
        if not models or not models[-1]:
            raise RouterError(400, "model is required: ?model=<id>", param="model")
        return models[-1]

    async def run(self) -> None:
        try:
            model = self._model()
            if not caller_of(self.scope).may_use(model):
                raise model_not_allowed(model)
            kind: Kind = "image" if self.comfy else _kind(self.node, model)
            replica = resolve(self.node, model, kind, borrowed=self.from_node)
        except RouterError as err:
            await self._refuse(err)
            return
        lane = lane_of(kind)
        started = time.monotonic()
        try:
            async with self._backend(replica, model, lane) as (backend, session):
                await self.send(
                    {"type": "websocket.accept", "subprotocol": backend.protocol or None}
                )
                self.accepted = True
                await self._pump(backend, session)
        except RouterError as err:
            await self._refuse(err)
        except Exception:
            # Not the network nor the backend refusing (those are RouterErrors by now): a bug,
            # kept with its traceback rather than passed off as a 502.
            logger.exception("realtime session for %s on %s failed", model, replica.node_id)
            await self._fail()
        finally:
            logger.info(
                "realtime session for %s on %s ended after %.1fs",
                model,
                replica.node_id,
                time.monotonic() - started,
            )

    async def _refuse(self, err: RouterError) -> None:
        if err.models:
            # As an HTTP answer lists them: the models the session's key may use.
            caller = caller_of(self.scope)
            err = err.with_models(m for m in err.models if caller.may_use(m))
        await self.send({"type": "websocket.accept"})
        self.accepted = True
        event = {"type": "error", "error": err.envelope()["error"]}
        await self.send({"type": "websocket.send", "text": orjson.dumps(event).decode()})
        code = ERROR_CLOSE_BASE + err.status if 400 <= err.status < 600 else INTERNAL_ERROR
        self.close_sent = True
        await self.send({"type": "websocket.close", "code": code, "reason": err.message[:120]})

    async def _fail(self) -> None:
        """The one answer to a session that failed on a bug, wherever it had got to."""
        if self.client_gone or self.close_sent:
            return
        if not self.accepted:
            message = "the realtime relay failed; see the router's log"
            failure = RouterError(500, message, type="server_error")
            await self._refuse(failure)
            return
        self.close_sent = True
        await self.send({"type": "websocket.close", "code": INTERNAL_ERROR})

    def _backend_query(self, served_id: str, *, named: bool = True) -> str:
        rest = [(key, value) for key, value in self.query if key != "model"]
        return urlencode([("model", served_id), *rest] if named else rest)

    @contextlib.asynccontextmanager
    async def _backend(
        self, replica: Replica, public_id: str, lane: Lane
    ) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, Session]]:
        """The backend side's socket, held open for the session (and the runtime with it)."""
        node = self.node
        busy_key = (replica.node_id, replica.local_id, lane)
        node.busy[busy_key] += 1
        try:
            if replica.cfg is None:
                async with self._remote(replica, public_id) as pair:
                    yield pair
            else:
                async with self._local(replica, public_id, lane) as pair:
                    yield pair
        finally:
            node.busy[busy_key] -= 1

    @contextlib.asynccontextmanager
    async def _local(
        self, replica: Replica, public_id: str, lane: Lane
    ) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, Session]]:
        node = self.node
        assert replica.cfg is not None
        cfg = await node.assets.ready(replica.cfg)
        runtime = node.runtimes.runtime_for(cfg, lane)
        try:
            launch = await runtime.acquire(cfg)
        except BackendError as exc:
            raise RouterError(
                502, f"backend for model {public_id!r} failed: {exc}", type="backend_error"
            ) from exc
        # Requests for another model on this lane wait for the session only so long.
        hold = SessionHold(public_id, time.time(), lambda: self.last_frame)
        runtime.sessions.append(hold)
        try:
            served = cfg.served_model
            url = f"{launch.base_url}{launch.backend_path(self.inner)}"
            # ComfyUI's socket is its backend's alone: the model is the router's word.
            url += "?" + self._backend_query(served, named=not self.comfy)
            async with self._connect(url, auth_headers(cfg), public_id, launch.tls) as backend:
                yield backend, Session(public_id, served)
        finally:
            runtime.sessions.remove(hold)
            runtime.release()

    @contextlib.asynccontextmanager
    async def _remote(
        self, replica: Replica, public_id: str
    ) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, Session]]:
        client = self.node.client
        if client is None:
            raise RouterError(502, "this node has no cluster client", type="backend_error")
        try:
            url = client.checked_url(
                replica.node_url,
                INFERENCE_PREFIX + self.inner + "?" + self._backend_query(replica.local_id),
            )
        except NodeCallError as exc:
            raise RouterError(
                502, f"node {replica.node_id!r} cannot be reached: {exc}", type="backend_error"
            ) from exc
        headers = {"Authorization": client.authorization}
        async with self._connect(url, headers, public_id, client.ssl) as backend:
            yield backend, Session(public_id, replica.local_id)

    @contextlib.asynccontextmanager
    async def _connect(
        self, url: str, headers: dict[str, str], public_id: str, tls: ssl.SSLContext | bool
    ) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
        try:
            backend = await get_session().ws_connect(
                url,
                headers=headers,
                ssl=tls,
                protocols=self.offered,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=BACKEND_CLOSE_SECS),
                max_msg_size=0,
                autoping=True,
                # A backend that died without closing is noticed by its missing pong.
                heartbeat=HEARTBEAT_SECS,
                compress=0,
            )
        except aiohttp.WSServerHandshakeError as exc:
            status = exc.status if exc.status in (401, 403, 404, 503) else 502
            raise RouterError(
                status if status != 401 else 502,
                f"the backend for {public_id!r} refused the WebSocket: HTTP {exc.status}",
                type="backend_error",
            ) from exc
        except NETWORK_ERRORS as exc:
            raise RouterError(
                502,
                f"the backend for {public_id!r} cannot be reached: {type(exc).__name__}: {exc}",
                type="backend_error",
            ) from exc
        try:
            yield backend
        finally:
            if not backend.closed:
                # A session that ended on the client's side (or on an error) closes the
                # backend's socket now, not when the backend next writes.
                try:
                    await backend.close(code=GOING_AWAY)
                except NETWORK_ERRORS as exc:
                    logger.info("closing the backend socket of %s failed: %s", public_id, exc)
            _stop_heartbeat(backend)

    async def _pump(self, backend: aiohttp.ClientWebSocketResponse, session: Session) -> None:
        up = asyncio.ensure_future(self._client_to_backend(backend, session))
        down = asyncio.ensure_future(self._backend_to_client(backend, session))
        idle = asyncio.ensure_future(self._close_when_idle(session))
        try:
            done, _ = await asyncio.wait((up, down, idle), return_when=asyncio.FIRST_COMPLETED)
            if up in done and not self.client_gone:
                # A client frame met a backend socket that is closing: the backend's close
                # (code and reason) is what the client must get, and `down` is reading it.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(down), BACKEND_CLOSE_SECS)
        finally:
            for task in (up, down, idle):
                task.cancel()
            sides = ((up, "client to backend"), (down, "backend to client"), (idle, "idle"))
            for task, side in sides:
                try:
                    await task
                except asyncio.CancelledError:
                    pass  # cancelled just above: the other side had ended the session
                except NETWORK_ERRORS as exc:
                    logger.info("realtime relay of %s, %s, ended: %s", session.public_id, side, exc)
                except Exception:
                    logger.exception("realtime relay of %s, %s, failed", session.public_id, side)
            if not self.client_gone and not self.close_sent:
                # The relay failed under the session: the client is told, not left hanging.
                self.close_sent = True
                await self.send({"type": "websocket.close", "code": INTERNAL_ERROR})

    async def _close_when_idle(self, session: Session) -> None:
        """Close the session once no frame has passed for `server.realtime_idle_timeout`: it
        holds its lane, and a client that only answers pings would hold it for hours."""
        limit = self.node.config.server.realtime_idle_timeout
        # A deadline that each frame moves on: the frames only write a time (no event to set
        # on the hot path), and this wakes at most once per limit to look at it.
        while (left := self.last_frame + limit - time.monotonic()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(left)
        logger.info("realtime session for %s idle for %gs: closed", session.public_id, limit)
        self.close_sent = True
        await self.send(
            {"type": "websocket.close", "code": GOING_AWAY, "reason": f"idle for {limit:g}s"}
        )

    async def _client_to_backend(
        self, backend: aiohttp.ClientWebSocketResponse, session: Session
    ) -> None:
        receive = self.receive
        rewrite = session.public_id != session.served_id
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.receive":
                self.last_frame = time.monotonic()
                text = message.get("text")
                if text is not None:
                    await backend.send_str(session.inward(text) if rewrite else text)
                else:
                    await backend.send_bytes(message.get("bytes") or b"")
            elif kind == "websocket.disconnect":
                self.client_gone = True
                code = sendable(message.get("code"))
                await backend.close(code=code)
                return

    async def _backend_to_client(
        self, backend: aiohttp.ClientWebSocketResponse, session: Session
    ) -> None:
        send = self.send
        rewrite = session.public_id != session.served_id
        code: int | None = None
        reason = ""
        while True:
            msg = await backend.receive()
            self.last_frame = time.monotonic()
            if msg.type == aiohttp.WSMsgType.TEXT:
                text = session.rewrite(msg.data) if rewrite else msg.data
                await send({"type": "websocket.send", "text": text})
            elif msg.type == aiohttp.WSMsgType.BINARY:
                await send({"type": "websocket.send", "bytes": msg.data})
            elif msg.type == aiohttp.WSMsgType.CLOSE:
                code, reason = msg.data, str(msg.extra or "")
                break
            else:  # closed under us, or a protocol error
                break
        if code is None:
            code = backend.close_code
        if code is None or code == NO_CLOSE_FRAME:
            # A close frame without a code is a normal close; none at all is a failure.
            code = 1000 if code == NO_CLOSE_FRAME else INTERNAL_ERROR
        self.close_sent = True
        await send(
            {
                "type": "websocket.close",
                "code": sendable(code, fallback=INTERNAL_ERROR),
                "reason": reason,
            }
        )


KEY_PREFIX_TEXT = KEY_SUBPROTOCOL_PREFIX.decode("ascii")
# Closed WebSockets between two full collections (see `Collector`).
COLLECT_EVERY = 256
COLLECT_SETTLE_SECS = 4.0


class Collector:
    """A full garbage collection after every `every` closed WebSockets, and `settle` seconds
    after the last open one closed.

    A closed session leaves reference cycles (its tasks, cancelled futures, and exceptions
    with their tracebacks refer back to it), and the node's tuned collector
    (routerproject/gctune.py) runs a full collection only after millions of allocations:
    closed sessions piled up round after round (1,000 idle sessions opened and closed: +24 MB
    RSS each round). The wait after the last close lets the sessions' relays finish first: a
    socket is lost before its relay has closed the backend's socket (up to `BACKEND_CLOSE_SECS`)
    and returned, and nothing cancels a relay for it (Daphne did, 2 s after the client left, and
    looked every second: this wait was set for that, and still covers the relay's own bound).
    """

    def __init__(
        self,
        every: int = COLLECT_EVERY,
        settle: float = COLLECT_SETTLE_SECS,
        clock: Clock | None = None,
    ) -> None:
        """`clock` times the settle; by default the loop running when a settle starts."""
        self.every = every
        self.settle = settle
        self._clock = clock
        self.open = 0
        self.count = 0
        self.collections = 0
        self._pending: Cancellable | None = None

    def opened(self) -> None:
        self.open += 1

    def closed(self) -> None:
        self.open = max(0, self.open - 1)
        self.count += 1
        if self.count >= self.every:
            self.collect()
        elif self.open == 0 and self._pending is None:
            self._pending = self.clock.call_later(self.settle, self.collect)

    def collect(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            # A timer that has fired (this very call) takes the cancel as a no-op.
            pending.cancel()
        self.count = 0
        self.collections += 1
        gc.collect()

    @property
    def clock(self) -> Clock:
        # Not kept: the module-wide collector outlives a loop (each test has its own), and a
        # timer on a closed loop would never fire.
        return self._clock if self._clock is not None else asyncio.get_running_loop()


CLOSED_SOCKETS = Collector()
# How long a close we sent waits for the client's: autobahn's (Daphne's) 1 s, not uvicorn's 10 s
# (the socket, and the front door's count of its address, would be held that long).
CLOSE_HANDSHAKE_SECS = 1.0
# The most a close frame's reason may take: a control frame carries 125 bytes, 2 for the code.
MAX_REASON_BYTES = 123
# Messages that become frames once the socket is open (before, a close is the HTTP 403).
_FRAME_MESSAGES = frozenset({"websocket.send", "websocket.close"})


def close_message(message: Mapping[str, Any]) -> WebSocketCloseEvent:
    """An app's `websocket.close` as a close frame may carry it: a code no close frame may
    carry becomes 1011 (websockets would raise instead of closing), none at all 1000, and the
    reason is cut to `MAX_REASON_BYTES` of UTF-8 on a character's edge."""
    code = sendable(message.get("code") or 1000, fallback=INTERNAL_ERROR)
    reason = str(message.get("reason") or "")
    raw = reason.encode("utf-8")
    if len(raw) > MAX_REASON_BYTES:
        # Only a character cut in two at the end fails to decode: "ignore" drops just it.
        reason = raw[:MAX_REASON_BYTES].decode("utf-8", "ignore")
    return {"type": "websocket.close", "code": code, "reason": reason}


class RouterWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol as the node serves it (the front door hands it
    each upgrade, setting `release` and `client_cert` before `connection_made`).

    - Any close code a close frame may carry passes, with its reason (`close_message`).
    - What the app sends once the socket is closing or gone is dropped, as Daphne did: uvicorn
      raises (ClientDisconnected, or RuntimeError after our own close), and the relay learns
      the end from `receive()`; raised mid-relay, it would be logged as the relay's bug.
    - The front door's count of the connection's address is given back when the socket ends
      (the HTTP protocol that counted it never hears of it after the upgrade).
    - The scope tells whether the connection came with a verified client certificate, and
      its header names are lowercase.
    """

    release: Callable[[], None] | None = None
    client_cert: bool = False

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.close_timeout = CLOSE_HANDSHAKE_SECS

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        CLOSED_SOCKETS.opened()
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        release, self.release = self.release, None
        if release is not None:
            release()
        try:
            super().connection_lost(exc)
        finally:
            CLOSED_SOCKETS.closed()

    async def run_asgi(self) -> None:
        scope = cast(dict[str, Any], self.scope)
        # The scope is built from the request alone; whether the TLS handshake verified a
        # client certificate is the front door's word, set on this protocol before it ran.
        scope[CLIENT_CERT_SCOPE_KEY] = self.client_cert
        # uvicorn keeps the names as the request spelt them; ASGI (and the gate) wants them
        # lowercase. The front door's HTTP protocol passes them lowercased already.
        scope["headers"] = [(name.lower(), value) for name, value in scope["headers"]]
        await super().run_asgi()

    async def send(self, message: ASGISendEvent) -> None:
        kind = message["type"]
        if kind == "websocket.close":
            message = close_message(message)
        if kind in _FRAME_MESSAGES and (self.close_sent or self.disconnected):
            return
        try:
            await super().send(message)
        except ClientDisconnected:
            # Gone while this waited to write, or its close frame already in: dropped as above.
            return
