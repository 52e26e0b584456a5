"""A do-nothing ASGI app that reads the request and never answers: the baseline cost of one
held HTTP connection under the node's HTTP server, measured by bench/queue.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

HOLD_SECS = 3600


async def application(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await asyncio.sleep(HOLD_SECS)
