"""The node's HTTP server: the front door's protocol on `server.bind`, under TLS when set up.

uvicorn's protocols (httptools for HTTP/1.1, its sans-I/O WebSocket protocol for upgrades) on
the event loop's own C transport. The listening socket is the node's, not uvicorn's `Server`:
startup and the graceful stop belong to `runrouter`, which drains the node's own requests
before the connections go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from email.utils import formatdate
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from proxy.edge.caps import FrontDoor
from proxy.edge.frontdoor import FrontDoorProtocol

logger = logging.getLogger("router")

# Connections the kernel queues before they are accepted: a burst of clients (or of slaves
# registering after a master restart) waits there rather than being refused.
LISTEN_BACKLOG = 4096
# The realtime WebSocket's keep-alive: a ping after this long without a frame, and the socket
# is dropped when no pong follows within the timeout.
WS_PING_INTERVAL_SECS = 20.0
WS_PING_TIMEOUT_SECS = 30.0
# A message past this closes the socket with 1009 (Daphne's limit, which clients were written to).
WS_MAX_FRAME_BYTES = 1024 * 1024


def server_config(app: Any) -> Config:
    """uvicorn's settings for the node's protocols, loaded."""
    from proxy.edge.realtime import RouterWebSocketProtocol

    config = Config(
        app,
        interface="asgi3",
        lifespan="off",
        # The gate reads X-Forwarded-For itself, from trusted proxies only.
        proxy_headers=False,
        server_header=False,
        date_header=False,
        access_log=False,
        log_config=None,
        ws=RouterWebSocketProtocol,
        ws_max_size=WS_MAX_FRAME_BYTES,
        ws_ping_interval=WS_PING_INTERVAL_SECS,
        ws_ping_timeout=WS_PING_TIMEOUT_SECS,
        ws_per_message_deflate=False,
    )
    config.load()
    return config


class HttpServer:
    """The listening socket, the connections it accepted, and their shared state."""

    def __init__(self, app: Any, door: FrontDoor, tls: Any = None) -> None:
        self.config = server_config(app)
        self.door = door
        self.tls = tls
        self.state = ServerState()
        self.app_state: dict[str, Any] = {}
        self.listening: asyncio.Server | None = None
        self._dating: asyncio.Task[None] | None = None

    def _protocol(self) -> FrontDoorProtocol:
        return FrontDoorProtocol(self.config, self.state, self.app_state, self.door)

    async def listen(self, host: str, port: int) -> None:
        """Bind and accept; raises OSError when the address cannot be had."""
        self._date()
        self._dating = asyncio.ensure_future(self._keep_date())
        loop = asyncio.get_running_loop()
        self.listening = await loop.create_server(
            self._protocol,
            host=host or None,
            port=port,
            ssl=self.tls.context if self.tls is not None else None,
            backlog=LISTEN_BACKLOG,
            reuse_address=True,
            ssl_handshake_timeout=self.door.header_timeout if self.tls is not None else None,
        )
        for sock in self.listening.sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                # Answers are small and written whole: no reason to hold them for more.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def stop_listening(self) -> None:
        if self.listening is not None:
            self.listening.close()

    async def close(self) -> None:
        """Close every connection: idle ones at once, ones mid-answer when it is written."""
        for connection in list(self.state.connections):
            connection.shutdown()
        if self._dating is not None:
            self._dating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dating
        if self.listening is not None:
            # Python 3.11's wait_closed returns at once; the connections closed above.
            await self.listening.wait_closed()

    def _date(self) -> None:
        self.state.default_headers = [(b"date", formatdate(usegmt=True).encode("ascii"))]

    async def _keep_date(self) -> None:
        # Every answer carries a Date (RFC 9110 asks it of a server with a clock); formatting
        # it once a second instead of per answer.
        while True:
            await asyncio.sleep(1.0)
            self._date()
