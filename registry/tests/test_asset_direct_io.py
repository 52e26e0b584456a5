"""How a peer copy reaches the disk: aligned spans with O_DIRECT, the rest buffered, and
buffered throughout where the file system refuses O_DIRECT."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
from pathlib import Path

import pytest

from registry.assets.partial import DIRECT_ALIGN, PartialFile
from registry.tests.conftest import Write


def page_aligned(data: bytes) -> tuple[mmap.mmap, memoryview]:
    buffer = mmap.mmap(-1, len(data))
    buffer.write(data)
    return buffer, memoryview(buffer)


DATA = bytes(range(256)) * (3 * DIRECT_ALIGN // 256) + b"tail"


def test_aligned_spans_go_direct_and_the_tail_buffered(
    direct_dir: Path, writes: list[Write]
) -> None:
    partial = direct_dir / "m.partial"
    writer = PartialFile.open(partial, len(DATA))
    buffer, view = page_aligned(DATA)
    try:
        writer.write(view, page_aligned=True)
    finally:
        writer.close()
        view.release()
        buffer.close()
    assert writes == [(0, 3 * DIRECT_ALIGN, True), (3 * DIRECT_ALIGN, 4, False)]
    assert partial.read_bytes() == DATA
    assert writer.digest.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_an_unaligned_offset_or_unaligned_memory_is_written_buffered(
    direct_dir: Path, writes: list[Write]
) -> None:
    partial = direct_dir / "m.partial"
    partial.write_bytes(DATA[:10])
    writer = PartialFile.open(partial, len(DATA))
    try:
        writer.write(DATA[10 : 10 + DIRECT_ALIGN], page_aligned=True)  # the offset is 10
        writer.write(DATA[10 + DIRECT_ALIGN :])  # bytes of unknown alignment
    finally:
        writer.close()
    assert [direct for _offset, _length, direct in writes] == [False, False]
    assert partial.read_bytes() == DATA


def test_a_file_system_that_refuses_o_direct_gets_buffered_writes(
    tmp_path: Path, writes: list[Write], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fcntl = fcntl.fcntl

    def refusing(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "O_DIRECT refused")
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refusing)
    partial = tmp_path / "m.partial"
    writer = PartialFile.open(partial, len(DATA))
    buffer, view = page_aligned(DATA)
    try:
        writer.write(view[: 2 * DIRECT_ALIGN], page_aligned=True)
        writer.write(view[2 * DIRECT_ALIGN :], page_aligned=True)
    finally:
        writer.close()
        view.release()
        buffer.close()
    assert not writer.direct
    assert all(not direct for _offset, _length, direct in writes)
    assert partial.read_bytes() == DATA
    assert writer.digest.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_a_direct_write_refused_is_written_buffered_and_direct_stops(
    direct_dir: Path, writes: list[Write], monkeypatch: pytest.MonkeyPatch
) -> None:
    recording = os.write

    def refusing_direct(fd: int, data: bytes | memoryview) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "alignment refused")
        return recording(fd, data)

    monkeypatch.setattr(os, "write", refusing_direct)
    partial = direct_dir / "m.partial"
    writer = PartialFile.open(partial, len(DATA))
    buffer, view = page_aligned(DATA)
    try:
        writer.write(view[:DIRECT_ALIGN], page_aligned=True)
        writer.write(view[DIRECT_ALIGN:], page_aligned=True)
    finally:
        writer.close()
        view.release()
        buffer.close()
    assert not writer.direct
    assert writes == [(0, DIRECT_ALIGN, False), (DIRECT_ALIGN, len(DATA) - DIRECT_ALIGN, False)]
    assert partial.read_bytes() == DATA
