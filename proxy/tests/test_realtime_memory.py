"""What a closed realtime session leaves behind: nothing that lives on after it.

aiohttp (3.14) re-arms a WebSocket's heartbeat when bytes arrive while it closes; the timer
then holds the closed socket, its buffers and its response for another heartbeat and pong
period (~30 s). Idle sessions opened and closed in bulk (3,072 in the issue) kept ~100 MB for
that long. The relay cancels the heartbeat once the backend socket is closed.

A closed session also leaves reference cycles that the node's tuned collector would keep for
a long time: a full collection runs every `COLLECT_EVERY` closed WebSockets and a little after the
last one closes (bench/websockets.py measures the RSS).
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet.task import Clock

from proxy.edge import realtime
from proxy.edge.realtime import (
    COLLECT_EVERY,
    COLLECT_SETTLE_SECS,
    Collector,
    RouterWebSocketProtocol,
)
from proxy.tests.test_realtime_relay import Client, backend, pinned, relay_to

__all__ = ["backend", "pinned"]  # fixtures used here

# Loop turns given to callbacks the close scheduled (call_soon), none of them timed.
TURNS = 20


async def test_a_closed_backend_socket_is_not_kept_by_its_heartbeat(backend: str) -> None:
    relay = relay_to(backend, Client())
    refs: list[weakref.ref[Any]] = []
    async with relay._connect(backend, {}, "talk", True) as ws:
        refs.append(weakref.ref(ws))
        await ws.receive()  # the backend's first frame
        del ws
    for _ in range(TURNS):
        await asyncio.sleep(0)
    gc.collect()
    assert refs[0]() is None


def test_a_full_collection_runs_every_so_many_closes_and_after_the_last_socket_closes() -> None:
    clock = Clock()
    collector = Collector(every=3, settle=4.0, clock=clock)
    for _ in range(5):
        collector.opened()
    collector.closed()
    collector.closed()
    assert collector.collections == 0
    collector.closed()  # the third close
    assert collector.collections == 1
    collector.closed()
    collector.closed()  # the last open socket: collected once Daphne had time to reap it
    assert collector.collections == 1
    clock.advance(3.9)
    assert collector.collections == 1
    clock.advance(0.1)
    assert collector.collections == 2
    assert (COLLECT_EVERY, COLLECT_SETTLE_SECS) == (256, 4.0)


def test_the_websocket_protocol_counts_its_socket_in_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Daphne's own setup and teardown need a connected socket; only the counting is tested.
    monkeypatch.setattr(WebSocketProtocol, "connectionMade", lambda self: None)
    monkeypatch.setattr(WebSocketProtocol, "connectionLost", lambda self, reason: None)
    clock = Clock()
    collector = Collector(every=1000, clock=clock)
    monkeypatch.setattr(realtime, "CLOSED_SOCKETS", collector)
    protocol = RouterWebSocketProtocol.__new__(RouterWebSocketProtocol)
    protocol.connectionMade()
    assert collector.open == 1
    protocol.connectionLost(None)
    clock.advance(COLLECT_SETTLE_SECS)
    assert (collector.open, collector.collections) == (0, 1)
