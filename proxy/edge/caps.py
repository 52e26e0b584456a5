"""The node's connection limits and the connections it holds, shared by every front-door
connection (proxy/edge/frontdoor.py): the per-client cap, the node's cap with its reserve for
health checks and node routes, the deadlines' settings, and the refusal log.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
import time
from collections.abc import Callable
from typing import Any, Protocol

from proxy.edge.gate import Address, Gate
from proxy.edge.nodeapi import NODE_PREFIX
from proxy.observe import metrics

logger = logging.getLogger("router.frontdoor")

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


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What the deadlines (and the realtime collector) need of the event loop: its monotonic
    time and a timer; a test's fake clock stands in."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], object], /) -> Cancellable: ...


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
        clock: Clock | None = None,
        fd_limit: int | None = None,
    ) -> None:
        """`clock` times the deadlines; the running event loop by default.
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
    def clock(self) -> Clock:
        clock = self._clock
        if clock is None:
            # Built before the loop runs; first asked from a connection, on the loop.
            clock = self._clock = asyncio.get_running_loop()
        return clock

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
