"""For tests that call the forwarding code directly: a client as the request path sees it, and
a node built from a config file and closed after."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from proxy.node import Node, build_node
from registry.httpclient import close_session
from routerproject.config import load_config


class Client:
    """Keeps every message the request path sends it; never sends a message of its own (it
    neither sends more body nor leaves)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def built_node(config_path: Path) -> AsyncIterator[Node]:
    """The node `config_path` describes; after, its restore timers, backends and the process's
    HTTP session are closed."""
    node = build_node(load_config(config_path, environ={}))
    try:
        yield node
    finally:
        node.restore.close()
        await node.runtimes.close()
        await close_session()
