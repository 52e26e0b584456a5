"""The node's front door: Daphne's HTTP factory, channel and request, with the node's limits
applied while a request's head arrives, before Twisted reads its body.

Daphne hands a request to the ASGI app only once Twisted has read the whole body (to a temporary
file when large), so a check in the app comes after the bytes are in. Here the rules of
`proxy.edge.gate` run when the headers are complete (`Request.gotLength`, called from
`HTTPChannel.allHeadersReceived`): a refused request is answered at once, its body is read and
dropped for a short linger (so the client sees the answer rather than a reset) and the
connection is closed. A chunked body is counted as it arrives and refused past
`server.max_body_bytes`.

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

import io
import ipaddress
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet import protocol as twisted_protocol
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure
from twisted.web import http

from proxy.edge.gate import Address, Gate, Refusal, parse_address
from proxy.edge.nodeapi import NODE_PREFIX
from proxy.edge.tls import client_cert_refusal, has_client_cert, is_tls
from proxy.observe import metrics
from routerproject import request_ids

logger = logging.getLogger("router.frontdoor")

# How long a refused connection's incoming bytes are read and dropped after the answer: long
# enough for the client to read the answer, short enough that it costs nothing to hold.
LINGER_SECS = 2.0
# ...and at most this many of them: past it the client is not reading the answer anyway.
LINGER_MAX_BYTES = 4 << 20
REFUSAL_LOG_INTERVAL_SECS = 10.0
# Past this many fds nothing is gained, and the kernel may refuse an unlimited soft limit.
FD_LIMIT_CEILING = 1 << 20
# Descriptors the node needs besides client connections: backends' pipes and sockets, the
# database, logs, the cluster's own calls.
FD_HEADROOM = 256
# The fewest connections a derived cap allows, however low the open-file limit.
MIN_MAX_CONNECTIONS = 64
# Places past the ordinary cap kept for health checks and node routes.
RESERVE_MAX = 64
# Paths a connection in the reserve may ask for (besides NODE_PREFIX).
RESERVED_PATHS = frozenset({"/healthz", "/readyz"})


def derived_max_connections(fd_limit: int) -> int:
    """The connection cap for an open-file limit: each client connection may hold a second
    descriptor to a backend or another node (a relayed WebSocket, a forwarded stream)."""
    return max(MIN_MAX_CONNECTIONS, (fd_limit - FD_HEADROOM) // 2)


def reserve_for(max_connections: int) -> int:
    return min(RESERVE_MAX, max(1, max_connections // 16)) if max_connections else 0


def client_key(peer: Address) -> str:
    """What the per-client cap counts: an IPv4 address, or the /64 of an IPv6 one (a host
    gets a whole /64 and may use any address in it)."""
    if isinstance(peer, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((int(peer) >> 64 << 64, 64)))
    return str(peer)


def is_reserved_path(path: str) -> bool:
    return path in RESERVED_PATHS or path.startswith(NODE_PREFIX)


class RefusalLog:
    """One log line per kind of refusal per interval, counting the ones it held back."""

    def __init__(
        self,
        log: logging.Logger,
        interval: float = REFUSAL_LOG_INTERVAL_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.interval = interval
        self.clock = clock
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def note(self, kind: str, message: str) -> bool:
        """Log `message` unless `kind` was logged within the interval; True if it was logged."""
        now = self.clock()
        last = self.last.get(kind)
        if last is not None and now - last < self.interval:
            self.held[kind] = self.held.get(kind, 0) + 1
            return False
        self.last[kind] = now
        held = self.held.pop(kind, 0)
        suffix = f" ({held} more like it since the last line)" if held else ""
        self.log.warning("refused: %s%s", message, suffix)
        return True


class FrontDoor:
    """The limits of one node and the connections it holds, shared by its channels."""

    def __init__(
        self,
        config: Any,
        *,
        log: RefusalLog | None = None,
        clock: Any = None,
        fd_limit: int | None = None,
    ) -> None:
        """`clock` (Twisted's `IReactorTime`) times the deadlines; the reactor by default.
        `fd_limit` derives the connection cap when `server.max_connections` is unset; the
        current soft limit by default."""
        server = config.server
        self._clock = clock
        self.gate = Gate(config)
        self.header_timeout: float = server.header_timeout
        self.body_timeout: float = server.body_timeout
        self.body_min_rate: int = server.body_min_rate
        self.idle_timeout: float = server.idle_timeout
        self.cap: int = server.max_connections_per_client
        # Node routes take only connections whose client certificate the handshake verified.
        self.client_cert_required: bool = server.tls_client_ca_file is not None
        self.open: dict[str, int] = {}
        if server.max_connections is not None:
            self.max_connections: int = server.max_connections
        else:
            limit = fd_limit if fd_limit is not None else _soft_fd_limit()
            self.max_connections = derived_max_connections(limit)
        self.reserve = reserve_for(self.max_connections)
        self.total = 0
        self.log = log or RefusalLog(logger)

    def enter(self) -> str:
        """Count a connection in the node's total: "open", "reserve" (health checks and node
        routes only) or "full" (refused, not counted)."""
        if not self.max_connections:
            self.total += 1
            return "open"
        if self.total >= self.max_connections:
            return "full"
        self.total += 1
        return "open" if self.total <= self.max_connections - self.reserve else "reserve"

    def leave(self) -> None:
        self.total = max(0, self.total - 1)

    def acquire(self, peer: Address | None) -> str | bool | None:
        """Count a new connection: the key to release, None if uncounted, False if refused."""
        if peer is None or not self.cap or self.gate.is_trusted_proxy(peer):
            return None
        key = client_key(peer)
        held = self.open.get(key, 0)
        if held >= self.cap:
            return False
        self.open[key] = held + 1
        return key

    @property
    def clock(self) -> Any:
        if self._clock is None:
            from twisted.internet import reactor

            self._clock = reactor
        return self._clock

    def release(self, key: str | None) -> None:
        if key is None:
            return
        held = self.open.get(key, 0) - 1
        if held > 0:
            self.open[key] = held
        else:
            self.open.pop(key, None)

    def refused(self, status: int, reason: str, kind: str, message: str) -> None:
        """Count a refusal and log it (at most one line per `kind` per interval)."""
        metrics.frontdoor_refused(status, reason)
        self.log.note(kind, message)

    def body_allowance(self, received: int) -> float:
        """Seconds a body may take once `received` bytes of it are in."""
        extra = received / self.body_min_rate if self.body_min_rate else 0.0
        return self.body_timeout + extra


def _response(refusal: Refusal, path: str, request_id: bytes | None) -> bytes:
    body = refusal.body(path)
    reason = http.RESPONSES.get(refusal.status, b"Error")
    lines = [
        b"HTTP/1.1 %d %s" % (refusal.status, reason),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
        b"x-request-id: " + (request_id or request_ids.new().encode()),
    ]
    lines += [name + b": " + value for name, value in refusal.headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _answer_and_close(clock: Any, transport: Any, data: bytes) -> Any:
    """Write the answer, stop writing, and drop the connection after the linger."""
    transport.write(data)
    # Under TLS the answer may still wait for the handshake: half-closing the socket beneath
    # would cut it off, while TLS's own close sends what is buffered first.
    if not is_tls(transport) and hasattr(transport, "loseWriteConnection"):
        transport.loseWriteConnection()
    else:
        transport.loseConnection()
    return clock.callLater(LINGER_SECS, transport.abortConnection)


_CONNECTION_DONE = Failure(ConnectionDone())


class FrontDoorChannel(http.HTTPChannel):
    """An HTTP/1.1 channel that times the head and body of each request and counts its peer."""

    door: FrontDoor
    peer: Address | None = None
    counted: str | None = None
    # Counted in the door's total; in its reserve, only health checks and node routes pass.
    entered = False
    reserve_only = False
    closing = False
    drained = 0
    body_bytes = 0
    # At most one pending call, due at or before the current phase's deadline. A phase that
    # ends leaves it pending, and the next phase reuses it when it is not due later than that
    # phase's deadline: a kept-alive connection arms a call about once per header timeout,
    # not two per request. Due, it checks the phase then running (`_expired`).
    # The idle timeout is one of those deadlines too (Twisted's own timer, which the factory
    # leaves unset, was cancelled and armed anew for every request): no byte for
    # `idle_timeout` while a head or body is awaited, or after an answer, closes the
    # connection as Twisted's `timeoutConnection` does.
    _timer: Any = None
    _timer_due = 0.0
    _linger: Any = None
    _phase = "head"
    _phase_start = 0.0
    _last_active = 0.0
    _secure: bool | None = None

    def isSecure(self) -> bool:
        # Asked for every request (Daphne's scheme); a connection is TLS or not from its first
        # byte to its last, so the interface lookup is made once per connection.
        secure = self._secure
        if secure is None:
            secure = self._secure = bool(super().isSecure())
        return secure

    def connectionMade(self) -> None:
        super().connectionMade()
        self._last_active = self.door.clock.seconds()
        self._start("head", self.door.header_timeout)

    def dataReceived(self, data: bytes) -> None:
        if self.closing:
            self.drained += len(data)
            if self.drained > LINGER_MAX_BYTES and self.transport is not None:
                self.transport.abortConnection()
            return
        if self._phase == "idle":
            self._start("head", self.door.header_timeout)
        else:
            # (A head that starts resets it in `_start`.)
            self._last_active = self.door.clock.seconds()
        super().dataReceived(data)

    def start_body(self) -> None:
        self.body_bytes = 0
        self._start("body", self.door.body_allowance(0))

    def allContentReceived(self) -> None:
        if not self.closing:
            # Untimed while the app answers: a pending call finds this phase and stops.
            self._phase = "handling"
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        if self.closing:
            return
        # Idle before the base class replays pipelined bytes, which start the next head.
        self._start("idle", self.door.idle_timeout)
        super().requestDone(request)

    def refuse(self, refusal: Refusal, path: str, request_id: bytes | None) -> None:
        if self.closing:
            return
        self.closing = True
        self._cancel()
        self._phase = "closing"
        self._linger = _answer_and_close(
            self.door.clock, self.transport, _response(refusal, path, request_id)
        )

    # Twisted drops a request line or header line past MAX_LENGTH without a word, and answers
    # a head past totalHeadersSize or maxHeaders with a bare 400: the client learns nothing of
    # why. These answer 414 (the request line) or 431 (the headers) in the usual envelope.

    def lineReceived(self, line: bytes) -> None:
        if self.closing:
            return
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._head_too_large()
            return
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        if not self.closing:
            self._head_too_large()

    def headerReceived(self, line: bytes) -> bool:
        if self._receivedHeaderCount >= self.maxHeaders:
            self._head_too_large()
            return False
        return bool(super().headerReceived(line))

    def _head_too_large(self) -> None:
        if getattr(self, "_HTTPChannel__first_line", 0):
            status, code = 414, "uri_too_long"
            message = f"request line longer than {self.MAX_LENGTH} bytes"
        else:
            status, code = 431, "headers_too_large"
            message = (
                f"request headers larger than {self.totalHeadersSize} bytes "
                f"or more than {self.maxHeaders} of them"
            )
            if self.requests:
                # The request whose head this is: the app must never see it.
                self.requests[-1].refused = True
        self.door.refused(status, code, f"status-{status}", f"{status} to {self.peer}: {message}")
        self.refuse(Refusal(status, message, code=code), "/", None)

    def connectionLost(self, reason: Failure = _CONNECTION_DONE) -> None:
        self._cancel()
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self.door.release(self.counted)
        self.counted = None
        if self.entered:
            self.entered = False
            self.door.leave()
        super().connectionLost(reason)

    def _start(self, phase: str, after: float) -> None:
        clock = self.door.clock
        now = clock.seconds()
        self._phase = phase
        self._phase_start = self._last_active = now
        deadline = now + min(after, self.door.idle_timeout)
        timer = self._timer
        if timer is not None and self._timer_due <= deadline:
            return
        self._cancel()
        self._arm(clock, deadline - now, deadline)

    def _arm(self, clock: Any, after: float, due: float) -> None:
        self._timer = clock.callLater(after, self._expired)
        self._timer_due = due

    def _cancel(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _deadline(self) -> tuple[float, bool] | None:
        """When the running phase's time is up, and whether that is the idle timeout; None
        for a phase without one."""
        idle = self._last_active + self.door.idle_timeout
        if self._phase == "head":
            phase = self._phase_start + self.door.header_timeout
        elif self._phase == "body":
            phase = self._phase_start + self.door.body_allowance(self.body_bytes)
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
        left = deadline - clock.seconds()
        if left > 0:
            # Armed for an earlier phase, bytes arrived since, or the body kept the minimum
            # rate: not yet.
            self._arm(clock, left, deadline)
            return
        if idle:
            self.timeoutConnection()
            return
        if self._phase == "body":
            allowance = self.door.body_allowance(self.body_bytes)
            what, limit = "body", self.door.body_timeout
            message = f"request body not received within {allowance:.0f}s"
        else:
            what, limit = "head", self.door.header_timeout
            message = f"request head not received within {limit:g}s"
        self.door.refused(
            408,
            "request_timeout",
            f"slow-{what}",
            f"closed a slow connection from {self.peer} ({what} past {limit:g}s)",
        )
        request = self.requests[-1] if self.requests else None
        if request is not None:
            request.refused = True
        self.refuse(Refusal(408, message, code="request_timeout"), "/", None)


class FrontDoorRequest(WebRequest):
    """Daphne's request, judged on its head before Twisted reads the body."""

    refused = False
    path_text = "/"

    def gotLength(self, length: int | None) -> None:
        channel: FrontDoorChannel = self.channel
        door = channel.door
        headers = self.requestHeaders

        def header(name: bytes) -> bytes | None:
            values = headers.getRawHeaders(name)
            return values[0] if values else None

        method = channel._command.decode("latin-1").upper()
        try:
            self.path_text, refusal = door.gate.head_refusal(
                method, channel._path, header, channel.peer
            )
        except Exception:
            # A rule that cannot decide lets nothing through, and the request still gets an
            # answer rather than a dropped connection.
            logger.exception("front-door check failed on %r", channel._path[:200])
            refusal = Refusal(500, "internal router error", type="server_error")
        if (
            door.client_cert_required
            and (refusal is None or refusal.status == 401)
            and self.path_text.startswith(NODE_PREFIX)
            and not has_client_cert(channel.transport)
        ):
            # Before the token's verdict, so a caller without the certificate cannot test tokens.
            refusal = client_cert_refusal()
        if refusal is None and channel.reserve_only and not is_reserved_path(self.path_text):
            refusal = Refusal(
                503,
                f"the node holds {door.max_connections} connections, its cap "
                "(server.max_connections); the last places are kept for health checks "
                "and node routes",
                type="server_error",
                code="too_many_connections",
                headers=((b"retry-after", b"1"),),
            )
        if refusal is None and length is not None and length > door.gate.limit:
            refusal = door.gate.too_large()
        if refusal is not None:
            self._refuse(refusal)
            return
        super().gotLength(length)
        if length != 0:
            channel.start_body()

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        channel: FrontDoorChannel = self.channel
        channel.body_bytes += len(data)
        if channel.body_bytes > channel.door.gate.limit:
            self._refuse(channel.door.gate.too_large())
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self.refused:
            # Answered already: the app never sees it.
            return
        super().requestReceived(command, path, version)

    def process(self) -> Any:
        channel: FrontDoorChannel = self.channel
        transport = self.transport
        result = super().process()
        if self.transport is None and transport is not None:
            _hand_over(channel, transport)
        return result

    def _refuse(self, refusal: Refusal) -> None:
        self.refused = True
        channel: FrontDoorChannel = self.channel
        old: Any = getattr(self, "content", None)
        self.content = io.BytesIO()
        if old is not None:
            old.close()
        # No "100 Continue" after the answer: the client must not send the body.
        self.requestHeaders.removeHeader(b"expect")
        values = self.requestHeaders.getRawHeaders(b"x-request-id")
        # The app's rule: an ID that is no plain token is replaced, never echoed.
        request_id = request_ids.from_header(values[0] if values else None).encode()
        channel.door.refused(
            refusal.status,
            refusal.code or refusal.type,
            f"status-{refusal.status}",
            f"{refusal.status} to {channel.peer} on {self.path_text}: {refusal.message}",
        )
        channel.refuse(refusal, self.path_text, request_id)


def _hand_over(channel: FrontDoorChannel, transport: Any) -> None:
    """Upgraded to a WebSocket: the connection now belongs to the WebSocket protocol, and
    the channel never hears that it closed. The socket gives the counts back instead."""
    door = channel.door
    key, channel.counted = channel.counted, None
    entered, channel.entered = channel.entered, False
    if key is None and not entered:
        return

    def release() -> None:
        door.release(key)
        if entered:
            door.leave()

    protocol = getattr(transport, "wrappedProtocol", None) or transport.protocol
    if hasattr(protocol, "release"):
        protocol.release = release
    else:
        release()


class _TooManyConnections(twisted_protocol.Protocol):
    """Answers a connection over a cap, without reading the request."""

    def __init__(self, door: FrontDoor, refusal: Refusal) -> None:
        self.door = door
        self.refusal = refusal
        self.timer: Any = None

    def connectionMade(self) -> None:
        refusal = self.refusal
        self.timer = _answer_and_close(
            self.door.clock, self.transport, _response(refusal, "/", None)
        )

    def connectionLost(self, reason: Any = None) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()


def _front_door_protocol(factory: http.HTTPFactory) -> Any:
    return http._GenericHTTPChannelProtocol(FrontDoorChannel())


class FrontDoorFactory(HTTPFactory):
    """Daphne's HTTP factory building front-door channels and requests."""

    protocol = _front_door_protocol

    def __init__(self, server: Any, door: FrontDoor) -> None:
        super().__init__(server)
        self.door = door
        # Twisted times what a channel schedules on the factory's reactor: the door's clock,
        # like every other deadline here. The idle timeout is the channel's own (see
        # FrontDoorChannel), not Twisted's.
        self.reactor = door.clock
        self.timeOut = None

    def buildProtocol(self, addr: Any) -> Any:
        door = self.door
        peer = parse_address(getattr(addr, "host", None))
        counted = door.acquire(peer)
        if counted is False:
            door.refused(
                429,
                "too_many_connections",
                "connection-cap",
                f"429 to {peer}: over {door.cap} connections from one client",
            )
            return self._refuser(
                429,
                f"too many connections from this client (server.max_connections_per_client "
                f"is {door.cap})",
                "rate_limit_error",
            )
        place = door.enter()
        if place == "full":
            door.release(counted if isinstance(counted, str) else None)
            door.refused(
                503,
                "too_many_connections",
                "connection-total",
                f"503 to {peer}: the node holds {door.max_connections} connections "
                "(server.max_connections)",
            )
            return self._refuser(
                503,
                f"the node holds {door.max_connections} connections, its cap "
                "(server.max_connections)",
                "server_error",
            )
        built = http.HTTPFactory.buildProtocol(self, addr)
        assert built is not None
        built.requestFactory = FrontDoorRequest
        channel = built._channel
        channel.door = self.door
        channel.peer = peer
        channel.counted = counted if isinstance(counted, str) else None
        channel.entered = True
        channel.reserve_only = place == "reserve"
        return built

    def _refuser(self, status: int, message: str, kind: str) -> Any:
        refusal = Refusal(
            status,
            message,
            type=kind,
            code="too_many_connections",
            headers=((b"retry-after", b"1"),),
        )
        refuser = _TooManyConnections(self.door, refusal)
        refuser.factory = self
        return refuser


def _soft_fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return FD_LIMIT_CEILING if soft == resource.RLIM_INFINITY else soft


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit; returns (before, after).

    Each connection, backend pipe and database handle is a file: at the common soft limit of
    1,024 a burst of clients makes accept() fail and requests vanish without an answer.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_LIMIT_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, target
    return soft, soft
