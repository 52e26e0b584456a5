"""The peer pull (`pull_blocking`) against a real loopback HTTP server that answers as told:
what a source may send, and what makes the copy start over or stop."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from registry.assets.partial import DIRECT_ALIGN, PartialFile
from registry.assets.pull import Transfer, pull_blocking
from registry.assets.service import AssetService
from registry.assets.store import COPY_BLOCK_BYTES, AssetError
from registry.tests.conftest import Write
from routerproject.config import load_config

# Longer than two copy blocks, so both buffers of the pull take turns.
DATA = bytes(range(256)) * ((2 * COPY_BLOCK_BYTES + 12_345) // 256)
# Ends off the O_DIRECT alignment, so its last bytes must be written buffered.
ODD = DATA + b"tail"


@dataclass
class Source:
    """What the loopback source sends; `ranges` records the Range header of each request."""

    status: int = 200
    body: bytes = DATA
    content_range: str | None = None
    ranges: list[str | None] = field(default_factory=list)


@pytest.fixture
def source() -> Iterator[tuple[Source, str]]:
    told = Source()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            told.ranges.append(self.headers.get("Range"))
            self.send_response(told.status)
            self.send_header("Content-Length", str(len(told.body)))
            if told.content_range is not None:
                self.send_header("Content-Range", told.content_range)
            self.end_headers()
            # A pull that refuses the answer closes its end while the body is still going.
            with contextlib.suppress(ConnectionError):
                self.wfile.write(told.body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield told, f"http://127.0.0.1:{server.server_address[1]}/router/v1/node/assets/x"
    finally:
        server.shutdown()
        server.server_close()


def transfer_for(data: bytes) -> Transfer:
    return Transfer(
        sha256=hashlib.sha256(data).hexdigest(),
        filename="m.gguf",
        node_url="http://127.0.0.1",
        size=len(data),
    )


def pull(url: str, partial: Path, transfer: Transfer, stop: threading.Event | None = None) -> None:
    writer = PartialFile.open(partial, transfer.size)
    headers = {"Range": f"bytes={writer.offset}-"} if writer.offset else {}
    try:
        pull_blocking(url, headers, 5.0, transfer, writer, stop or threading.Event())
    finally:
        writer.close()
    assert writer.digest.hexdigest() == hashlib.sha256(partial.read_bytes()).hexdigest()


def test_a_whole_answer_is_written_and_counted(source: tuple[Source, str], tmp_path: Path) -> None:
    _, url = source
    transfer = transfer_for(DATA)
    pull(url, tmp_path / "m.partial", transfer)
    assert (tmp_path / "m.partial").read_bytes() == DATA
    assert transfer.done == len(DATA)


def test_a_resumed_pull_appends_the_range_it_asked_for(
    source: tuple[Source, str], tmp_path: Path
) -> None:
    told, url = source
    have = COPY_BLOCK_BYTES + 7
    (tmp_path / "m.partial").write_bytes(DATA[:have])
    told.status, told.body = 206, DATA[have:]
    told.content_range = f"bytes {have}-{len(DATA) - 1}/{len(DATA)}"
    pull(url, tmp_path / "m.partial", transfer_for(DATA))
    assert told.ranges == [f"bytes={have}-"]
    assert (tmp_path / "m.partial").read_bytes() == DATA


def test_a_range_answered_for_other_bytes_is_refused(
    source: tuple[Source, str], tmp_path: Path
) -> None:
    told, url = source
    have = 1000
    (tmp_path / "m.partial").write_bytes(DATA[:have])
    told.status, told.body = 206, DATA[have - 1 :]
    told.content_range = f"bytes {have - 1}-{len(DATA) - 1}/{len(DATA)}"
    with pytest.raises(AssetError, match="Content-Range"):
        pull(url, tmp_path / "m.partial", transfer_for(DATA))
    assert (tmp_path / "m.partial").read_bytes() == DATA[:have]


def test_a_source_that_ignores_the_range_starts_the_copy_over(
    source: tuple[Source, str], tmp_path: Path
) -> None:
    _, url = source
    (tmp_path / "m.partial").write_bytes(b"stale bytes that must not stay")
    transfer = transfer_for(DATA)
    pull(url, tmp_path / "m.partial", transfer)
    assert (tmp_path / "m.partial").read_bytes() == DATA
    assert transfer.resumed_from == 0


def test_a_source_sending_more_than_the_size_is_refused_and_the_partial_deleted(
    source: tuple[Source, str], tmp_path: Path
) -> None:
    told, url = source
    told.body = DATA + b"!"
    with pytest.raises(AssetError, match="more than"):
        pull(url, tmp_path / "m.partial", transfer_for(DATA))
    assert not (tmp_path / "m.partial").exists()


def test_an_error_status_is_refused(source: tuple[Source, str], tmp_path: Path) -> None:
    told, url = source
    told.status, told.body = 404, b"{}"
    with pytest.raises(AssetError, match="answered 404"):
        pull(url, tmp_path / "m.partial", transfer_for(DATA))


def test_a_stopped_pull_ends_with_an_error_not_a_short_file_taken_for_whole(
    source: tuple[Source, str], tmp_path: Path
) -> None:
    _, url = source
    stop = threading.Event()
    stop.set()
    with pytest.raises(AssetError, match="stopped"):
        pull(url, tmp_path / "m.partial", transfer_for(DATA), stop)


def test_a_pull_writes_its_whole_blocks_with_o_direct(
    source: tuple[Source, str], direct_dir: Path, writes: list[Write]
) -> None:
    told, url = source
    told.body = ODD
    pull(url, direct_dir / "m.partial", transfer_for(ODD))
    tail = len(ODD) - 2 * COPY_BLOCK_BYTES
    aligned = tail - tail % DIRECT_ALIGN
    assert writes == [
        (0, COPY_BLOCK_BYTES, True),
        (COPY_BLOCK_BYTES, COPY_BLOCK_BYTES, True),
        (2 * COPY_BLOCK_BYTES, aligned, True),
        (2 * COPY_BLOCK_BYTES + aligned, tail - aligned, False),
    ]
    assert (direct_dir / "m.partial").read_bytes() == ODD


def test_a_pull_resumed_off_alignment_reads_a_short_block_to_align_the_rest(
    source: tuple[Source, str], direct_dir: Path, writes: list[Write]
) -> None:
    told, url = source
    have = COPY_BLOCK_BYTES + 7
    (direct_dir / "m.partial").write_bytes(ODD[:have])
    told.status, told.body = 206, ODD[have:]
    told.content_range = f"bytes {have}-{len(ODD) - 1}/{len(ODD)}"
    pull(url, direct_dir / "m.partial", transfer_for(ODD))
    tail = len(ODD) - 2 * COPY_BLOCK_BYTES
    aligned = tail - tail % DIRECT_ALIGN
    assert writes == [
        (have, 2 * COPY_BLOCK_BYTES - have, False),
        (2 * COPY_BLOCK_BYTES, aligned, True),
        (2 * COPY_BLOCK_BYTES + aligned, tail - aligned, False),
    ]
    assert (direct_dir / "m.partial").read_bytes() == ODD


def test_a_source_that_keeps_sending_is_cut_off_before_a_byte_past_the_size_is_written(
    source: tuple[Source, str], tmp_path: Path, writes: list[Write]
) -> None:
    told, url = source
    told.body = DATA * 3
    with pytest.raises(AssetError, match="more than"):
        pull(url, tmp_path / "m.partial", transfer_for(DATA))
    assert writes and all(offset + length <= len(DATA) for offset, length, _ in writes)
    assert not (tmp_path / "m.partial").exists()


def test_a_resumed_range_longer_than_the_rest_of_the_file_is_cut_off_the_same_way(
    source: tuple[Source, str], tmp_path: Path, writes: list[Write]
) -> None:
    told, url = source
    have = COPY_BLOCK_BYTES + 7
    (tmp_path / "m.partial").write_bytes(DATA[:have])
    writes.clear()
    told.status, told.body = 206, DATA[have:] + DATA
    told.content_range = f"bytes {have}-{len(DATA) - 1}/{len(DATA)}"
    with pytest.raises(AssetError, match="more than"):
        pull(url, tmp_path / "m.partial", transfer_for(DATA))
    assert all(offset + length <= len(DATA) for offset, length, _ in writes)
    assert not (tmp_path / "m.partial").exists()


def test_a_source_sending_exactly_the_size_is_taken_whole(
    source: tuple[Source, str], tmp_path: Path, writes: list[Write]
) -> None:
    _, url = source
    pull(url, tmp_path / "m.partial", transfer_for(DATA))
    assert sum(length for _, length, _ in writes) == len(DATA)
    assert (tmp_path / "m.partial").read_bytes() == DATA


async def test_a_hub_answer_longer_than_the_size_is_cut_off_before_a_byte_past_it_is_written(
    source: tuple[Source, str], tmp_path: Path, writes: list[Write]
) -> None:
    # The hub's copy reads through aiohttp rather than pull_blocking, with its own size check.
    told, url = source
    told.body = DATA * 3
    (tmp_path / "kcpps").mkdir()
    (tmp_path / "config.yaml").write_text(f"cluster: {{store_dir: {tmp_path / 'store'}}}\n")
    node: Any = SimpleNamespace(config=load_config(tmp_path / "config.yaml", environ={}))
    store = AssetService(node)
    transfer = transfer_for(DATA)
    writer = PartialFile.open(tmp_path / "m.partial", transfer.size)
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            with pytest.raises(AssetError, match="more than"):
                await store.puller._take_body(transfer, writer, response)
    finally:
        writer.close()
    assert writes and all(offset + length <= len(DATA) for offset, length, _ in writes)
    assert not (tmp_path / "m.partial").exists()
