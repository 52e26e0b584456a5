"""The sendfile producer of proxy/edge/filesend.py against a real socket pair: a transport that
buffers and pauses as Twisted's does, time from a Twisted `Clock`."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from proxy.edge import filesend
from proxy.edge.filesend import SpanSender

DATA = bytes(range(256)) * 12_000  # ~3 MB: more than the socket pair holds at once


class Transport:
    """What SpanSender needs of Twisted's TCP transport: its buffer, which pauses the producer
    past `bufferSize` and resumes it once drained into the socket."""

    bufferSize = 1024

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.dataBuffer = b""
        self.offset = 0
        self._tempDataLen = 0
        self.producer: Any = None
        self.paused = False
        self.aborted = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def write(self, data: bytes) -> None:
        self.dataBuffer = self.dataBuffer[self.offset :] + data
        self.offset = 0
        if len(self.dataBuffer) > self.bufferSize and self.producer is not None:
            self.paused = True
            self.producer.pauseProducing()

    def drain(self) -> None:
        while self.offset < len(self.dataBuffer):
            try:
                self.offset += self.sock.send(self.dataBuffer[self.offset :])
            except BlockingIOError:
                return
        self.dataBuffer, self.offset = b"", 0
        if self.paused and self.producer is not None:
            self.paused = False
            self.producer.resumeProducing()

    def abortConnection(self) -> None:
        self.aborted = True


class Request:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.registered = 0

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        assert streaming
        self.registered += 1
        self.transport.producer = producer

    def unregisterProducer(self) -> None:
        self.transport.producer = None

    def write(self, data: bytes) -> None:
        self.transport.write(data)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)
    try:
        yield ours, peer
    finally:
        ours.close()
        peer.close()


def read_available(peer: socket.socket, into: bytearray) -> None:
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            return
        into += chunk


def run(sender: SpanSender, transport: Transport, peer: socket.socket, clock: Clock) -> bytes:
    """Play reader and reactor until the sender is done and the transport empty."""
    finished: list[Any] = []
    sender.deferred.addBoth(finished.append)
    got = bytearray()
    sender.start()
    for _ in range(100_000):
        read_available(peer, got)
        transport.drain()
        clock.advance(0)
        if finished and not transport.dataBuffer:
            break
    read_available(peer, got)
    assert finished == [None]
    return bytes(got)


def open_file(tmp_path: Path, data: bytes) -> Iterator[int]:
    path = tmp_path / "asset.bin"
    path.write_bytes(data)
    with path.open("rb") as handle:
        yield handle.fileno()


@pytest.fixture
def fd(tmp_path: Path) -> Iterator[int]:
    yield from open_file(tmp_path, DATA)


def test_the_span_follows_the_buffered_head_byte_for_byte(
    pair: tuple[socket.socket, socket.socket], fd: int
) -> None:
    ours, peer = pair
    transport = Transport(ours)
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")  # the head, still in the transport's buffer
    clock = Clock()
    sender = SpanSender(Request(transport), transport, fd, 1000, len(DATA) - 2000, clock)
    got = run(sender, transport, peer, clock)
    assert got == b"HTTP/1.1 200 OK\r\n\r\n" + DATA[1000:-1000]
    assert transport.producer is None and not transport.aborted


def test_a_full_socket_hands_one_slice_to_the_transport_which_pauses_the_sender(
    pair: tuple[socket.socket, socket.socket], fd: int
) -> None:
    ours, _peer = pair
    transport = Transport(ours)
    clock = Clock()
    sender = SpanSender(Request(transport), transport, fd, 0, len(DATA), clock)
    sender.start()
    # Nobody reads: the socket fills, then one slice just past bufferSize waits in the buffer.
    assert transport.paused
    assert len(transport.dataBuffer) == transport.bufferSize + 1
    assert not clock.getDelayedCalls()


def test_one_turn_sends_at_most_the_turn_budget_then_yields_to_the_reactor(
    pair: tuple[socket.socket, socket.socket], fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filesend, "SENDFILE_TURN_BYTES", 4096)
    ours, peer = pair
    transport = Transport(ours)
    clock = Clock()
    sender = SpanSender(Request(transport), transport, fd, 0, len(DATA), clock)
    sender.start()
    got = bytearray()
    read_available(peer, got)
    assert len(got) == 4096 and len(clock.getDelayedCalls()) == 1
    clock.advance(0)  # the next turns, until the socket is full
    read_available(peer, got)
    assert len(got) > 4096 and bytes(got) == DATA[: len(got)]


def test_a_file_shorter_than_its_span_drops_the_connection(
    pair: tuple[socket.socket, socket.socket], fd: int
) -> None:
    ours, peer = pair
    transport = Transport(ours)
    clock = Clock()
    sender = SpanSender(Request(transport), transport, fd, 0, len(DATA) + 10, clock)
    outcome: list[Any] = []
    sender.deferred.addBoth(outcome.append)
    got = bytearray()
    sender.start()
    for _ in range(100_000):
        read_available(peer, got)
        transport.drain()
        if outcome:
            break
    assert transport.aborted and transport.producer is None
    assert isinstance(outcome[0].value, OSError)


def test_a_stopped_sender_fails_its_deferred_and_unregisters(
    pair: tuple[socket.socket, socket.socket], fd: int
) -> None:
    ours, _peer = pair
    transport = Transport(ours)
    sender = SpanSender(Request(transport), transport, fd, 0, len(DATA), Clock())
    outcome: list[Any] = []
    sender.deferred.addBoth(outcome.append)
    sender.start()
    sender.stopProducing()
    assert transport.producer is None and len(outcome) == 1
    assert outcome[0].check(Exception)


def test_only_a_plain_tcp_transport_gets_sendfile() -> None:
    class Channel:
        transport = StringTransport()

    class Req:
        channel = Channel()

    assert filesend._tcp_transport(Req()) is None


def test_a_plain_tcp_transport_of_twisted_gets_sendfile(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    from twisted.internet import tcp
    from twisted.internet.protocol import Protocol

    class Port:
        _realPortNumber = 1

    class Reactor:
        def addReader(self, reader: Any) -> None:
            pass

    port: Any = Port()
    reactor: Any = Reactor()
    protocol: Any = Protocol()
    server = tcp.Server(pair[0], protocol, ("127.0.0.1", 1), port, 1, reactor)

    class Channel:
        transport = server

    class Req:
        channel = Channel()

    assert filesend._tcp_transport(Req()) is server
    assert filesend._transport_idle(server)


class StoppingRequest:
    """A request on a transport sendfile cannot use, whose peer stops reading at once."""

    chunked = False
    method = b"GET"
    code = 200
    channel = None

    def __init__(self) -> None:
        self.finished = False

    def write(self, data: bytes) -> None:
        pass

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        producer.stopProducing()

    def unregisterProducer(self) -> None:
        pass

    def finish(self) -> None:
        self.finished = True


async def test_a_send_the_peer_stops_is_logged_and_not_finished(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "asset.bin"
    path.write_bytes(DATA)
    request = StoppingRequest()

    with caplog.at_level(logging.WARNING, logger="proxy.edge.filesend"):
        await asyncio.wait_for(filesend.send_path(request, {"path": str(path)}), 5)

    assert not request.finished
    assert f"sending {path} ({len(DATA)} bytes from 0) stopped" in caplog.text
