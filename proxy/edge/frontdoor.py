"""The node's front door: uvicorn's HTTP/1.1 protocol (httptools' parser on the event loop's
C transport) with the node's limits applied while a request's head arrives, before any of its
body is read.

The rules of `proxy.edge.gate` run when the headers are complete (`on_headers_complete`),
before the app is started: a refused request is answered at once, the bytes that follow are
read and dropped for a short linger (so the client sees the answer rather than a reset) and
the connection is closed. A chunked body is counted as it arrives and refused past
`server.max_body_bytes`. A request line past `MAX_URL_BYTES` is answered 414, a head with more
than `MAX_HEADERS` headers or `MAX_HEAD_BYTES` of them 431: the parser keeps an unfinished
head whole, so nothing else would bound it.

Slow clients: a connection must complete each request head within `server.header_timeout`, and
a body within `server.body_timeout` plus one second per `server.body_min_rate` bytes; an idle
kept-alive connection closes after `server.idle_timeout`. One client (an IPv4 address, or an
IPv6 /64, which one host usually holds whole) may hold at most
`server.max_connections_per_client` connections, WebSockets included (trusted proxies are
exempt). The node as a whole holds at most `server.max_connections` (by default derived from
the open-file limit, `derived_max_connections`); the last `reserve` places take only health
checks and node routes, so a flood of idle sockets cannot silence `/healthz` or the cluster.
Refusals are logged, at most one line per kind every `REFUSAL_LOG_INTERVAL_SECS`.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
from channels.routing import ProtocolTypeRouter
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.edge.caps import Clock, FrontDoor, is_reserved_path
from proxy.edge.cycle import RouterCycle
from proxy.edge.gate import Address, Refusal, parse_address
from proxy.edge.nodeapi import NODE_PREFIX
from proxy.edge.tls import CLIENT_CERT_SCOPE_KEY, client_cert_refusal, has_client_cert, is_tls
from routerproject import request_ids

logger = logging.getLogger("router.frontdoor")

# How long a refused connection's incoming bytes are read and dropped after the answer: long
# enough for the client to read the answer, short enough that it costs nothing to hold.
LINGER_SECS = 2.0
# ...and at most this many of them: past it the client is not reading the answer anyway.
LINGER_MAX_BYTES = 4 << 20
# A request line (its target) past this is a 414; headers past either limit a 431. The common
# servers' limits: no real client comes near them, and an unfinished head is held in memory.
MAX_URL_BYTES = 16384
MAX_HEAD_BYTES = 16384
MAX_HEADERS = 500


def _response(refusal: Refusal, path: str, request_id: bytes | None) -> bytes:
    body = refusal.body(path)
    reason = _REASONS.get(refusal.status, b"Error")
    lines = [
        b"HTTP/1.1 %d %s" % (refusal.status, reason),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
        b"x-request-id: " + (request_id or request_ids.new().encode()),
    ]
    lines += [name + b": " + value for name, value in refusal.headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


_REASONS = {status.value: status.phrase.encode("ascii") for status in HTTPStatus}


def _answer_and_close(clock: Clock, transport: asyncio.Transport, data: bytes) -> Any:
    """Write the answer, stop writing, and drop the connection after the linger."""
    transport.write(data)
    # Under TLS a half-close is not possible (asyncio's TLS transport cannot write EOF): its
    # close sends what is buffered first, then the close alert.
    if not is_tls(transport) and transport.can_write_eof():
        transport.write_eof()
    else:
        transport.close()
    return clock.call_later(LINGER_SECS, transport.abort)


def http_app(app: Any) -> Any:
    """The app an HTTP request goes to: `app` itself, or, when `app` is Channels' protocol
    router, the app it routes HTTP to (it routes by the scope's type and nothing else)."""
    if isinstance(app, ProtocolTypeRouter):
        return app.application_mapping.get("http", app)
    return app


class _Stop(Exception):
    """Raised from a parser callback once the request is refused: the parser stops there and
    the rest of the bytes in hand are dropped."""


class FrontDoorProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, timing the head and body of each request, counting its
    peer, and judging each request on its head before any of its body is read.

    One pending call at most, due at or before the current phase's deadline: a phase that
    ends leaves it pending, and the next phase reuses it when it is not due later than that
    phase's deadline, so a kept-alive connection arms a call about once per header timeout,
    not per request. Due, it checks the phase then running (`_expired`). The idle timeout is
    one of those deadlines: no byte for `idle_timeout` while a head or body is awaited, or
    after an answer, closes the connection (uvicorn's own keep-alive timer, armed anew after
    every answer, is never armed here).
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        door: FrontDoor,
    ) -> None:
        super().__init__(config, server_state, app_state)
        # An HTTP request goes straight to the app Channels' protocol router would hand it to:
        # the router adds a coroutine and a lookup to every request, and chooses nothing here.
        self.app = http_app(self.app)
        self.door = door
        self.peer: Address | None = None
        self.counted: str | None = None
        # Counted in the door's total; in its reserve, only health checks and node routes pass.
        self.entered = False
        self.reserve_only = False
        self.closing = False
        self.drained = 0
        self.body_bytes = 0
        self.head_bytes = 0
        self.header_count = 0
        self.header_bytes = 0
        self.client_cert = False
        self.path_text = "/"
        # Between a message's first byte and its headers' end, and from its end on.
        self.in_head = False
        self.message_complete = True
        # A refusal waiting for the answer still owed to an earlier request on the connection.
        self._owed_refusal: bytes | None = None
        self._timer: Any = None
        self._timer_due = 0.0
        self._linger: Any = None
        self._phase = "head"
        self._phase_start = 0.0
        self._last_active = 0.0

    # -- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        door = self.door
        client = self.client
        self.peer = peer = parse_address(client[0] if client else None)
        counted = door.acquire(peer)
        if counted is False:
            door.refused(
                429,
                "too_many_connections",
                "connection-cap",
                f"429 to {peer}: over {door.cap} connections from one client",
            )
            self._refuse_connection(
                429,
                f"too many connections from this client (server.max_connections_per_client "
                f"is {door.cap})",
                "rate_limit_error",
            )
            return
        self.counted = counted if isinstance(counted, str) else None
        place = door.enter()
        if place == "full":
            door.release(self.counted)
            self.counted = None
            door.refused(
                503,
                "too_many_connections",
                "connection-total",
                f"503 to {peer}: the node holds {door.max_connections} connections "
                "(server.max_connections)",
            )
            self._refuse_connection(
                503,
                f"the node holds {door.max_connections} connections, its cap "
                "(server.max_connections)",
                "server_error",
            )
            return
        self.entered = True
        self.reserve_only = place == "reserve"
        # asyncio hands a TLS connection over once its handshake is done: the certificate,
        # if any, is known from here to the connection's end.
        self.client_cert = has_client_cert(transport)
        self._start("head", door.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        linger, self._linger = self._linger, None
        if linger is not None:
            linger.cancel()
        self._give_back()
        super().connection_lost(exc)

    def _give_back(self) -> None:
        door = self.door
        door.release(self.counted)
        self.counted = None
        if self.entered:
            self.entered = False
            door.leave()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            self.drained += len(data)
            if self.drained > LINGER_MAX_BYTES:
                self.transport.abort()
            return
        phase = self._phase
        if phase == "idle":
            self._start("head", self.door.header_timeout)
        else:
            # (A head that starts resets it in `_start`.)
            self._last_active = self.door.clock.time()
        if phase == "head" or phase == "idle" or self.in_head:
            # Every byte is the head's while one is awaited; a head that begins behind a
            # request still being answered is counted from its second read on.
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if not self.closing:
                self._upgrade()
        except httptools.HttpParserError as exc:
            if self.closing:
                return  # refused from a callback, which stopped the parser (`_Stop`)
            if isinstance(exc, httptools.HttpParserCallbackError):
                # A rule of ours failed, not the client: it is logged, and the client still
                # gets an answer.
                logger.error("front door failed on a request", exc_info=exc.__context__)
                cycle = self.cycle
                if cycle is not None and not cycle.response_complete:
                    # Which request's answer a refusal would be is not known: the connection
                    # ends, and the app hears that its client went away.
                    cycle.disconnected = True
                    cycle.message_event.set()
                    self.closing = True
                    self._cancel()
                    self.transport.close()
                    return
                refusal = Refusal(500, "internal router error", type="server_error")
                self._refuse(refusal, "/", None, owed=False)
                return
            self._refuse(Refusal(400, "invalid HTTP request"), "/", None)
        else:
            # httptools keeps a head it has not finished whole: the bytes of an unfinished one
            # are capped here, where a head arriving a byte at a time is caught too.
            if self.in_head and self.head_bytes > MAX_HEAD_BYTES + MAX_URL_BYTES:
                self._head_too_large(bool(self.headers))

    def _upgrade(self) -> None:
        if self._should_upgrade():
            self.handle_websocket_upgrade()
            return
        # Another protocol (curl --http2 asks for h2c): the request is answered in HTTP/1.1,
        # as RFC 9110 lets a server ignore the Upgrade. The parser reads nothing after such a
        # request, so the connection ends with its answer.
        cycle = self.cycle
        if cycle is not None:
            cycle.keep_alive = False

    def handle_websocket_upgrade(self) -> None:
        """Hand the connection to the WebSocket protocol, with its counts: the socket gives
        them back when it ends, since this protocol never hears of the connection again."""
        self._cancel()
        self._phase = "upgraded"
        self.connections.discard(self)
        protocol: Any = self.ws_protocol_class(  # type: ignore[call-arg, misc]
            config=self.config, server_state=self.server_state, app_state=self.app_state
        )
        door = self.door
        key, self.counted = self.counted, None
        entered, self.entered = self.entered, False

        def release() -> None:
            door.release(key)
            if entered:
                door.leave()

        protocol.release = release
        protocol.client_cert = self.client_cert
        head = [self.scope["method"].encode(), b" ", self.url, b" HTTP/1.1\r\n"]
        for name, value in self.headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        protocol.connection_made(self.transport)
        self.transport.set_protocol(protocol)
        protocol.data_received(b"".join(head))

    # -- the head ---------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.header_count = 0
        self.header_bytes = 0
        self.path_text = "/"
        if not self.in_head and self._phase not in ("head", "idle"):
            # A head behind a request still being answered: its bytes count from here.
            self.head_bytes = 0
        self.in_head = True
        self.message_complete = False

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            self._head_too_large(False)
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        self.header_bytes += len(name) + len(value) + 4
        if self.header_count > MAX_HEADERS or self.header_bytes > MAX_HEAD_BYTES:
            self._head_too_large(True)
            raise _Stop
        # uvicorn's own `on_header`, here rather than called (a call per header, seven a
        # request): the name in lower case, the value without the trailing blanks llhttp keeps
        # (RFC 9110 5.5), and `Expect: 100-continue` noted.
        name = name.lower()
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        # llhttp takes only the registered methods, in capitals.
        method = self.scope["method"] = self.parser.get_method().decode("ascii")
        refusal = self._judge(method)
        if refusal is not None:
            self._refuse(refusal, self.path_text, self._request_id())
            raise _Stop
        if self.parser.should_upgrade() and self._should_upgrade():
            return
        self._begin_cycle()
        if self._has_body():
            self.body_bytes = 0
            self._start("body", self.door.body_allowance(0))
        else:
            # Untimed while the app answers: a pending call finds this phase and stops.
            self._phase = "handling"

    def _judge(self, method: str) -> Refusal | None:
        door = self.door
        headers = self.headers

        def header(name: bytes) -> bytes | None:
            for key, value in headers:
                if key == name:
                    return value
            return None

        try:
            self.path_text, refusal = door.gate.head_refusal(method, self.url, header, self.peer)
        except Exception:
            # A rule that cannot decide lets nothing through, and the request still gets an
            # answer rather than a dropped connection.
            logger.exception("front-door check failed on %r", self.url[:200])
            refusal = Refusal(500, "internal router error", type="server_error")
        if (
            door.client_cert_required
            and (refusal is None or refusal.status == 401)
            and self.path_text.startswith(NODE_PREFIX)
            and not self.client_cert
        ):
            # Before the token's verdict, so a caller without the certificate cannot test tokens.
            refusal = client_cert_refusal()
        if refusal is None and self.reserve_only and not is_reserved_path(self.path_text):
            refusal = Refusal(
                503,
                f"the node holds {door.max_connections} connections, its cap "
                "(server.max_connections); the last places are kept for health checks "
                "and node routes",
                type="server_error",
                code="too_many_connections",
                headers=((b"retry-after", b"1"),),
            )
        if refusal is not None:
            self._note_refusal(refusal)
        return refusal

    def _note_refusal(self, refusal: Refusal) -> None:
        self.door.refused(
            refusal.status,
            refusal.code or refusal.type,
            f"status-{refusal.status}",
            f"{refusal.status} to {self.peer} on {self.path_text}: {refusal.message}",
        )

    def _has_body(self) -> bool:
        for name, value in self.headers:
            if name == b"content-length":
                return value.strip() not in (b"0", b"")
            if name == b"transfer-encoding":
                return True
        return False

    def _begin_cycle(self) -> None:
        """The request's scope and cycle, and its app started (or queued behind the one
        being answered on this connection)."""
        parser = self.parser
        scope = self.scope
        version = parser.get_http_version()
        if version != "1.1":
            scope["http_version"] = version
        target = httptools.parse_url(self.url)
        raw_path = target.path
        path = raw_path.decode("ascii")
        scope["path"] = unquote(path) if "%" in path else path
        scope["raw_path"] = raw_path
        scope["query_string"] = target.query or b""
        scope[CLIENT_CERT_SCOPE_KEY] = self.client_cert  # type: ignore[literal-required]
        # (The cycle advertises `http.response.pathsend` in the scope itself.)
        previous = self.cycle
        self.cycle = cycle = RouterCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=False,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        if previous is None or previous.response_complete:
            self._start_asgi_task(cycle, self.app)
        else:
            # Pipelined: the next answer waits for this one, and so does reading.
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))

    # -- the body ---------------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        if self.closing:
            raise _Stop
        self.body_bytes += len(body)
        if self.body_bytes > self.door.gate.limit:
            # A chunked body: no length was declared to judge it on at the head.
            refusal = self.door.gate.too_large()
            self._note_refusal(refusal)
            self._cut_app(refusal, self.path_text, self._request_id())
            raise _Stop
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.closing:
            raise _Stop
        self.message_complete = True
        cycle = self.cycle
        if self._phase == "body":
            if cycle is not None and cycle.response_complete and not self.pipeline:
                # Answered before its body ended (an early error): idle from here.
                self._start("idle", self.door.idle_timeout)
            else:
                self._phase = "handling"
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.pipeline:
            self.flow.resume_reading()
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        owed, self._owed_refusal = self._owed_refusal, None
        if owed is not None:
            self._linger = _answer_and_close(self.door.clock, self.transport, owed)
            return
        self.flow.resume_reading()
        if not self.closing and self.message_complete:
            # (A body still arriving keeps its own deadline.)
            self._start("idle", self.door.idle_timeout)

    # -- refusals ---------------------------------------------------------------------------

    def _request_id(self) -> bytes:
        value = None
        for name, given in self.headers or ():
            if name == b"x-request-id":
                value = given
                break
        # The app's rule: an ID that is no plain token is replaced, never echoed.
        return request_ids.from_header(value).encode()

    def _refuse(
        self, refusal: Refusal, path: str, request_id: bytes | None, *, owed: bool | None = None
    ) -> None:
        """Answer `refusal` and close; after the answer still owed to an earlier request on
        the connection, if there is one (`owed`: by default, whether the current cycle is
        unanswered, as it is when the refused request is a pipelined one's successor)."""
        if self.closing:
            return
        self.closing = True
        self._cancel()
        self._phase = "closing"
        answer = _response(refusal, path, request_id)
        if owed is None:
            cycle = self.cycle
            owed = cycle is not None and not cycle.response_complete
        if owed:
            self._owed_refusal = answer
            self.flow.pause_reading()
            return
        self._linger = _answer_and_close(self.door.clock, self.transport, answer)

    def _cut_app(self, refusal: Refusal, path: str, request_id: bytes | None) -> None:
        """Refuse a request whose app runs already (it starts at the head, and the body failed
        after): the app hears that its client went away, and the client gets the refusal
        unless an answer has begun, which a second one would only corrupt."""
        cycle = self.cycle
        owed = False
        if self._phase == "body" and cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            # No "100 Continue" for a body refused already.
            cycle.waiting_for_100_continue = False
            cycle.message_event.set()
            for queued in self.pipeline:
                if queued[0] is cycle:
                    # Its app never started, and the answer before it is still owed.
                    self.pipeline.remove(queued)
                    owed = True
                    break
            if cycle.response_started:
                self.closing = True
                self._cancel()
                self._phase = "closing"
                self.transport.close()
                return
        self._refuse(refusal, path, request_id, owed=owed)

    def _refuse_connection(self, status: int, message: str, kind: str) -> None:
        refusal = Refusal(
            status,
            message,
            type=kind,
            code="too_many_connections",
            headers=((b"retry-after", b"1"),),
        )
        self._refuse(refusal, "/", None)

    def _head_too_large(self, headers_begun: bool) -> None:
        if self.closing:
            return
        if not headers_begun and len(self.url) > MAX_URL_BYTES:
            status, code = 414, "uri_too_long"
            message = f"request line longer than {MAX_URL_BYTES} bytes"
        else:
            status, code = 431, "headers_too_large"
            message = (
                f"request headers larger than {MAX_HEAD_BYTES} bytes "
                f"or more than {MAX_HEADERS} of them"
            )
        self.door.refused(status, code, f"status-{status}", f"{status} to {self.peer}: {message}")
        self._refuse(Refusal(status, message, code=code), "/", None)

    # -- deadlines --------------------------------------------------------------------------

    def _start(self, phase: str, after: float) -> None:
        clock = self.door.clock
        now = clock.time()
        self._phase = phase
        self._phase_start = self._last_active = now
        if phase == "head":
            self.head_bytes = 0
        deadline = now + min(after, self.door.idle_timeout)
        if self._timer is not None and self._timer_due <= deadline:
            return
        self._cancel()
        self._arm(clock, deadline - now, deadline)

    def _arm(self, clock: Clock, after: float, due: float) -> None:
        self._timer = clock.call_later(after, self._expired)
        self._timer_due = due

    def _cancel(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _deadline(self) -> tuple[float, bool] | None:
        """When the running phase's time is up, and whether that is the idle timeout; None
        for a phase without one."""
        door = self.door
        idle = self._last_active + door.idle_timeout
        if self._phase == "head":
            phase = self._phase_start + door.header_timeout
        elif self._phase == "body":
            phase = self._phase_start + door.body_allowance(self.body_bytes)
        elif self._phase == "idle":
            return idle, True
        else:
            return None
        return (idle, True) if idle < phase else (phase, False)

    def _expired(self) -> None:
        self._timer = None
        due = self._deadline()
        if due is None:
            return
        deadline, idle = due
        clock = self.door.clock
        left = deadline - clock.time()
        if left > 0:
            # Armed for an earlier phase, bytes arrived since, or the body kept the minimum
            # rate: not yet.
            self._arm(clock, left, deadline)
            return
        if idle:
            self._phase = "closing"
            self.transport.close()
            return
        door = self.door
        if self._phase == "body":
            allowance = door.body_allowance(self.body_bytes)
            what, limit = "body", door.body_timeout
            message = f"request body not received within {allowance:.0f}s"
        else:
            what, limit = "head", door.header_timeout
            message = f"request head not received within {limit:g}s"
        door.refused(
            408,
            "request_timeout",
            f"slow-{what}",
            f"closed a slow connection from {self.peer} ({what} past {limit:g}s)",
        )
        self._cut_app(Refusal(408, message, code="request_timeout"), "/", None)
