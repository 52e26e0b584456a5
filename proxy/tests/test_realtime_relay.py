"""The realtime relay's failures: the network's become a 502 close, a bug's is logged with
its traceback, and either way the client gets exactly one close.

The relay runs against a fake node that reaches "another node" at a URL the test chooses:
a closed port, or a small aiohttp WebSocket server on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.edge import realtime
from proxy.edge.realtime import Relay
from registry.cluster import Replica
from registry.httpclient import close_session
from registry.nodeclient import NodeCallError

# Served under another ID on its node, so that frames from the backend are rewritten.
REPLICA = Replica("talk", "s1", "talk-local", "http://127.0.0.1:9", True, {}, None)
WAIT_SECS = 10.0


class FakeClient:
    authorization = "Bearer cluster-token"
    ssl = True  # the system store: the node URLs here are plain http

    def __init__(self, checked_url: Callable[[str, str], str]) -> None:
        self.checked_url = checked_url


class Client:
    """The client's side of the ASGI socket: what the relay sent, and a receive that waits."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed = asyncio.Event()
        self._never = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "websocket.close":
            self.closed.set()

    async def receive(self) -> dict[str, Any]:
        await self._never.wait()
        raise AssertionError("unreachable")

    def closes(self) -> list[int]:
        return [m["code"] for m in self.sent if m["type"] == "websocket.close"]

    def error_type(self) -> str:
        texts = [orjson.loads(m["text"]) for m in self.sent if "text" in m]
        return str(texts[0]["error"]["type"])


def relay_to(url: str | Exception, client: Client) -> Relay:
    def checked_url(base_url: str, path: str) -> str:
        if isinstance(url, Exception):
            raise url
        return url

    config = SimpleNamespace(server=SimpleNamespace(realtime_idle_timeout=120.0))
    node: Any = SimpleNamespace(busy=Counter(), client=FakeClient(checked_url), config=config)
    scope = {"query_string": b"model=talk", "subprotocols": []}
    return Relay(node, scope, client.receive, client.send, from_node=False)


@pytest.fixture(autouse=True)
def pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realtime, "_kind", lambda node, model: "speech")
    monkeypatch.setattr(realtime, "resolve", lambda node, model, kind, borrowed: REPLICA)


@pytest.fixture
async def backend() -> AsyncIterator[str]:
    """A backend that sends one text frame, then waits for the client."""

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str('{"type": "session.created", "model": "talk"}')
        async for _ in ws:
            pass
        return ws

    async with ws_backend(handler) as url:
        yield url


@contextlib.asynccontextmanager
async def ws_backend(
    handler: Callable[[web.Request], Awaitable[web.WebSocketResponse]],
) -> AsyncIterator[str]:
    """A backend on a loopback port whose `/ws` is `handler`; yields its URL."""
    app = web.Application()
    app.router.add_get("/ws", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/ws"
    finally:
        await close_session()
        await runner.cleanup()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "proxy.edge.realtime" and r.exc_info]


async def test_an_unreachable_node_closes_the_session_as_a_502_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client()
    url = f"http://127.0.0.1:{closed_port()}/ws"

    try:
        await asyncio.wait_for(relay_to(url, client).run(), WAIT_SECS)
    finally:
        await close_session()

    assert client.closes() == [4502]
    assert client.error_type() == "backend_error"
    assert tracebacks(caplog) == []


async def test_a_node_off_the_allow_list_is_a_502_and_a_bug_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused, broken = Client(), Client()

    await relay_to(NodeCallError("not_allowed", "not on the allow-list"), refused).run()
    assert refused.closes() == [4502] and tracebacks(caplog) == []

    await relay_to(KeyError("a bug"), broken).run()
    assert broken.closes() == [4500]
    assert broken.error_type() == "server_error"
    (record,) = tracebacks(caplog)
    assert record.levelno == logging.ERROR and "a bug" in caplog.text


async def test_a_bug_while_relaying_is_logged_and_closes_the_session_once(
    backend: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def rewrite(self: realtime.Session, text: str) -> str:
        raise ValueError("a bug in the rewrite")

    monkeypatch.setattr(realtime.Session, "rewrite", rewrite)
    client = Client()

    await asyncio.wait_for(relay_to(backend, client).run(), WAIT_SECS)

    assert [m["type"] for m in client.sent] == ["websocket.accept", "websocket.close"]
    assert client.closes() == [1011]
    (record,) = tracebacks(caplog)
    assert "backend to client" in record.getMessage() and "a bug in the rewrite" in caplog.text
