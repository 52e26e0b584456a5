"""What this node has in flight: every request it serves, and the requests it forwarded.

Two questions need these counts. Shutdown drains: a master's forwarded and relayed requests
hold no runtime here, so waiting for idle runtimes alone would cut them off. And a forwarded
request must not wait out the whole request timeout on a node that stopped answering (a
frozen process still accepts connections, its kernel does that): when the node misses its poll
deadline, the requests to it that have heard nothing for that long are cut with an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Requests:
    """Requests this node is answering now (client, node-protocol and relayed alike)."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: list[asyncio.Future[None]] = []

    def begin(self) -> None:
        self.count += 1

    def end(self) -> None:
        self.count -= 1
        if self.count <= 0:
            self.count = 0
            waiters, self._idle = self._idle, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def wait_idle(self) -> None:
        while self.count > 0:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(fut)
            await fut


@dataclass(eq=False)
class Forward:
    """One request forwarded to another node, as long as it waits for or reads the answer."""

    node_id: str
    task: asyncio.Task[Any]
    heard_at: float
    cut: str = ""
    """Why it was cut off (set just before its task is cancelled)."""
    stopping: bool = False
    """Cut because this node is stopping, not because the other node went silent."""
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def heard(self) -> None:
        self.heard_at = self.clock()


class Forwards:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.by_node: dict[str, set[Forward]] = {}

    def begin(self, node_id: str) -> Forward:
        task = asyncio.current_task()
        assert task is not None
        fwd = Forward(node_id, task, self._clock(), clock=self._clock)
        self.by_node.setdefault(node_id, set()).add(fwd)
        return fwd

    def end(self, fwd: Forward) -> None:
        held = self.by_node.get(fwd.node_id)
        if held is not None:
            held.discard(fwd)
            if not held:
                del self.by_node[fwd.node_id]

    def cut_silent(self, node_id: str, silent_for: float, reason: str) -> int:
        """Cut every forward to `node_id` that has heard nothing for `silent_for` seconds."""
        now = self._clock()
        cut = 0
        for fwd in list(self.by_node.get(node_id, ())):
            if not fwd.cut and now - fwd.heard_at >= silent_for:
                fwd.cut = reason
                fwd.task.cancel()
                cut += 1
        return cut

    def cut_all(self, reason: str) -> int:
        """Cut every forward still running (the node is stopping): each client gets an error in
        its answer's own format instead of a connection that just ends."""
        cut = 0
        for held in list(self.by_node.values()):
            for fwd in list(held):
                if not fwd.cut:
                    fwd.cut, fwd.stopping = reason, True
                    fwd.task.cancel()
                    cut += 1
        return cut

    def count(self) -> int:
        return sum(len(held) for held in self.by_node.values())
