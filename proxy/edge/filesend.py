"""The `http.response.pathsend` ASGI extension for the router's Daphne server.

Daphne writes every `http.response.body` into Twisted's transport at once, with no
backpressure: a 1 GiB asset streamed in blocks would sit in the sender's memory until the
peer had read it. With this extension a handler hands over a file (and a byte span), and the
server sends it as the socket drains, so memory stays at one block per transfer at most.
Advertised in `scope["extensions"]` only by servers that serve it (runrouter's).

On a plain TCP connection the span goes out with os.sendfile, page cache to socket: no read
into Python, no copy through Twisted's buffers, a fraction of the CPU per GiB. Any other
transport (TLS, a test transport) gets Twisted's own `FileSender`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, BinaryIO

from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.tcp import Connection
from twisted.protocols.basic import FileSender
from twisted.web.http import NO_BODY_CODES

logger = logging.getLogger(__name__)

EXTENSION = "http.response.pathsend"
# Blocks read per producer turn: large enough that the per-block cost is noise next to the copy.
BLOCK_BYTES = 1024 * 1024
# At most this much leaves through sendfile per reactor turn, so that one fast reader cannot
# keep the reactor from every other connection.
SENDFILE_TURN_BYTES = 4 * 1024 * 1024


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


_BUFFER_STATE = ("dataBuffer", "offset", "_tempDataLen", "bufferSize")


def _transport_idle(transport: Any) -> bool:
    """Nothing waits in the transport's own buffer (bytes sendfile must not overtake)."""
    return len(transport.dataBuffer) <= transport.offset and not transport._tempDataLen


class SpanSender:
    """Sends bytes [offset, offset + length) of `fd` into a TCP transport's socket with
    os.sendfile, as a push producer of the request.

    The transport only calls a producer back after pausing it, and it pauses it only when its
    own buffer overflows. So when the socket is full, one slice just past the transport's
    buffer size goes through `request.write`: the transport pauses this producer, drains that
    slice as the socket empties, and resumes it with its buffer empty, and sendfile goes on.
    The same path carries anything written while the transport still holds bytes (the response
    head), so the body never overtakes them.
    """

    def __init__(
        self, request: Any, transport: Any, fd: int, offset: int, length: int, clock: Any
    ) -> None:
        self.deferred: defer.Deferred[None] = defer.Deferred()
        self._request = request
        self._transport = transport
        self._fd = fd
        self._offset = offset
        self._left = length
        self._clock = clock
        self._paused = False
        self._done = False
        self._later: Any = None

    def start(self) -> None:
        self._request.registerProducer(self, True)
        self._pump()

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._pump()

    def stopProducing(self) -> None:
        self._end(ConnectionDone("the peer stopped reading"))

    def _pump(self) -> None:
        if self._later is not None and self._later.active():
            self._later.cancel()
        self._later = None
        turn = 0
        while not self._done and not self._paused and self._left > 0:
            if not _transport_idle(self._transport):
                self._write_through()
                continue
            if turn >= SENDFILE_TURN_BYTES:
                self._later = self._clock.callLater(0, self._pump)
                return
            try:
                sent = os.sendfile(
                    self._transport.fileno(),
                    self._fd,
                    self._offset,
                    min(self._left, SENDFILE_TURN_BYTES),
                )
            except BlockingIOError:
                self._write_through()
                continue
            except OSError as exc:
                self._abort(exc)
                return
            if sent == 0:
                self._abort(OSError("the file is shorter than the span to send"))
                return
            self._offset += sent
            self._left -= sent
            turn += sent
        if not self._done and self._left == 0:
            self._end(None)

    def _write_through(self) -> None:
        size = min(self._left, self._transport.bufferSize + 1)
        try:
            data = os.pread(self._fd, size, self._offset)
        except OSError as exc:
            self._abort(exc)
            return
        if not data:
            self._abort(OSError("the file is shorter than the span to send"))
            return
        self._offset += len(data)
        self._left -= len(data)
        self._request.write(data)

    def _abort(self, error: BaseException) -> None:
        # A body cut short must not look finished: the peer sees the connection drop.
        self._transport.abortConnection()
        self._end(error)

    def _end(self, error: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        if self._later is not None and self._later.active():
            self._later.cancel()
        self._request.unregisterProducer()
        if error is None:
            self.deferred.callback(None)
        else:
            self.deferred.errback(error)


def _tcp_transport(request: Any) -> Any:
    """The request's TCP transport when sendfile can write to its socket, else None."""
    channel = getattr(request, "channel", None)
    transport = getattr(channel, "transport", None)
    if not isinstance(transport, Connection) or getattr(transport, "TLS", False):
        return None
    # SpanSender reads the transport's buffer state: a Twisted without these falls back.
    if not all(hasattr(transport, name) for name in _BUFFER_STATE):
        return None
    return transport


def advertise(scope: dict[str, Any]) -> None:
    scope.setdefault("extensions", {})[EXTENSION] = {}


async def send_path(request: Any, message: dict[str, Any]) -> None:
    """Send `message["path"]` (from `offset`, `length` bytes) as the body and finish."""
    offset = int(message.get("offset", 0))
    fd = os.open(message["path"], os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        length = int(message.get("length", os.fstat(handle.fileno()).st_size - offset))
        # The response head goes first, into the transport's buffer (sendfile waits for it).
        request.write(b"")
        transport = _tcp_transport(request)
        framed = not request.chunked and request.method != b"HEAD"
        if transport is not None and framed and request.code not in NO_BODY_CODES:
            from twisted.internet import reactor

            sender = SpanSender(request, transport, handle.fileno(), offset, length, reactor)
            sender.start()
            deferred = sender.deferred
        else:
            handle.seek(offset)
            deferred = _BlockSender().beginFileTransfer(_Span(handle, length), request)
        try:
            await deferred.asFuture(asyncio.get_running_loop())
        except Exception as exc:
            # The peer went away (the transport stopped the producer), or the file ended short
            # (the connection was dropped): either way nothing more can be sent, and a body
            # cut short must not be finished as if whole.
            logger.warning(
                "sending %s (%d bytes from %d) stopped: %s", message["path"], length, offset, exc
            )
            return
    request.finish()

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as PathCycle  # noqa
