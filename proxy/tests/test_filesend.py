"""`http.response.pathsend` (proxy/edge/filesend.py) served by uvicorn's own HttpToolsProtocol
over real sockets on 127.0.0.1, with PathCycle as the cycle uvicorn builds for each request.

Every test runs on asyncio's default loop and on uvloop (the router's), each in a loop of its
own (asyncio.Runner), and most of them both ways a span can leave: by sendfile, and in blocks
through the transport (the way of a TLS connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import trustme
import uvicorn
import uvloop
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.edge import filesend
from proxy.edge.filesend import EXTENSION, PathCycle

DATA = bytes(range(256)) * 12_000  # ~3 MB: more than a socket takes at once
BIG = 64 * 1024 * 1024
# A guard against a hang, far beyond any run: the tests wait on conditions, never on time.
SCENARIO_SECONDS = 60

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_factory(request: pytest.FixtureRequest) -> LoopFactory:
    return asyncio.new_event_loop if request.param == "asyncio" else uvloop.new_event_loop


@pytest.fixture(params=["sendfile", "blocks"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "blocks":
        # As on a TLS connection: no socket sendfile may write to.
        monkeypatch.setattr(filesend, "_plain_socket", lambda transport: None)
    return str(request.param)


@pytest.fixture(autouse=True)
def path_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    # uvicorn builds each request's cycle from this module global: swapped, the cycles are
    # PathCycles constructed by uvicorn itself, with the arguments it gives.
    monkeypatch.setattr(httptools_impl, "RequestResponseCycle", PathCycle)


@pytest.fixture
def by_sendfile(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes each transfer sent by sendfile."""
    sent: list[int] = []
    original = PathCycle._sendfile

    async def spy(self: PathCycle, fd: int, offset: int, length: int) -> int:
        done = await original(self, fd, offset, length)
        sent.append(done)
        return done

    monkeypatch.setattr(PathCycle, "_sendfile", spy)
    return sent


@dataclass
class Waits:
    """How often the sender waited for the socket (sendfile) or the transport (blocks)."""

    count: int = 0
    began: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
def sender_waits(monkeypatch: pytest.MonkeyPatch) -> Waits:
    waits = Waits()
    writable = PathCycle._writable
    drain = FlowControl.drain

    async def on_socket(self: PathCycle, fd: int) -> None:
        waits.count += 1
        waits.began.set()
        await writable(self, fd)

    async def on_transport(self: FlowControl) -> None:
        waits.count += 1
        waits.began.set()
        await drain(self)

    monkeypatch.setattr(PathCycle, "_writable", on_socket)
    monkeypatch.setattr(FlowControl, "drain", on_transport)
    return waits


def run(
    loop_factory: LoopFactory,
    scenario: Callable[[], Coroutine[Any, Any, None]],
    seconds: float = SCENARIO_SECONDS,
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(scenario(), seconds))


@dataclass
class App:
    """Answers /file?offset=&length=&status= with start + pathsend of `path`, and /text with a
    plain body; records how each pathsend ended."""

    path: Path
    claimed: int | None = None  # the span's length to announce, whatever the file holds
    padding: int = 0  # bytes of an x-padding header, to make the head as large as wanted
    gate: asyncio.Event | None = None  # awaited between the start and the pathsend
    ended: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert EXTENSION in scope["extensions"]
        if scope["path"] == "/text":
            headers = [(b"content-length", b"2")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        query = {k: int(v[0]) for k, v in parse_qs(scope["query_string"].decode()).items()}
        offset = query.get("offset", 0)
        length = query.get("length", self.claimed or self.path.stat().st_size - offset)
        # Without a content-length uvicorn frames the response in chunks.
        headers = [] if query.get("chunked") else [(b"content-length", str(length).encode())]
        if self.padding:
            headers.append((b"x-padding", b"p" * self.padding))
        status = query.get("status", 200)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if self.gate is not None:
            await self.gate.wait()
        message = {"type": EXTENSION, "path": str(self.path), "offset": offset, "length": length}
        try:
            await send(message)
        except BaseException as exc:
            self.ended.append(f"raised {exc!r}")
            raise
        else:
            self.ended.append("returned")
        finally:
            self.done.set()


@dataclass
class Served:
    family: socket.AddressFamily
    address: Any  # (host, port) of a TCP listener, the path of a Unix one
    state: ServerState

    @property
    def port(self) -> int:
        return int(self.address[1])

    def transport(self) -> asyncio.Transport:
        (protocol,) = self.state.connections
        assert isinstance(protocol, HttpToolsProtocol)
        return protocol.transport


@contextlib.asynccontextmanager
async def serve(
    app: Callable[..., Awaitable[None]],
    sndbuf: int | None = None,
    tls: ssl.SSLContext | None = None,
    unix: Path | None = None,
) -> AsyncIterator[Served]:
    """uvicorn's HttpToolsProtocol on 127.0.0.1 (or a Unix socket), driven by our own
    create_server, as the node drives it."""
    config = uvicorn.Config(app, log_config=None, lifespan="off", proxy_headers=False)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_UNIX if unix is not None else socket.AF_INET)
    listener.bind(str(unix) if unix is not None else ("127.0.0.1", 0))

    def factory() -> HttpToolsProtocol:
        protocol = HttpToolsProtocol(config, state, {}, _loop=loop)
        if sndbuf is not None:
            # A small send buffer makes the server wait on the socket often.
            made = protocol.connection_made

            def connection_made(transport: asyncio.Transport) -> None:
                sock = transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
                made(transport)

            protocol.connection_made = connection_made  # type: ignore[method-assign]
        return protocol

    if unix is not None:
        server = await loop.create_unix_server(factory, sock=listener)
    else:
        server = await loop.create_server(factory, sock=listener, ssl=tls)
    try:
        yield Served(listener.family, listener.getsockname(), state)
    finally:
        server.close()
        for protocol in list(state.connections):
            assert isinstance(protocol, HttpToolsProtocol)
            protocol.transport.close()
        await server.wait_closed()
        if state.tasks:
            # With the connections closed every cycle ends; one that does not is a failure, and
            # must not hang the teardown of the test that found it.
            _, stuck = await asyncio.wait(state.tasks, timeout=SCENARIO_SECONDS / 4)
            for task in stuck:
                task.cancel()
            assert not stuck, "a request's task outlived its connection"


class Client:
    """A raw HTTP/1.1 client on a non-blocking socket: it reads only when told to."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.closed = False

    @classmethod
    async def connect(cls, served: Served, rcvbuf: int | None = None) -> Client:
        sock = socket.socket(served.family)
        sock.setblocking(False)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await asyncio.get_running_loop().sock_connect(sock, served.address)
        return cls(sock)

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def fill(self, size: int = 1 << 20) -> bool:
        """Read once; False at the end of the connection (a reset counts as one)."""
        try:
            chunk = await asyncio.get_running_loop().sock_recv(self.sock, size)
        except ConnectionResetError:
            chunk = b""
        self.closed = not chunk
        self.buf += chunk
        return bool(chunk)

    def read_now(self) -> int:
        """Read what the socket holds without a turn of the loop; return the bytes read."""
        before = len(self.buf)
        with contextlib.suppress(BlockingIOError):
            while chunk := self.sock.recv(1 << 20):
                self.buf += chunk
        return len(self.buf) - before

    async def head(self) -> tuple[int, dict[bytes, bytes]]:
        while b"\r\n\r\n" not in self.buf:
            if not await self.fill():
                raise EOFError(bytes(self.buf))
        raw, _, rest = bytes(self.buf).partition(b"\r\n\r\n")
        self.buf = bytearray(rest)
        status_line, *lines = raw.split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines)
        return int(status_line.split()[1]), headers

    async def body(self, size: int) -> bytes:
        """Up to `size` bytes: fewer only if the connection ends first."""
        while len(self.buf) < size and await self.fill():
            pass
        got, self.buf = bytes(self.buf[:size]), self.buf[size:]
        return got

    async def at_end(self) -> bool:
        """The connection ends with nothing more on it."""
        while await self.fill():
            pass
        return not self.buf

    async def chunked(self) -> bytes:
        """A chunked body, unframed."""
        body = bytearray()
        while True:
            while b"\r\n" not in self.buf:
                assert await self.fill()
            size_line, _, rest = bytes(self.buf).partition(b"\r\n")
            self.buf = bytearray(rest)
            size = int(size_line, 16)
            chunk = await self.body(size + 2)
            assert chunk.endswith(b"\r\n")
            body += chunk[:-2]
            if size == 0:
                return bytes(body)

    def close(self) -> None:
        self.sock.close()


def get(target: str, method: str = "GET") -> bytes:
    return f"{method} {target} HTTP/1.1\r\nhost: test\r\n\r\n".encode()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def sparse(path: Path, size: int, tail: bytes = b"the end") -> Path:
    """`size` bytes of zeros (a hole, nothing on disk) ending in `tail`."""
    with path.open("wb") as handle:
        handle.truncate(size - len(tail))
        handle.seek(size - len(tail))
        handle.write(tail)
    return path


def test_the_whole_file_arrives_byte_for_byte(
    loop_factory: LoopFactory, mode: str, by_sendfile: list[int], tmp_path: Path
) -> None:
    app = App(write(tmp_path / "asset.bin", DATA))

    async def scenario() -> None:
        async with serve(app) as served:
            client = await Client.connect(served)
            await client.send(get("/file"))
            status, headers = await client.head()
            assert (status, headers[b"content-length"]) == (200, str(len(DATA)).encode())
            assert await client.body(len(DATA)) == DATA
            client.close()
            await app.done.wait()

    run(loop_factory, scenario)
    assert app.ended == ["returned"]
    assert by_sendfile == ([len(DATA)] if mode == "sendfile" else [0])


def test_a_byte_range_arrives_byte_for_byte(
    loop_factory: LoopFactory, mode: str, by_sendfile: list[int], tmp_path: Path
) -> None:
    app = App(write(tmp_path / "asset.bin", DATA))
    first, length = 1000, len(DATA) - 5000

    async def scenario() -> None:
        async with serve(app) as served:
            client = await Client.connect(served)
            target = f"/file?offset={first}&length={length}&status=206"
            await client.send(get(target) + get("/text"))
            status, headers = await client.head()
            assert (status, headers[b"content-length"]) == (206, str(length).encode())
            assert await client.body(length) == DATA[first : first + length]
            # Not a byte more: the next answer follows at once.
            assert await client.head() == (200, {b"content-length": b"2"})
            client.close()

    run(loop_factory, scenario)
    assert by_sendfile == ([length] if mode == "sendfile" else [0])


def test_a_slow_reader_of_a_big_file_holds_at_most_one_block_in_the_server(
    loop_factory: LoopFactory,
    mode: str,
    by_sendfile: list[int],
    sender_waits: Waits,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = App(sparse(tmp_path / "big.bin", BIG))
    samples: list[int] = []
    # The transport's buffer each time the sender reads a block (blocks only).
    at_read: list[int] = []
    watched: list[asyncio.Transport] = []
    pread = os.pread

    def watched_pread(fd: int, size: int, offset: int) -> bytes:
        if watched:
            at_read.append(watched[0].get_write_buffer_size())
        return pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", watched_pread)

    async def scenario() -> None:
        async with serve(app, sndbuf=64 * 1024) as served:
            client = await Client.connect(served, rcvbuf=64 * 1024)
            await client.send(get("/file"))
            await client.head()
            transport = served.transport()
            watched.append(transport)
            received = len(client.buf)
            client.buf.clear()
            # The reader takes 16 KiB at a time, the server's buffer sampled before each read:
            # there the server has written all it could and waits for the reader.
            while received < BIG:
                samples.append(transport.get_write_buffer_size())
                assert await client.fill(16 * 1024)
                received += len(client.buf)
                tail = bytes(client.buf[-7:])
                client.buf.clear()
            assert received == BIG and tail == b"the end"
            client.close()

    run(loop_factory, scenario)
    assert app.ended == ["returned"]
    assert max(samples) <= filesend.BLOCK_BYTES + HIGH_WATER_LIMIT
    if mode == "sendfile":
        # Page cache to socket: the body never passes through the transport's buffer.
        assert max(samples) == 0 and by_sendfile == [BIG]
    else:
        # The transport did hold a block and paused the sender: the bound was reached.
        assert max(samples) > HIGH_WATER_LIMIT and by_sendfile == [0]
        # A block is read only once the last has drained: the one in memory is the one sent.
        assert at_read and max(at_read) <= HIGH_WATER_LIMIT
    # The sender did wait for the reader, again and again (blocks: about once a block).
    assert sender_waits.count > BIG // filesend.BLOCK_BYTES // 2


def test_the_span_waits_for_a_head_still_in_the_transport_buffer(
    loop_factory: LoopFactory, mode: str, by_sendfile: list[int], tmp_path: Path
) -> None:
    # A head larger than the socket takes, smaller than the transport's high-water mark: the
    # rest of it waits in the transport's buffer, the protocol not paused. The app sends the
    # pathsend once the client has read what the socket had, so the socket has room before the
    # transport has had a turn to fill it: bytes sent straight to the socket then would overtake
    # the rest of the head.
    padding = HIGH_WATER_LIMIT // 2
    app = App(write(tmp_path / "asset.bin", DATA), padding=padding, gate=asyncio.Event())

    async def scenario() -> None:
        # A Unix socket: what the client reads leaves the sender's socket at once.
        async with serve(app, sndbuf=4096, unix=tmp_path / "node.sock") as served:
            client = await Client.connect(served)
            await client.send(get("/file") + get("/text"))
            assert await client.fill(1024)  # the head has begun; the socket holds more
            assert 0 < served.transport().get_write_buffer_size() < HIGH_WATER_LIMIT
            assert app.gate is not None
            app.gate.set()
            # Room in the socket now, before the loop turns: the app's pathsend comes first (on
            # asyncio's loop; uvloop happens to give the transport its turn before the app's).
            assert client.read_now() > 0
            _, headers = await client.head()
            assert headers[b"x-padding"] == b"p" * padding
            assert await client.body(len(DATA)) == DATA
            assert await client.head() == (200, {b"content-length": b"2"})
            client.close()

    run(loop_factory, scenario)
    assert app.ended == ["returned"]
    assert by_sendfile == ([len(DATA)] if mode == "sendfile" else [0])


def test_a_response_without_content_length_gets_the_span_in_chunks(
    loop_factory: LoopFactory, by_sendfile: list[int], tmp_path: Path
) -> None:
    app = App(write(tmp_path / "asset.bin", DATA))

    async def scenario() -> None:
        async with serve(app) as served:
            client = await Client.connect(served)
            await client.send(get("/file?offset=3&chunked=1") + get("/text"))
            status, headers = await client.head()
            assert (status, headers[b"transfer-encoding"]) == (200, b"chunked")
            assert await client.chunked() == DATA[3:]
            assert await client.head() == (200, {b"content-length": b"2"})
            client.close()

    run(loop_factory, scenario)
    assert app.ended == ["returned"] and by_sendfile == []


def test_the_next_request_on_the_connection_is_answered_after_a_pathsend(
    loop_factory: LoopFactory, mode: str, tmp_path: Path
) -> None:
    app = App(write(tmp_path / "asset.bin", DATA))

    async def scenario() -> None:
        async with serve(app) as served:
            client = await Client.connect(served)
            # Pipelined: the second request waits in uvicorn's queue while the file goes out.
            await client.send(get("/file") + get("/file?offset=7&length=9") + get("/text"))
            assert (await client.head())[0] == 200
            assert await client.body(len(DATA)) == DATA
            assert (await client.head())[0] == 200
            assert await client.body(9) == DATA[7:16]
            assert (await client.head())[0] == 200
            assert await client.body(2) == b"ok"
            # Still open: one more, sent after all the answers came.
            await client.send(get("/text"))
            assert await client.head() == (200, {b"content-length": b"2"})
            assert await client.body(2) == b"ok"
            client.close()

    run(loop_factory, scenario)
    assert app.ended == ["returned", "returned"]


def test_a_file_shorter_than_its_span_drops_the_connection(
    loop_factory: LoopFactory, mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "asset.bin", DATA)
    app = App(path, claimed=len(DATA) + 10)

    async def scenario() -> None:
        async with serve(app) as served:
            client = await Client.connect(served)
            await client.send(get("/file") + get("/text"))
            _, headers = await client.head()
            assert headers[b"content-length"] == str(len(DATA) + 10).encode()
            # All the file had, then the end of the connection: never a whole response, and
            # never the answer to the request behind it.
            assert await client.body(len(DATA) + 10) == DATA
            assert client.closed
            client.close()
            await app.done.wait()

    with caplog.at_level(logging.WARNING, logger="proxy.edge.filesend"):
        run(loop_factory, scenario)
    assert app.ended == ["returned"]
    assert f"sending {path} ({len(DATA) + 10} bytes from 0) stopped: " in caplog.text
    assert "shorter than the span" in caplog.text
    # Dropped by the cycle itself: uvicorn did not have to step in for a response left unfinished.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_peer_gone_mid_transfer_ends_the_send_and_is_logged(
    loop_factory: LoopFactory, mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = sparse(tmp_path / "big.bin", BIG)
    app = App(path)

    async def scenario() -> None:
        async with serve(app, sndbuf=64 * 1024) as served:
            client = await Client.connect(served, rcvbuf=64 * 1024)
            await client.send(get("/file"))
            await client.head()
            assert await client.fill(16 * 1024)
            # Unread bytes in its buffer: closing resets the connection at once.
            client.close()
            await app.done.wait()

    with caplog.at_level(logging.WARNING, logger="proxy.edge.filesend"):
        run(loop_factory, scenario)
    assert app.ended == ["returned"]  # no exception out of send
    assert f"sending {path} ({BIG} bytes from 0) stopped: " in caplog.text


def test_a_connection_closed_by_the_server_mid_transfer_ends_the_send(
    loop_factory: LoopFactory,
    mode: str,
    sender_waits: Waits,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = sparse(tmp_path / "big.bin", BIG)
    app = App(path)

    async def scenario() -> None:
        # A Unix socket: unlike TCP on loopback (bytes in flight land in the peer's buffer a
        # little later, and the sender's socket turns writable), nothing but a read by the
        # peer makes room in it, so only the close can wake the waiting sender.
        async with serve(app, sndbuf=64 * 1024, unix=tmp_path / "node.sock") as served:
            client = await Client.connect(served, rcvbuf=64 * 1024)
            await client.send(get("/file"))
            # The client reads nothing: the sender fills the socket, then waits for it...
            await sender_waits.began.wait()
            # ...until the server drops the connection (a shutdown, a front-door rule): the
            # send ends at once, without a byte read by the peer to wake it.
            served.transport().abort()
            await app.done.wait()
            # And the socket is closed for real: the transfer held no descriptor of it open.
            await client.at_end()
            assert client.closed
            client.close()

    with caplog.at_level(logging.WARNING, logger="proxy.edge.filesend"):
        run(loop_factory, scenario, seconds=15)  # a hang is the failure here
    assert app.ended == ["returned"]
    assert f"sending {path} ({BIG} bytes from 0) stopped: the connection is closed" in caplog.text


@pytest.mark.parametrize(("method", "status"), [("HEAD", 200), ("GET", 204), ("GET", 304)])
def test_no_body_goes_out_for_head_204_and_304(
    loop_factory: LoopFactory, tmp_path: Path, method: str, status: int
) -> None:
    app = App(write(tmp_path / "asset.bin", DATA))

    async def scenario() -> None:
        async with serve(app) as served:
            client = await Client.connect(served)
            await client.send(get(f"/file?status={status}", method) + get("/text"))
            assert await client.head() == (status, {b"content-length": str(len(DATA)).encode()})
            # The very next bytes are the next answer: not one byte of the file came before.
            assert await client.head() == (200, {b"content-length": b"2"})
            assert await client.body(2) == b"ok"
            client.close()

    run(loop_factory, scenario)
    assert app.ended == ["returned"]


def test_one_loop_turn_sends_at_most_the_turn_budget(
    loop_factory: LoopFactory, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = 256 * 1024
    monkeypatch.setattr(filesend, "SENDFILE_TURN_BYTES", budget)
    monkeypatch.setattr(filesend, "BLOCK_BYTES", 64 * 1024)
    app = App(sparse(tmp_path / "big.bin", 16 * 1024 * 1024))
    turn = [0]
    per_turn: defaultdict[int, int] = defaultdict(int)

    def spied(call: Callable[..., Any], size: Callable[[Any], int]) -> Callable[..., Any]:
        def spy(*args: Any) -> Any:
            result = call(*args)
            per_turn[turn[0]] += size(result)
            return result

        return spy

    monkeypatch.setattr(os, "sendfile", spied(os.sendfile, int))
    monkeypatch.setattr(os, "pread", spied(os.pread, len))

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0)  # counts the loop's turns, nothing else
            turn[0] += 1

    async def scenario() -> None:
        ticking = asyncio.create_task(ticker())
        async with serve(app, sndbuf=8 * 1024 * 1024) as served:
            client = await Client.connect(served, rcvbuf=8 * 1024 * 1024)
            await client.send(get("/file"))
            await client.head()
            body = await client.body(16 * 1024 * 1024)
            assert len(body) == 16 * 1024 * 1024 and body.endswith(b"the end")
            client.close()
        ticking.cancel()

    run(loop_factory, scenario)
    assert app.ended == ["returned"]
    # A fast reader: some turns went as far as the budget, none further.
    assert max(per_turn.values()) == budget


def test_a_tls_connection_gets_blocks_never_the_raw_socket(
    loop_factory: LoopFactory, by_sendfile: list[int], tmp_path: Path
) -> None:
    app = App(write(tmp_path / "asset.bin", DATA))
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)

    async def scenario() -> None:
        async with serve(app, tls=server_context) as served:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", served.port, ssl=client_context, server_hostname="127.0.0.1"
            )
            writer.write(get("/file") + get("/text"))
            head = await reader.readuntil(b"\r\n\r\n")
            assert f"content-length: {len(DATA)}".encode() in head
            assert await reader.readexactly(len(DATA)) == DATA
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
            assert await reader.readexactly(2) == b"ok"
            writer.close()

    run(loop_factory, scenario)
    assert app.ended == ["returned"] and by_sendfile == [0]


def test_the_scope_advertises_the_extension(tmp_path: Path) -> None:
    scopes: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scopes.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def scenario() -> None:
        async with serve(app) as served:
            client = await Client.connect(served)
            await client.send(get("/"))
            await client.head()
            client.close()

    run(asyncio.new_event_loop, scenario)
    assert scopes[0]["extensions"] == {EXTENSION: {}}
