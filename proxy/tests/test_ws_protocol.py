"""The node's WebSocket protocol (uvicorn's sans-I/O one, subclassed) on real sockets: close
codes and reasons reach the client as the app gave them, a close before accept is an HTTP 403,
the front door's count is given back once, the scope tells of a client certificate, and what an
app sends once the socket is closing or gone is dropped.

Each test serves an ASGI app with `loop.create_server` as the node does, the `websockets`
library as the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trustme
import uvicorn
import uvloop
from aiohttp import web
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from proxy.edge.realtime import CLOSE_HANDSHAKE_SECS, MAX_REASON_BYTES, RouterWebSocketProtocol
from proxy.edge.tls import CLIENT_CERT_SCOPE_KEY
from proxy.tests.test_realtime_relay import pinned, relay_to, ws_backend

__all__ = ["pinned"]  # the relay's replica, for the relay's tests at the end

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
WAIT_SECS = 10.0
# How long uvicorn's protocol waits for the client's answer to its close.
UVICORN_CLOSE_SECS = 10.0
PING_SECS = 0.2
# More than the socket buffers hold: the backend is still sending when the client goes.
STREAM_FRAMES = 100_000
HANDSHAKE = (
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def load(app: App, ws: Any = RouterWebSocketProtocol, **settings: Any) -> uvicorn.Config:
    # No log_config: uvicorn's would be applied to the test process's logging.
    cfg = uvicorn.Config(
        app,
        ws=ws,
        lifespan="off",
        log_level="warning",
        log_config=None,
        proxy_headers=False,
        **settings,
    )
    cfg.load()
    return cfg


@dataclass
class Served:
    url: str
    port: int
    state: ServerState
    releases: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self.releases += 1
        self.released.set()

    async def until_released(self) -> None:
        """The socket is lost and its app has returned."""
        await asyncio.wait_for(self.released.wait(), WAIT_SECS)
        if self.state.tasks:
            await asyncio.wait_for(asyncio.wait(set(self.state.tasks)), WAIT_SECS)


@contextlib.asynccontextmanager
async def serve(
    app: App,
    *,
    client_cert: bool | None = None,
    tls: ssl.SSLContext | None = None,
    http: bool = False,
    **settings: Any,
) -> AsyncIterator[Served]:
    """`app` behind `RouterWebSocketProtocol` on a loopback port, made as the front door will
    make it (its attributes set before `connection_made`); with `http`, behind uvicorn's own
    HTTP protocol, which hands the upgrade to `config.ws_protocol_class`."""
    cfg = load(app, **settings)
    state = ServerState()
    served = Served("", 0, state)

    def websocket() -> asyncio.Protocol:
        protocol = RouterWebSocketProtocol(config=cfg, server_state=state, app_state={})
        protocol.release = served.release
        if client_cert is not None:
            protocol.client_cert = client_cert
        return protocol

    def front() -> asyncio.Protocol:
        return HttpToolsProtocol(config=cfg, server_state=state, app_state={})

    loop = asyncio.get_running_loop()
    server = await loop.create_server(front if http else websocket, "127.0.0.1", 0, ssl=tls)
    served.port = server.sockets[0].getsockname()[1]
    served.url = f"{'wss' if tls else 'ws'}://127.0.0.1:{served.port}"
    try:
        yield served
    finally:
        server.close()
        for protocol in list(state.connections):
            protocol.transport.close()
        await server.wait_closed()
        if state.tasks:
            await asyncio.wait(set(state.tasks), timeout=WAIT_SECS)


def closer(code: Any = ..., reason: Any = ...) -> App:
    """An app that accepts, then closes with this `code` and `reason` (left out when `...`)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        message: dict[str, Any] = {"type": "websocket.close"}
        if code is not ...:
            message["code"] = code
        if reason is not ...:
            message["reason"] = reason
        await send(message)

    return app


async def closed_with(ws: ClientConnection) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), WAIT_SECS)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


# -- which class uvicorn hands upgrades to ----------------------------------------------------


def test_the_config_names_the_router_protocol_for_upgrades() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        pass

    assert load(app).ws_protocol_class is RouterWebSocketProtocol
    assert load(app, "proxy.edge.realtime:RouterWebSocketProtocol").ws_protocol_class is (
        RouterWebSocketProtocol
    )
    # uvicorn's name for the sans-I/O protocol gives its own class, without the node's rules.
    assert load(app, "websockets-sansio").ws_protocol_class is WebSocketsSansIOProtocol


async def test_uvicorns_http_protocol_hands_the_upgrade_to_it() -> None:
    async with (
        serve(closer(4404, "not found"), http=True) as served,
        connect(served.url + "/v1/realtime") as ws,
    ):
        assert [type(p) for p in served.state.connections] == [RouterWebSocketProtocol]
        assert await closed_with(ws) == (4404, "not found")


# -- close codes and reasons ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (1000, "bye"),
        (1001, "idle for 2m"),
        (1008, ""),
        (1011, "the backend failed"),
        (1012, "restart"),
        (3000, "unauthorized"),
        (4404, "model 'nope' was not found"),
        (4999, "é ünïcödé"),
    ],
)
async def test_a_close_reaches_the_client_with_its_code_and_reason(code: int, reason: str) -> None:
    async with serve(closer(code, reason)) as served, connect(served.url) as ws:
        assert await closed_with(ws) == (code, reason)


@pytest.mark.parametrize(
    ("code", "sent"),
    # No code (or None, as Daphne's apps wrote it) is a normal close; a code that only tells
    # of a close that had no frame, or none at all, is the server's failure.
    [(..., 1000), (None, 1000), (1005, 1011), (1006, 1011), (1015, 1011), (5000, 1011)],
)
async def test_a_code_no_close_frame_may_carry_is_replaced(code: Any, sent: int) -> None:
    async with serve(closer(code)) as served, connect(served.url) as ws:
        assert await closed_with(ws) == (sent, "")


@pytest.mark.parametrize(
    ("reason", "sent"),
    [
        ("a" * MAX_REASON_BYTES, "a" * MAX_REASON_BYTES),
        ("a" * 200, "a" * MAX_REASON_BYTES),
        # 62 two-byte characters: the 123rd byte is half of the last, which is left out.
        ("é" * 62, "é" * 61),
        (None, ""),
    ],
    ids=["123-bytes", "200-bytes", "cut-character", "none"],
)
async def test_the_reason_is_cut_to_what_a_close_frame_carries(reason: Any, sent: str) -> None:
    async with serve(closer(4000, reason)) as served, connect(served.url) as ws:
        assert await closed_with(ws) == (4000, sent)


async def test_a_close_before_accept_is_an_http_403_and_gives_back_the_count() -> None:
    async def refuse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.close", "code": 1000})

    async with serve(refuse) as served:
        with pytest.raises(InvalidStatus) as refused:
            await connect(served.url, open_timeout=WAIT_SECS)
        assert refused.value.response.status_code == 403
        await served.until_released()
        assert served.releases == 1


async def test_a_client_that_never_answers_our_close_is_dropped_after_a_second() -> None:
    async with serve(closer(1001, "idle")) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(HANDSHAKE)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_SECS)
        assert head.startswith(b"HTTP/1.1 101")
        sent = asyncio.get_running_loop().time()
        # The close frame comes, and is never answered: the server ends it after its wait.
        await served.until_released()
        waited = asyncio.get_running_loop().time() - sent
        assert CLOSE_HANDSHAKE_SECS * 0.9 <= waited < UVICORN_CLOSE_SECS
        assert served.releases == 1
        writer.close()


async def test_a_client_that_answers_no_ping_is_dropped_and_the_app_told() -> None:
    # The relay counts on it: pings are no frames to it, and a dead client sends no close.
    seen: list[dict[str, Any]] = []
    async with serve(echo(seen), ws_ping_interval=PING_SECS, ws_ping_timeout=PING_SECS) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(HANDSHAKE)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_SECS)
        assert head.startswith(b"HTTP/1.1 101")
        started = asyncio.get_running_loop().time()
        await served.until_released()  # the ping comes, and is never answered
        waited = asyncio.get_running_loop().time() - started
        writer.close()
    assert 2 * PING_SECS * 0.9 <= waited < WAIT_SECS
    assert served.releases == 1
    assert seen[-1]["type"] == "websocket.disconnect"


async def test_an_error_event_then_a_close_reach_the_client() -> None:
    # The realtime relay's answer to a session that cannot start (`Relay._refuse`).
    async def told(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": '{"type":"error"}'})
        await send({"type": "websocket.close", "code": 4503, "reason": "node unavailable"})

    async with serve(told) as served, connect(served.url) as ws:
        assert await asyncio.wait_for(ws.recv(), WAIT_SECS) == '{"type":"error"}'
        assert await closed_with(ws) == (4503, "node unavailable")


# -- the front door's count, and the scope ----------------------------------------------------


def echo(seen: list[dict[str, Any]]) -> App:
    """An app that keeps its scope and the messages it receives until the client is gone."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await receive()
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            seen.append(message)
            if message["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", "text": message.get("text")})

    return app


async def test_a_client_that_closes_gives_back_the_count_once() -> None:
    seen: list[dict[str, Any]] = []
    async with serve(echo(seen)) as served:
        async with connect(served.url) as ws:
            await ws.send("hi")
            assert await ws.recv() == "hi"
            assert served.releases == 0
            await ws.close(code=4001, reason="done")
        await served.until_released()
        assert served.releases == 1
        assert not served.state.connections
    assert seen[-1] == {"type": "websocket.disconnect", "code": 4001, "reason": "done"}


async def test_a_client_that_drops_its_connection_gives_back_the_count_once() -> None:
    seen: list[dict[str, Any]] = []
    async with serve(echo(seen)) as served:
        ws = await connect(served.url)
        await ws.send("hi")
        assert await ws.recv() == "hi"
        ws.transport.abort()  # no close frame: the TCP connection just ends
        await served.until_released()
        assert served.releases == 1
    assert seen[-1]["type"] == "websocket.disconnect"


@pytest.mark.parametrize("cert", [True, False, None])
async def test_the_scope_tells_whether_a_client_certificate_came(cert: bool | None) -> None:
    seen: list[dict[str, Any]] = []
    async with (
        serve(echo(seen), client_cert=cert) as served,
        connect(served.url + "/v1/realtime?model=talk") as ws,
    ):
        await ws.send("hi")
        await ws.recv()
    scope = seen[0]
    # Not told (None): no certificate.
    assert scope[CLIENT_CERT_SCOPE_KEY] is bool(cert)
    # The client spelt them `Sec-WebSocket-Version` and so on.
    assert (b"sec-websocket-version", b"13") in scope["headers"]
    assert all(name == name.lower() for name, _ in scope["headers"])
    assert (scope["scheme"], scope["path"], scope["query_string"]) == (
        "ws",
        "/v1/realtime",
        b"model=talk",
    )


async def _scheme_under_tls(pki: trustme.CA) -> str:
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    pki.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    pki.configure_trust(client_tls)
    seen: list[dict[str, Any]] = []
    async with (
        serve(echo(seen), tls=server_tls) as served,
        connect(served.url, ssl=client_tls) as ws,
    ):
        await ws.send("hi")
        assert await ws.recv() == "hi"
    return str(seen[0]["scheme"])


async def test_the_scheme_is_wss_under_tls() -> None:
    assert await _scheme_under_tls(trustme.CA()) == "wss"


def test_the_scheme_is_wss_under_tls_on_uvloop() -> None:
    # The node's loop: its TLS transport must tell uvicorn it is one as asyncio's does.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(_scheme_under_tls(trustme.CA())) == "wss"


# -- what is sent once the socket is closing or gone ------------------------------------------


async def test_what_the_app_sends_after_the_client_left_is_dropped() -> None:
    returned = asyncio.Event()

    async def late(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        assert (await receive())["type"] == "websocket.disconnect"
        # The relay's other side may still be passing a backend frame, then the close.
        await send({"type": "websocket.send", "text": "too late"})
        await send({"type": "websocket.close", "code": 1011})
        returned.set()

    async with serve(late) as served:
        async with connect(served.url) as ws:
            await ws.close()
        await served.until_released()
    assert returned.is_set()


async def test_what_the_app_sends_after_its_own_close_is_dropped() -> None:
    returned = asyncio.Event()

    async def twice(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1001, "reason": "idle for 2m"})
        # The backend's frame, then its close, racing the idle close.
        await send({"type": "websocket.send", "text": "late"})
        await send({"type": "websocket.close", "code": 1000})
        returned.set()

    async with serve(twice) as served, connect(served.url) as ws:
        assert await closed_with(ws) == (1001, "idle for 2m")
        await asyncio.wait_for(returned.wait(), WAIT_SECS)


# -- the realtime relay behind it -------------------------------------------------------------


@dataclass
class Backend:
    url: str
    closes: list[int | None]
    closed: asyncio.Event


@pytest.fixture
async def talker() -> AsyncIterator[Backend]:
    """A backend that echoes text frames, closes with 1011 on "die", streams frames on "stream"
    until the socket ends, and keeps the close code it got."""
    backend = Backend("", [], asyncio.Event())

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.data == "die":
                await ws.close(code=1011, message=b"the backend died")
            elif msg.data == "stream":
                with contextlib.suppress(ConnectionError):
                    for n in range(STREAM_FRAMES):
                        await ws.send_str(f'{{"n": {n}}}')
            else:
                await ws.send_str(msg.data)
        backend.closes.append(ws.close_code)
        backend.closed.set()
        return ws

    async with ws_backend(handler) as url:
        backend.url = url
        yield backend


def relayed(backend: Backend) -> App:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect, as RealtimeApp takes it
        ends = SimpleNamespace(receive=receive, send=send)
        await relay_to(backend.url, cast(Any, ends)).run()

    return app


async def test_the_backends_close_reaches_the_client_through_the_relay(talker: Backend) -> None:
    async with serve(relayed(talker)) as served, connect(served.url) as ws:
        await ws.send("hello")
        assert await asyncio.wait_for(ws.recv(), WAIT_SECS) == "hello"
        await ws.send("die")
        assert await closed_with(ws) == (1011, "the backend died")


async def test_the_clients_close_reaches_the_backend_through_the_relay(talker: Backend) -> None:
    async with serve(relayed(talker)) as served:
        async with connect(served.url) as ws:
            await ws.send("hello")
            assert await asyncio.wait_for(ws.recv(), WAIT_SECS) == "hello"
            await ws.close(code=4001, reason="bye")
        await asyncio.wait_for(talker.closed.wait(), WAIT_SECS)
        await served.until_released()
    assert talker.closes == [4001]
    assert served.releases == 1


async def test_a_client_gone_mid_stream_ends_the_relay_without_a_traceback(
    talker: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve(relayed(talker)) as served:
        ws = await connect(served.url)
        await ws.send("stream")
        await asyncio.wait_for(ws.recv(), WAIT_SECS)
        # Gone while the relay writes the backend's frames to it.
        ws.transport.abort()
        await served.until_released()
        await asyncio.wait_for(talker.closed.wait(), WAIT_SECS)
    assert served.releases == 1
    # The relay closes with 1001 (going away), unless aiohttp's reader, with the backend's frames
    # still queued, closes first with its 1000: the relay's race, not the protocol's.
    assert len(talker.closes) == 1
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
