"""The `.partial` file of one transfer: resumed from what is there, written with O_DIRECT."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
from pathlib import Path
from typing import Any

from registry.assets.store import COPY_BLOCK_BYTES, unlink

# A peer copy is written with O_DIRECT in spans aligned to this (a multiple of the logical
# block size of common disks): a buffered write copies every byte into freshly allocated page
# cache, which cost more CPU than hashing it, and the final fsync sends it all to disk anyway.
DIRECT_ALIGN = 4096


class PartialFile:
    """The `.partial` file of one transfer: resumed from what is there, re-hashed first."""

    def __init__(self, path: Path, fd: int, offset: int, digest: Any) -> None:
        self.path = path
        self.fd = fd
        self.offset = offset
        self.digest = digest
        # Cleared for good once the file system refuses O_DIRECT (tmpfs on older kernels,
        # alignments other than DIRECT_ALIGN): buffered writes then carry the copy.
        self.direct = True
        self._fd_direct = False

    @classmethod
    def open(cls, path: Path, size: int) -> PartialFile:
        # O_NOFOLLOW: a symlink put in place of the partial file must not redirect the write.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            have = os.fstat(fd).st_size
            if have > size:
                os.ftruncate(fd, 0)
                have = 0
            digest = hashlib.sha256()
            os.lseek(fd, 0, os.SEEK_SET)
            left = have
            while left > 0:
                block = os.read(fd, min(COPY_BLOCK_BYTES, left))
                if not block:
                    break
                digest.update(block)
                left -= len(block)
            offset = have - left
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, offset, digest)

    def write(self, block: bytes | memoryview, *, page_aligned: bool = False) -> None:
        """Append `block`; with `page_aligned` (its memory starts on a page), the aligned part
        of it that lands on an aligned file offset goes to disk with O_DIRECT."""
        view = memoryview(block)
        position = self.offset
        while view:
            span = len(view)
            direct = (
                page_aligned
                and self.direct
                and span >= DIRECT_ALIGN
                and position % DIRECT_ALIGN == 0
                and (position - self.offset) % DIRECT_ALIGN == 0
            )
            if direct:
                span -= span % DIRECT_ALIGN
            written = self._write_once(view[:span], direct)
            view = view[written:]
            position += written
        self.digest.update(block)
        self.offset = position

    def _write_once(self, view: memoryview, direct: bool) -> int:
        if direct and not self._fd_direct and not self._direct_mode(True):
            direct = False
        if not direct and self._fd_direct:
            self._direct_mode(False)
        try:
            return os.write(self.fd, view)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
        # O_DIRECT refused this write (nothing of it was written): buffered from now on.
        self.direct = False
        self._direct_mode(False)
        return os.write(self.fd, view)

    def _direct_mode(self, on: bool) -> bool:
        """Switch the descriptor's O_DIRECT flag; False when the file system refuses it."""
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        if not on:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
            self._fd_direct = False
            return True
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        except OSError:
            self.direct = False
            return False
        self._fd_direct = True
        return True

    def write_all(self, blocks: list[bytes]) -> None:
        for block in blocks:
            self.write(block)

    def restart(self) -> None:
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.offset = 0
        self.digest = hashlib.sha256()

    def discard(self) -> None:
        self.restart()
        unlink(self.path)

    def finish(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
