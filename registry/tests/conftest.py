"""Fixtures shared by the asset tests: how the copy's writes reach the disk."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

Write = tuple[int, int, bool]  # (file offset, length, O_DIRECT set)


@pytest.fixture
def direct_dir(tmp_path: Path) -> Path:
    try:
        fd = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        pytest.skip("the test file system refuses O_DIRECT")
    os.close(fd)
    return tmp_path


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Write]]:
    """Every write to a `.partial` file: where it landed and whether it had O_DIRECT."""
    seen: list[Write] = []
    real_write = os.write

    def recording(fd: int, data: bytes | memoryview) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(".partial"):
            return real_write(fd, data)
        offset = os.lseek(fd, 0, os.SEEK_CUR)
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        written = real_write(fd, data)
        seen.append((offset, written, direct))
        return written

    monkeypatch.setattr(os, "write", recording)
    yield seen
