"""Copying one asset from a peer or the hub into the shared dir, verified (reference §7.3).

A peer's path is never opened here: only bytes that hash to the reference are kept. The copy
lands in a `.partial` file, resumable, and is installed under its name once its size and hash
are checked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import itertools
import logging
import mmap
import os
import ssl
import stat
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.assets.partial import DIRECT_ALIGN, PartialFile
from registry.assets.store import (
    COPY_BLOCK_BYTES,
    SOURCE_PEER,
    AssetError,
    ensure_asset_dir,
    in_db,
    index_add,
    unlink,
)
from registry.hashing import FileHasher
from registry.hforigin import SOURCE_HF, HfOrigin, OriginMismatch
from registry.nodeclient import NodeCallError, normalize_base_url
from registry.ports import ClusterMember

logger = logging.getLogger(__name__)

STREAM_PREFIX = "/router/v1/node/assets/"
# The largest asset a peer may announce; a size beyond it is refused before any byte moves.
MAX_ASSET_BYTES = 1 << 40
# aiohttp's read buffer for a transfer: it pauses the socket at twice this much unread, which
# bounds the memory a copy holds while its last block is being written.
READ_BUFFER_BYTES = 1024 * 1024
PARTIAL_SUFFIX = ".partial"


@dataclass
class Transfer:
    """A running or finished pull of one hash from a peer (shown by the jobs routes)."""

    sha256: str
    filename: str
    node_url: str
    size: int
    done: int = 0
    resumed_from: int = 0
    state: str = "running"
    error: str = ""
    hf: HfOrigin | None = None
    """Set when the bytes come from a Hugging Face hub rather than a peer."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "filename": self.filename,
            "node_url": self.node_url,
            "bytes_total": self.size,
            "bytes_done": self.done,
            "resumed_from": self.resumed_from,
            "state": self.state,
            "error": self.error,
        }


class Puller:
    """The node's transfers: a few at a time, each from a peer or a hub into the shared dir."""

    def __init__(
        self, node: ClusterMember, shared_dir: Path, hasher: FileHasher, slots: int
    ) -> None:
        self.node = node
        self.shared_dir = shared_dir
        self.hasher = hasher
        self._slots = asyncio.Semaphore(slots)
        self.transfers: dict[str, Transfer] = {}

    async def pull(self, sha256: str, filename: str, source: Mapping[str, Any]) -> Path:
        """Stream one asset from a peer into the shared dir, verified (reference §7.3)."""
        size = source.get("size")
        url = source.get("node_url")
        # A source may hold the same bytes under another name; the reference's name is kept.
        if source.get("sha256") != sha256:
            raise AssetError("the source reports another hash")
        if not isinstance(url, str) or self.node.client is None:
            raise AssetError("no usable source URL")
        try:
            self.node.client.allow.add(normalize_base_url(url))
        except ValueError as exc:
            raise AssetError(f"invalid source URL {url!r}") from exc
        return await self._fetch(Transfer(sha256, filename, url, _size(size)), SOURCE_PEER)

    async def pull_hf(self, sha256: str, filename: str, origin: HfOrigin) -> Path:
        """Download one asset from its hub origin, once the hub vouches for the hash there."""
        from registry import hforigin

        try:
            size = await asyncio.to_thread(hforigin.verify, origin, sha256)
        except OriginMismatch as exc:
            raise AssetError(str(exc)) from exc
        transfer = Transfer(sha256, filename, origin.uri, _size(size), hf=origin)
        return await self._fetch(transfer, SOURCE_HF)

    async def _fetch(self, transfer: Transfer, source: str) -> Path:
        async with self._slots:
            self.transfers[transfer.sha256] = transfer
            try:
                path = await self._copy(transfer)
            except AssetError as exc:
                transfer.state, transfer.error = "failed", str(exc)
                raise
            except NodeCallError as exc:
                transfer.state, transfer.error = "failed", str(exc)
                raise AssetError(f"transfer failed: {exc}") from exc
            transfer.state = "done"
        await in_db(index_add, transfer.sha256, transfer.filename, transfer.size, path, source)
        return path

    async def _copy(self, transfer: Transfer) -> Path:
        sha256, size = transfer.sha256, transfer.size
        directory = await asyncio.to_thread(ensure_asset_dir, self.shared_dir, sha256)
        target = directory / transfer.filename
        partial = directory / (transfer.filename + PARTIAL_SUFFIX)
        writer = await asyncio.to_thread(PartialFile.open, partial, size)
        try:
            transfer.resumed_from = transfer.done = writer.offset
            if writer.offset < size or size == 0:
                await self._receive(transfer, writer)
            await asyncio.to_thread(writer.finish)
        finally:
            await asyncio.to_thread(writer.close)
        if writer.offset != size:
            raise AssetError(f"the source sent {writer.offset} of {size} bytes")
        if writer.digest.hexdigest() != sha256:
            await asyncio.to_thread(unlink, partial)
            raise AssetError(
                f"the bytes received hash to {writer.digest.hexdigest()}, not {sha256}; "
                "the partial file was deleted"
            )

        def install() -> None:
            try:
                if stat.S_ISLNK(os.lstat(target).st_mode):
                    raise AssetError(f"{target} is a symlink; refusing to replace it")
            except FileNotFoundError:
                pass
            os.replace(partial, target)
            # Every byte was hashed as it arrived: the config that names the file must not read
            # the whole file again to learn what is already known.
            self.hasher.remember(target, sha256)
            self.hasher.save()

        await asyncio.to_thread(install)
        return target

    async def _receive(self, transfer: Transfer, writer: PartialFile) -> None:
        import aiohttp

        from registry.httpclient import get_session

        headers = {"Accept-Encoding": "identity"}
        if transfer.hf is not None:
            from registry.hforigin import download_url

            # A hub sends LFS files from elsewhere (a redirect); no cluster token goes there.
            url, redirects = download_url(transfer.hf), True
        else:
            client = self.node.client
            assert client is not None
            # The node client's allow-list decides where the token may go; the bytes then flow
            # through the process's aiohttp pool, which reads them with far less overhead.
            url = client.checked_url(transfer.node_url, STREAM_PREFIX + transfer.sha256)
            headers["Authorization"] = client.authorization
            redirects = False
        if writer.offset > 0:
            headers["Range"] = f"bytes={writer.offset}-"
        if transfer.hf is None:
            await self._pull_from_peer(transfer, writer, url, headers)
            return
        try:
            async with get_session().get(
                url,
                headers=headers,
                allow_redirects=redirects,
                read_bufsize=READ_BUFFER_BYTES,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self.node.config.cluster.control_timeout,
                    sock_read=self.node.config.cluster.control_timeout,
                ),
            ) as response:
                await self._take_body(transfer, writer, response)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AssetError(f"transfer from {transfer.node_url} broke off: {exc!r}") from exc

    async def _pull_from_peer(
        self, transfer: Transfer, writer: PartialFile, url: str, headers: dict[str, str]
    ) -> None:
        stop = threading.Event()
        timeout = self.node.config.cluster.control_timeout
        client = self.node.client
        tls = client.ssl if client is not None else True
        context = tls if isinstance(tls, ssl.SSLContext) else None
        pull = asyncio.ensure_future(
            asyncio.to_thread(pull_blocking, url, headers, timeout, transfer, writer, stop, context)
        )
        try:
            await asyncio.shield(pull)
        except asyncio.CancelledError:
            # The partial file is closed by the caller: the thread must be done with it first.
            stop.set()
            try:
                await pull
            except Exception as exc:
                # Abandoned anyway; what the thread ended on still says why, in the log.
                logger.info("cancelled transfer from %s ended with %r", transfer.node_url, exc)
            raise

    async def _take_body(self, transfer: Transfer, writer: PartialFile, response: Any) -> None:
        if body_start(transfer, writer, response.status, response.headers.get("Content-Range")):
            await asyncio.to_thread(writer.restart)
            transfer.resumed_from = transfer.done = 0
        parts: list[bytes] = []
        pending = 0
        received = writer.offset
        # One block is hashed and written in a thread while the next one arrives: the two
        # halves of the copy overlap instead of taking turns.
        writing: asyncio.Future[None] | None = None
        try:
            async for chunk in response.content.iter_any():
                received += len(chunk)
                if received > transfer.size:
                    if writing is not None:
                        await writing
                        writing = None
                    await asyncio.to_thread(writer.discard)
                    raise AssetError(f"the source sent more than the {transfer.size} bytes")
                parts.append(chunk)
                pending += len(chunk)
                if pending >= COPY_BLOCK_BYTES:
                    if writing is not None:
                        await writing
                    transfer.done = writer.offset
                    writing = asyncio.ensure_future(asyncio.to_thread(writer.write_all, parts))
                    parts, pending = [], 0
        finally:
            # The partial file is never left with a write in flight, whatever broke the copy.
            if writing is not None:
                await writing
        if parts:
            await asyncio.to_thread(writer.write_all, parts)
        transfer.done = writer.offset


def body_start(
    transfer: Transfer, writer: PartialFile, status: int, content_range: str | None
) -> bool:
    """Check a source's answer to a pull before its body is taken; True when the partial file
    must start over (the source ignored the range and sends the whole file)."""
    if status == 206:
        expected = f"bytes {writer.offset}-{transfer.size - 1}/{transfer.size}"
        if content_range != expected:
            raise AssetError(
                f"the source answered Content-Range {content_range!r}, not {expected!r}"
            )
        return False
    if status == 200:
        # Start over rather than mix two bodies.
        return writer.offset > 0
    raise AssetError(f"the source answered {status}")


def _store_block(writer: PartialFile, block: memoryview, transfer: Transfer) -> None:
    writer.write(block, page_aligned=True)
    transfer.done = writer.offset


def pull_blocking(
    url: str,
    headers: Mapping[str, str],
    timeout: float,
    transfer: Transfer,
    writer: PartialFile,
    stop: threading.Event,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Take a peer's asset stream into the partial file, in the calling (worker) thread.

    A peer copy is one long sequential read: a plain blocking socket reading straight into one
    reused buffer, hashed and written from there, costs a fraction of the CPU that an event
    loop's per-chunk reads and copies do, and leaves the router's loop free meanwhile.
    """
    parts = urllib.parse.urlsplit(url)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        # The cluster's CA and client certificate, as for every other call to a node.
        connection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=ssl_context
        )
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request("GET", target, headers=dict(headers))
        response = connection.getresponse()
        if body_start(transfer, writer, response.status, response.getheader("Content-Range")):
            writer.restart()
            transfer.resumed_from = transfer.done = 0
        received = _read_body(response, transfer, writer, stop)
        if received > transfer.size:
            writer.discard()
            raise AssetError(f"the source sent more than the {transfer.size} bytes")
    except (OSError, http.client.HTTPException) as exc:
        raise AssetError(f"transfer from {transfer.node_url} broke off: {exc!r}") from exc
    finally:
        connection.close()
    if stop.is_set():
        raise AssetError(f"transfer from {transfer.node_url} was stopped")


def _read_body(
    response: http.client.HTTPResponse,
    transfer: Transfer,
    writer: PartialFile,
    stop: threading.Event,
) -> int:
    """Read the body into the partial file until it ends, `stop` is set or it runs past the
    transfer's size; the offset reached (beyond the size when the source sent too much)."""
    # Two buffers: one block is hashed and written by a second thread while the socket
    # fills the other, so the copy takes the longer of the two halves, not their sum.
    # Page-aligned (mmap) buffers, so that the writer can hand them to O_DIRECT.
    buffers = [mmap.mmap(-1, COPY_BLOCK_BYTES) for _ in range(2)]
    blocks = [memoryview(buffer) for buffer in buffers]
    received = writer.offset
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as storer:
            storing: concurrent.futures.Future[None] | None = None
            try:
                for turn in itertools.count():
                    if stop.is_set():
                        break
                    block = blocks[turn % 2]
                    # A resume from an unaligned offset reads a shorter first block, so that
                    # every later block starts on an aligned file offset.
                    want = COPY_BLOCK_BYTES - received % DIRECT_ALIGN
                    count = response.readinto(block[:want])
                    if not count:
                        break
                    received += count
                    if received > transfer.size:
                        break
                    if storing is not None:
                        storing.result()
                    storing = storer.submit(_store_block, writer, block[:count], transfer)
            finally:
                if storing is not None:
                    storing.result()
    finally:
        for view in blocks:
            view.release()
        for buffer in buffers:
            buffer.close()
    return received


def _size(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_ASSET_BYTES:
        raise AssetError(f"the source reports an invalid size {value!r}")
    return value
