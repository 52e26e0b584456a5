"""The `http.response.pathsend` ASGI extension for the router's Daphne server.

Daphne writes every `http.response.body` into Twisted's transport at once, with no
backpressure: a 1 GiB asset streamed in blocks would sit in the sender's memory until the
peer had read it. With this extension a handler hands over a file (and a byte span); Twisted's
own `FileSender` then reads it as the socket drains, so memory stays at one block per
transfer. Advertised in `scope["extensions"]` only by servers that serve it (runrouter's).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, BinaryIO

from twisted.protocols.basic import FileSender

EXTENSION = "http.response.pathsend"
# Blocks read per producer turn: large enough that the per-block cost is noise next to the copy.
BLOCK_BYTES = 1024 * 1024


class _Span:
    """A file read from `offset` for `length` bytes, then empty: one byte range of it."""

    def __init__(self, handle: BinaryIO, length: int) -> None:
        self._handle = handle
        self._left = length

    def read(self, size: int) -> bytes:
        if self._left <= 0:
            return b""
        data = self._handle.read(min(size, self._left))
        self._left -= len(data)
        return data


class _BlockSender(FileSender):
    CHUNK_SIZE = BLOCK_BYTES


def advertise(scope: dict[str, Any]) -> None:
    scope.setdefault("extensions", {})[EXTENSION] = {}


async def send_path(request: Any, message: dict[str, Any]) -> None:
    """Send `message["path"]` (from `offset`, `length` bytes) as the body and finish."""
    offset = int(message.get("offset", 0))
    fd = os.open(message["path"], os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        length = int(message.get("length", os.fstat(handle.fileno()).st_size - offset))
        handle.seek(offset)
        deferred = _BlockSender().beginFileTransfer(_Span(handle, length), request)
        try:
            await deferred.asFuture(asyncio.get_running_loop())
        except Exception:
            # The peer went away (the transport stopped the producer): nothing more to send.
            return
    request.finish()
