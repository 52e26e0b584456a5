"""The front door's protocol in process, for the proxy's unit tests: a fake asyncio transport
that keeps what is written, a fake clock the test advances (so each deadline is checked with
exact numbers rather than by waiting), and a small ASGI app that records what it was started
with; the protocol starts it as a task on the running loop, which a test lets run by yielding
(`turn`). The `doors` and `door` fixtures (conftest.py) build them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from uvicorn.server import ServerState

from proxy.edge.caps import FrontDoor
from proxy.edge.frontdoor import FrontDoorProtocol
from proxy.edge.server import server_config
from routerproject.config import load_config

LIMIT = 1000
KEYED = b"Authorization: Bearer front-door-key-1\r\n"
# What a verified client certificate looks like to `getpeercert()`: any non-empty dict.
PEERCERT = {"subject": ((("commonName", "peer-node"),),)}


class Handle:
    """A call the fake clock holds until its time comes."""

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """The event loop's `time` and `call_later`, moved only by `advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self.armed: list[Handle] = []
        self._due: list[tuple[float, int, Handle]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], object]) -> Handle:
        handle = Handle(self.now + delay, callback)
        self.armed.append(handle)
        heapq.heappush(self._due, (handle.when, next(self._order), handle))
        return handle

    def advance(self, seconds: float) -> None:
        """Move time on, running each call at its own time (calls armed meanwhile included)."""
        end = self.now + seconds
        while self._due and self._due[0][0] <= end:
            when, _, handle = heapq.heappop(self._due)
            if handle.cancelled:
                continue
            self.now = when
            handle.cancelled = True  # run: no longer pending
            handle.callback()
        self.now = end

    def pending(self) -> list[Handle]:
        return [handle for _, _, handle in self._due if not handle.cancelled]


class FakeSocket:
    """What a real transport's "socket" extra gives uvicorn: the addresses. uvicorn reads the
    peer from it first; its "peername" fallback takes only 2-tuples, so an IPv6 4-tuple needs
    the socket, as every real transport has one."""

    def __init__(self, peer: tuple[Any, ...], local: tuple[Any, ...]) -> None:
        self.peer = peer
        self.local = local

    def getpeername(self) -> tuple[Any, ...]:
        return self.peer

    def getsockname(self) -> tuple[Any, ...]:
        return self.local


class FakeTransport:
    """An asyncio transport that keeps what is written and records how it was closed."""

    def __init__(
        self,
        peer: tuple[Any, ...],
        *,
        tls: bool = False,
        peercert: dict[str, Any] | None = None,
        half_close: bool | None = None,
    ) -> None:
        """`half_close`: what `can_write_eof` says; by default what asyncio's transports
        say (a TLS one cannot)."""
        local = ("127.0.0.1", 18080)
        self.half_close = not tls if half_close is None else half_close
        self.data = bytearray()
        self.eof = False
        self.closed = False
        self.aborted = False
        self.reading = True
        self.protocol: Any = None
        self.looked_up: list[str] = []
        self.extra: dict[str, Any] = {
            "peername": peer,
            "sockname": local,
            "socket": FakeSocket(peer, local),
        }
        if tls:
            self.extra["sslcontext"] = object()
            self.extra["ssl_object"] = object()
            self.extra["peercert"] = peercert

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        self.looked_up.append(name)
        return self.extra.get(name, default)

    def write(self, data: bytes) -> None:
        if self.eof:
            # asyncio's own rule: nothing may follow a half-close.
            raise RuntimeError("Cannot call write() after write_eof()")
        self.data += data

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return self.half_close

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol

    @property
    def stopped(self) -> bool:
        """The node stopped writing: a half-close after a refusal, or a close."""
        return self.eof or self.closed

    def take(self) -> bytes:
        """What was written since the last call."""
        data = bytes(self.data)
        self.data.clear()
        return data


class App:
    """The node's app as the front door sees it: it records each request it is started for,
    reads the body, and answers 200 with the request's path (after `held` is set, if any).
    With `streams`, it begins its answer (chunked) before it reads the body, as a stream
    would."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self.disconnected = 0
        self.held: asyncio.Event | None = None
        self.streams = False

    @property
    def started(self) -> int:
        return len(self.scopes)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.close", "code": 1000})
            return
        if self.streams:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected += 1
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        if self.held is not None:
            await self.held.wait()
        answer = scope["path"].encode()
        if not self.streams:
            headers = [(b"content-length", b"%d" % len(answer))]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


async def turn() -> None:
    """Yield to the loop a few times, so the app tasks the protocol started run as far as they
    can (an answer, and the pipelined request it lets start) before the test looks."""
    for _ in range(3):
        await asyncio.sleep(0)


class Door:
    """A front door on a config of its own, with its clock, app and server state."""

    def __init__(
        self, tmp_path: Path, *, cluster: dict[str, Any] | None = None, **server: Any
    ) -> None:
        """`server` and `cluster`: the config's sections (a standalone node by default)."""
        (tmp_path / "kcpps").mkdir(exist_ok=True)
        settings = {
            "max_body_bytes": LIMIT,
            "header_timeout": "10s",
            "body_timeout": "30s",
            "body_min_rate": 100,
            "max_connections_per_client": 2,
            **server,
        }
        path = tmp_path / "config.yaml"
        path.write_text(
            textwrap.dedent(
                f"""
                server: {orjson.dumps(settings).decode()}
                auth: {{inference_keys: [front-door-key-1]}}
                """
            )
            + (f"cluster: {orjson.dumps(cluster).decode()}\n" if cluster else "")
        )
        self.clock = FakeClock()
        self.app = App()
        self.config = server_config(self.app)
        self.state = ServerState()
        self.door = FrontDoor(load_config(path, environ={}), clock=self.clock)

    def connect(
        self,
        host: str = "127.0.0.1",
        *,
        tls: bool = False,
        peercert: dict[str, Any] | None = None,
        half_close: bool | None = None,
    ) -> tuple[FrontDoorProtocol, FakeTransport]:
        peer: tuple[Any, ...] = (host, 40000, 0, 0) if ":" in host else (host, 40000)
        protocol = FrontDoorProtocol(self.config, self.state, {}, self.door)
        transport = FakeTransport(peer, tls=tls, peercert=peercert, half_close=half_close)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        return protocol, transport

    async def close(self) -> None:
        """Stop the app tasks still waiting (a body that never came, a held answer)."""
        tasks = list(self.state.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def status_of(data: bytes | bytearray) -> int:
    return int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else 0


def body_of(data: bytes | bytearray) -> Any:
    return orjson.loads(bytes(data).partition(b"\r\n\r\n")[2])


def post_head(length: int, *extra: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + KEYED
        + b"".join(extra)
        + b"Content-Length: %d\r\n\r\n" % length
    )


PING = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
OK_PING = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n/ping"
