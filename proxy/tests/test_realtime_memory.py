"""What a closed realtime session leaves behind: nothing that lives on after it.

aiohttp (3.14) re-arms a WebSocket's heartbeat when bytes arrive while it closes; the timer
then holds the closed socket, its buffers and its response for another heartbeat and pong
period (~30 s). Idle sessions opened and closed in bulk (3,072 in the issue) kept ~100 MB for
that long. The relay cancels the heartbeat once the backend socket is closed.

A closed session also leaves reference cycles that the node's tuned collector would keep for
a long time: a full collection runs every `COLLECT_EVERY` closed WebSockets and a little after the
last one closes (bench/websockets.py measures the RSS). The collector's clock here is a fake
that moves only when a test says so.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest
from websockets.asyncio.client import connect

from proxy.edge import realtime
from proxy.edge.realtime import COLLECT_EVERY, COLLECT_SETTLE_SECS, Collector
from proxy.tests.doorharness import FakeClock
from proxy.tests.test_realtime_relay import Client, backend, pinned, relay_to
from proxy.tests.test_ws_protocol import WAIT_SECS, echo, serve

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
    clock = FakeClock()
    collector = Collector(every=3, settle=4.0, clock=clock)
    for _ in range(5):
        collector.opened()
    collector.closed()
    collector.closed()
    assert collector.collections == 0
    collector.closed()  # the third close
    assert collector.collections == 1
    collector.closed()
    collector.closed()  # the last open socket: collected once its relay had time to end
    assert (collector.collections, [h.when for h in clock.pending()]) == (1, [4.0])
    clock.advance(3.75)
    assert collector.collections == 1
    clock.advance(0.25)
    assert (collector.collections, [h.when for h in clock.pending()]) == (2, [])
    assert (COLLECT_EVERY, COLLECT_SETTLE_SECS) == (256, 4.0)


def test_a_collection_by_count_cancels_the_settle_one() -> None:
    clock = FakeClock()
    collector = Collector(every=2, settle=4.0, clock=clock)
    collector.opened()
    collector.closed()  # the last one open: a settle is timed
    assert [h.when for h in clock.pending()] == [4.0]
    collector.opened()
    collector.closed()  # the second close collects now
    assert (collector.collections, [h.when for h in clock.pending()]) == (1, [])
    clock.advance(4.0)
    assert collector.collections == 1


async def test_the_settle_is_timed_on_the_running_loop() -> None:
    collector = Collector(every=COLLECT_EVERY)
    collector.opened()
    loop = asyncio.get_running_loop()
    before = loop.time()
    collector.closed()
    pending = collector._pending
    assert isinstance(pending, asyncio.TimerHandle)
    assert before + COLLECT_SETTLE_SECS <= pending.when() <= loop.time() + COLLECT_SETTLE_SECS
    collector.collect()
    assert pending.cancelled()


async def test_the_websocket_protocol_counts_its_socket_in_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    collector = Collector(every=1000, clock=clock)
    monkeypatch.setattr(realtime, "CLOSED_SOCKETS", collector)
    seen: list[dict[str, Any]] = []
    async with serve(echo(seen)) as served:
        async with connect(served.url) as ws:
            await ws.send("hi")
            assert await asyncio.wait_for(ws.recv(), WAIT_SECS) == "hi"
            assert (collector.open, collector.count) == (1, 0)
        await served.until_released()
    assert (collector.open, collector.count, collector.collections) == (0, 1, 0)
    clock.advance(COLLECT_SETTLE_SECS)
    assert collector.collections == 1
