"""The rules behind failover, on real loopback sockets and injectable clocks.

- Only a request that never reached its target counts as not sent (retried once elsewhere):
  a refused connection, or one reset while the request was still being written. One that was
  read whole and then cut off is not.
- A forward is cut when its node stops answering only after hearing nothing for the deadline.
- Shutdown's drain waits for every request in flight.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import aiohttp

from proxy.forwarding.faults import SentBody, backend_gone, never_sent
from proxy.forwarding.inflight import Forwards, Requests

WAIT_SECS = 10.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def _post(port: int, data: bytes) -> tuple[BaseException, SentBody]:
    body = SentBody(data)
    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(f"http://127.0.0.1:{port}/x", data=body) as resp:
                await resp.read()
        except aiohttp.ClientError as exc:
            return exc, body
    raise AssertionError("the request was expected to fail")


async def test_a_refused_connection_was_never_sent() -> None:
    exc, body = await asyncio.wait_for(_post(_closed_port(), b"{}"), WAIT_SECS)
    assert isinstance(exc, aiohttp.ClientConnectorError)
    assert never_sent(exc, body) and never_sent(exc)


async def test_a_request_read_whole_and_then_cut_off_counts_as_sent() -> None:
    body = b'{"model": "m"}'
    got = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"content-length: %d" % len(body) in head.lower()
        await reader.readexactly(len(body))
        got.set()
        writer.close()  # it may have run: the connection closes without an answer

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        exc, sent = await asyncio.wait_for(_post(port, body), WAIT_SECS)
    assert got.is_set() and sent.written
    assert isinstance(exc, aiohttp.ServerDisconnectedError)
    assert not never_sent(exc, sent)


async def test_a_connection_reset_while_the_body_is_written_was_never_sent() -> None:
    # Far more than the socket buffers hold: the client is still writing when the reset comes.
    body = b"x" * (64 * 1024 * 1024)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        sock = writer.get_extra_info("socket")
        # Linger 0: close with a reset, as a process killed mid-read does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        exc, sent = await asyncio.wait_for(_post(port, body), WAIT_SECS)
    assert isinstance(exc, aiohttp.ClientOSError)
    assert not sent.written
    assert never_sent(exc, sent)


async def test_only_a_refused_connection_or_an_exited_process_means_the_backend_is_gone() -> None:
    refused, _ = await asyncio.wait_for(_post(_closed_port(), b"{}"), WAIT_SECS)
    assert backend_gone(refused, died=False)
    # A pooled connection reset under the request, its backend still running: retried, the
    # backend kept.
    reset = aiohttp.ClientOSError(104, "Connection reset by peer")
    assert not backend_gone(reset, died=False)
    assert not backend_gone(aiohttp.ServerDisconnectedError(), died=False)
    assert backend_gone(reset, died=True)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_forward_is_cut_only_once_silent_for_the_whole_deadline() -> None:
    clock = Clock()
    forwards = Forwards(clock=clock)
    hold = asyncio.Event()
    fwds = []

    async def forwarded(node_id: str) -> None:
        fwds.append(forwards.begin(node_id))
        await hold.wait()

    silent = asyncio.ensure_future(forwarded("s1"))
    talking = asyncio.ensure_future(forwarded("s1"))
    other_node = asyncio.ensure_future(forwarded("s2"))
    await asyncio.sleep(0)
    clock.now += 3.0
    fwds[1].heard_at = clock.now - 2.999  # heard from just inside the deadline
    assert forwards.cut_silent("s1", 3.0, "missed its poll") == 1
    await asyncio.sleep(0)
    assert silent.cancelled() and fwds[0].cut == "missed its poll"
    assert not talking.done() and not other_node.done()
    hold.set()
    await asyncio.wait_for(asyncio.gather(talking, other_node), WAIT_SECS)


async def test_a_stopping_node_cuts_every_forward_once_and_says_why() -> None:
    forwards = Forwards(clock=Clock())
    fwds = []

    async def forwarded(node_id: str) -> None:
        fwds.append(forwards.begin(node_id))
        await asyncio.Event().wait()

    tasks = [asyncio.ensure_future(forwarded(n)) for n in ("s1", "s1", "s2")]
    await asyncio.sleep(0)
    assert forwards.cut_all("stopping") == 3
    assert forwards.cut_all("stopping") == 0
    await asyncio.wait(tasks, timeout=WAIT_SECS)
    assert all(task.cancelled() for task in tasks)
    assert all(fwd.cut == "stopping" and fwd.stopping for fwd in fwds)


async def test_the_drain_waits_for_the_last_request() -> None:
    requests = Requests()
    requests.begin()
    requests.begin()
    drained = asyncio.ensure_future(requests.wait_idle())
    requests.end()
    await asyncio.sleep(0)
    assert not drained.done()
    requests.end()
    await asyncio.wait_for(drained, WAIT_SECS)
    assert requests.count == 0


def test_never_sent_names_only_failures_before_the_body_was_handed_over() -> None:
    key = aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None)
    assert never_sent(aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused")))
    unwritten, written = SentBody(b"{}"), SentBody(b"{}")
    written.written = True
    for cut in (aiohttp.ServerDisconnectedError(), aiohttp.ClientOSError(104, "reset")):
        assert never_sent(cut, unwritten)
        assert not never_sent(cut, written)
        assert not never_sent(cut)
    assert not never_sent(TimeoutError(), unwritten)
