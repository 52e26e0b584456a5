"""What a closed realtime session leaves behind: nothing that lives on after it.

aiohttp (3.14) re-arms a WebSocket's heartbeat when bytes arrive while it closes; the timer
then holds the closed socket, its buffers and its response for another heartbeat and pong
period (~30 s). Idle sessions opened and closed in bulk (3,072 in the issue) kept ~100 MB for
that long. The relay cancels the heartbeat once the backend socket is closed.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

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
