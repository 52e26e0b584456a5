"""One request's cycle on a front-door connection: uvicorn's, with pathsend, each answer's
head written together with its first body bytes, and the app's disconnect watch fired when the
client goes away (`proxy.edge.hooks`).

uvicorn writes an answer's head the moment the app starts it, and the body in a second write:
two send() calls and two segments for the common answer whose body follows at once (a JSON
answer, an error). Here the head is held until the first body message (or a pathsend, or the
end of the loop turn, so a stream whose first chunk takes a while still shows its head at
once) and goes out in the same write as that body.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE

from proxy.edge.filesend import PathCycle
from proxy.edge.hooks import DISCONNECT_WATCH, DisconnectWatch
from proxy.request import WHOLE_ANSWER

# Past this, a body is written after the held head rather than joined to it in a copy.
JOIN_MAX_BYTES = 64 * 1024


class _HeadHolder:
    """Stands in for the transport while the base class writes a response's head."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def _write_after(transport: asyncio.Transport, head: bytes, body: bytes) -> None:
    """`head`, then `body`, in one write: joined in a copy when the body is small."""
    if not head:
        transport.write(body)
    elif not body:
        transport.write(head)
    elif len(body) <= JOIN_MAX_BYTES:
        transport.write(head + body)
    else:
        transport.writelines((head, body))


class _Joined:
    """Stands in for the transport while the base class writes the first body bytes: the held
    head goes out in the same write, and before anything else the base class does with it."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: asyncio.Transport, head: bytes) -> None:
        self.transport = transport
        self.head = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        _write_after(self.transport, head, data)

    def flush(self) -> None:
        head, self.head = self.head, b""
        if head:
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class RouterCycle(PathCycle):
    """uvicorn's cycle (with pathsend) holding each answer's head for its first body bytes, and
    firing the app's disconnect watch (`proxy.edge.hooks`)."""

    _head: bytes | None = None
    _flush_later: asyncio.Handle | None = None
    _watch: DisconnectWatch | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extensions = self.scope["extensions"]
        extensions[DISCONNECT_WATCH] = {}
        extensions[WHOLE_ANSWER] = {}

    def _went_away(self) -> None:
        # Every place that finds the client gone (the protocol's connection_lost, the front
        # door cutting a body) gets here, and only while the answer is incomplete.
        super()._went_away()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.fire()

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == WHOLE_ANSWER:
            await self._whole(message)
            return
        if kind == DISCONNECT_WATCH:
            self._set_watch(message["watch"])
            return
        if kind == "http.response.start" and not self.response_started:
            await self._start(message)
            return
        head = self._head
        if head is None:
            await super().send(message)
            return
        self._head = None
        later, self._flush_later = self._flush_later, None
        if later is not None:
            later.cancel()
        transport = self.transport
        if kind != "http.response.body" or self.disconnected:
            if not self.disconnected and not transport.is_closing():
                transport.write(head)
            await super().send(message)
            return
        joined = _Joined(transport, head)
        self.transport = joined  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if not transport.is_closing():
                joined.flush()

    async def _whole(self, message: Any) -> None:
        """`WHOLE_ANSWER`: what `http.response.start` and one last `http.response.body` of the
        same status, headers and body would write, with a content-length, in one write."""
        if self.response_started:
            raise RuntimeError(f"Unexpected ASGI message '{WHOLE_ANSWER}' after the answer began.")
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        status: int = message["status"]
        body: bytes = message["body"]
        self.response_started = True
        self.waiting_for_100_continue = False
        self._status = status
        names = [name.lower() for name, _ in message["headers"]]
        values = [value for _, value in message["headers"]]
        # One search over all names (and one over all values) finds what one per header would:
        # joining adds no character.
        if HEADER_RE.search(b"".join(names)):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"".join(values)):
            raise RuntimeError("Invalid HTTP header value.")
        content = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            content += (name, b": ", value, b"\r\n")
        closes = False
        for name, value in zip(names, values, strict=True):
            if name == b"connection" and b"close" in [
                token.lower().strip() for token in value.split(b",")
            ]:
                self.keep_alive = False
                closes = True
            content += (name, b": ", value, b"\r\n")
        content += (b"content-length: ", b"%d\r\n" % len(body))
        if not self.keep_alive and not closes:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        head = b"".join(content)
        _write_after(self.transport, head, b"" if self.scope["method"] == "HEAD" else body)
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    def _set_watch(self, watch: DisconnectWatch) -> None:
        if self.disconnected and not self.response_complete:
            watch.fire()
        elif not self.response_complete:
            self._watch = watch

    async def _start(self, message: ASGISendEvent) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        holder = _HeadHolder()
        transport = self.transport
        self.transport = holder  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
        if holder.data and not self.disconnected:
            self._head = holder.data
            # A stream's first chunk may be far off: the head goes at the end of this turn.
            self._flush_later = asyncio.get_running_loop().call_soon(self._flush_head)

    def _flush_head(self) -> None:
        self._flush_later = None
        head, self._head = self._head, None
        if head is not None and not self.disconnected and not self.transport.is_closing():
            self.transport.write(head)
