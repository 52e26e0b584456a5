"""The `http.response.pathsend` ASGI extension for the router's uvicorn server.

uvicorn writes every `http.response.body` into the transport at once: a 1 GiB asset handed over
in one message would sit in memory until the peer had read it, and streamed in blocks it costs a
read into Python and a copy per block. With this extension a handler hands over a file (and a
byte span), and the server sends it as the socket drains, so memory stays at one block per
transfer at most. Advertised in `scope["extensions"]` by the cycle that serves it (`PathCycle`).

On a plain TCP (or Unix) connection of asyncio's or uvloop's loop the span goes out with
os.sendfile, page cache to socket: no read into Python, no block held in memory, no copy through
the transport's buffer. Any other transport (TLS, a test transport), and a chunked response, gets
blocks read with pread, written through the transport under uvicorn's flow control.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from typing import Any, Literal, NotRequired, TypedDict, cast

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from proxy.edge.tls import is_tls

logger = logging.getLogger(__name__)

EXTENSION = "http.response.pathsend"
# Bytes read per block when sendfile cannot be used: large enough that the per-block cost is
# noise next to the copy, and the most a transfer holds in memory.
BLOCK_BYTES = 1024 * 1024
# At most this much leaves per loop turn (by sendfile or in blocks), so that one fast reader
# cannot keep the loop from every other connection.
SENDFILE_TURN_BYTES = 4 * 1024 * 1024
# RFC 9110: these responses have no body, whatever their content-length says.
NO_BODY_CODES = frozenset({204, 304})
# sendfile refuses this file or socket (a file system without splice support, say): the rest of
# the span goes in blocks instead.
_NO_SENDFILE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


class PathSendEvent(TypedDict):
    type: Literal["http.response.pathsend"]
    path: str
    offset: NotRequired[int]
    length: NotRequired[int]


def _plain_transport_types() -> tuple[type, ...]:
    """The transports whose socket carries the bytes as written: sendfile may write to it."""
    from asyncio import selector_events

    # Private, and not in the stubs: the transport of a plain socket on asyncio's own loop.
    kinds: list[type] = [getattr(selector_events, "_SelectorSocketTransport")]  # noqa: B009
    try:
        import uvloop.loop
    except ImportError:  # the router runs on uvloop, but the module must not need it
        return tuple(kinds)
    # Not in uvloop's stubs; TLS transports are other classes, never subclasses of these.
    kinds += [getattr(uvloop.loop, "TCPTransport"), getattr(uvloop.loop, "UnixTransport")]  # noqa: B009
    return tuple(kinds)


_PLAIN_TRANSPORTS = _plain_transport_types()


def _plain_socket(transport: asyncio.BaseTransport) -> int | None:
    """The transport's socket descriptor when sendfile can write to it, else None."""
    if not isinstance(transport, _PLAIN_TRANSPORTS):
        return None
    # Belt and braces: an SSL transport of asyncio answers "socket" with the raw TCP socket, and
    # bytes written there would bypass the encryption.
    if is_tls(transport):
        return None
    sock = transport.get_extra_info("socket")
    fileno = sock.fileno() if sock is not None else -1
    return fileno if fileno >= 0 else None


def _settle(waiter: asyncio.Future[None]) -> None:
    # Level-triggered: the writer can fire again before the waiting task removes it.
    if not waiter.done():
        waiter.set_result(None)


def advertise(scope: dict[str, Any]) -> None:
    scope.setdefault("extensions", {})[EXTENSION] = {}


class PathCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, plus `http.response.pathsend`: the file's span goes out
    as the socket drains, then the response finishes as after a last `http.response.body`.

    Construct it as uvicorn constructs RequestResponseCycle (the same keyword arguments); it
    advertises the extension in the scope it is given.
    """

    # Class defaults rather than __init__ state, so a cycle re-classed after uvicorn built it
    # still works (though only one constructed as a PathCycle advertises the extension).
    _status = 200
    _gone = False
    _wake: asyncio.Future[None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        advertise(cast(dict[str, Any], self.scope))

    @property
    def disconnected(self) -> bool:
        return self._gone

    @disconnected.setter
    def disconnected(self, value: bool) -> None:
        # The protocol sets this from connection_lost, the front door when it cuts a body.
        self._gone = value
        if value:
            self._went_away()

    def _went_away(self) -> None:
        # A transfer waiting for the socket to drain must wake: it holds a duplicate of the
        # socket's descriptor, which keeps the connection open after the transport has closed
        # its own.
        if self._wake is not None:
            _settle(self._wake)

    async def send(self, message: ASGISendEvent | PathSendEvent) -> None:
        if message["type"] == EXTENSION:
            await self._send_path(cast(PathSendEvent, message))
            return
        if message["type"] == "http.response.start":
            # The base class does not keep the status; a 204 or 304 must not get a body.
            self._status = message["status"]
        await super().send(cast(ASGISendEvent, message))

    async def _send_path(self, message: PathSendEvent) -> None:
        if self.disconnected:
            return  # as the base class does with any message: nobody to send it to
        if not self.response_started:
            raise RuntimeError(
                f"Expected ASGI message 'http.response.start', but got '{EXTENSION}'."
            )
        if self.response_complete:
            raise RuntimeError(
                f"Unexpected ASGI message '{EXTENSION}' sent, after response already completed."
            )
        path = message["path"]
        offset = int(message.get("offset", 0))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            length = int(message.get("length", os.fstat(fd).st_size - offset))
            if offset < 0 or length < 0:
                raise ValueError(f"no span of {path} from {offset} for {length} bytes")
            if self.scope["method"] == "HEAD" or self._status in NO_BODY_CODES:
                self.expected_content_length = 0
                whole = True
            else:
                whole = await self._send_body(fd, path, offset, length)
        finally:
            os.close(fd)
        if whole:
            await super().send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_body(self, fd: int, path: str, offset: int, length: int) -> bool:
        """Send the span as the body; False if it stopped short (and the connection dropped)."""
        if not self.chunked_encoding and length != self.expected_content_length:
            # Checked before a byte goes out, where the base class finds out after.
            raise RuntimeError(
                f"Response content of {length} bytes, but Content-Length has "
                f"{self.expected_content_length} left"
            )
        try:
            await self._send_span(fd, offset, length)
        except OSError as exc:
            # The peer went away, or the file ended short: either way nothing more can be sent,
            # and a body cut short must not be finished as if whole: the peer sees it dropped.
            logger.warning("sending %s (%d bytes from %d) stopped: %s", path, length, offset, exc)
            self.transport.abort()
            self.disconnected = True
            return False
        return True

    async def _send_span(self, fd: int, offset: int, length: int) -> None:
        sent = 0
        if not self.chunked_encoding:
            # Chunked framing would need each chunk's head between sendfile calls: blocks.
            sent = await self._sendfile(fd, offset, length)
            self.expected_content_length -= sent
        await self._send_blocks(fd, offset + sent, length - sent)

    def _check_connected(self) -> None:
        if self.disconnected or self.transport.is_closing():
            raise ConnectionResetError("the connection is closed")

    async def _sendfile(self, fd: int, offset: int, length: int) -> int:
        """Send what sendfile can of the span straight to the socket; return the bytes sent
        (0 on a transport sendfile cannot write to)."""
        sock = _plain_socket(self.transport)
        if sock is None:
            return 0
        # A descriptor of our own: the loop refuses to watch the transport's (uvloop as asyncio:
        # "used by transport"), and its number stays ours should the transport close its own.
        out = os.dup(sock)
        sent = turn = 0
        try:
            while sent < length:
                self._check_connected()
                if self.flow.write_paused:
                    await self.flow.drain()
                elif self.transport.get_write_buffer_size():
                    # Bytes written before (the response head) go first: sendfile waits.
                    await self._writable(out)
                elif turn >= SENDFILE_TURN_BYTES:
                    turn = 0
                    await asyncio.sleep(0)  # a turn of the loop for the other connections
                else:
                    step = min(length - sent, SENDFILE_TURN_BYTES - turn)
                    try:
                        done = os.sendfile(out, fd, offset + sent, step)
                    except BlockingIOError:
                        turn = 0  # waiting for the socket lets the others run
                        await self._writable(out)
                        continue
                    except OSError as exc:
                        if exc.errno in _NO_SENDFILE:
                            return sent
                        raise
                    if done == 0:
                        raise OSError("the file is shorter than the span to send")
                    sent += done
                    turn += done
        finally:
            os.close(out)
        return sent

    async def _writable(self, fd: int) -> None:
        """Wait until the socket takes more bytes, or the connection is lost."""
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        loop.add_writer(fd, _settle, self._wake)
        try:
            await self._wake
        finally:
            loop.remove_writer(fd)
            self._wake = None

    async def _send_blocks(self, fd: int, offset: int, length: int) -> None:
        """Send the span in blocks through the transport, each once the last has drained."""
        turn = 0
        while length > 0:
            if self.flow.write_paused and not self.disconnected:
                # Read the next block only now: one block per transfer in memory, not two.
                await self.flow.drain()
                turn = 0
            self._check_connected()
            if turn >= SENDFILE_TURN_BYTES:
                # A fast reader drains every write at once: the transport never pauses us.
                turn = 0
                await asyncio.sleep(0)
                continue
            block = os.pread(fd, min(BLOCK_BYTES, length), offset)
            if not block:
                raise OSError("the file is shorter than the span to send")
            offset += len(block)
            length -= len(block)
            turn += len(block)
            await super().send({"type": "http.response.body", "body": block, "more_body": True})
