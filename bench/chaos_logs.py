"""The chaos soak's count of what ran: the simulated backends' completion lines, followed live.

The router rotates a backend's log by copying it to `.1` and truncating it in place (see
`proxy.runtimes.logfiles`), and drops the oldest copy beyond `logging.backend_log_backups`; a
read at the end of a long soak would miss what rotated away. So a thread follows every
`<node>/store/logs/*-backend.log` a few times a second: when a file is shorter than what was
read of it, it was rotated, and the rest of what was read is in its `.1` copy.

Each completion line carries the backend process's ID, its own line number and the time
(`pid=P seq=N at=<epoch ms>`), so a line read twice is counted once, a line lost to rotation
(written between the copy and the truncation) shows up as a gap, and a request that ran twice
can be placed among the faults.
"""

from __future__ import annotations

import collections
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

LINE_RE = re.compile(rb"sim: completed \S+ pid=(\d+) seq=(\d+) at=(\d+) user=(\S+)")
POLL_SECS = 0.1


@dataclass
class _Followed:
    offset: int = 0
    partial: bytes = b""


@dataclass
class CompletionLog:
    """Completion lines of every backend log under `root`, read across rotations."""

    root: Path
    runs: collections.Counter[str] = field(default_factory=collections.Counter)
    where: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    """Each user's runs: the node whose backend ran it, and when it completed (epoch ms)."""
    rotations: int = 0
    torn: int = 0
    """Rotations whose `.1` no longer held what was read (two rotations between two polls)."""
    _files: dict[Path, _Followed] = field(default_factory=dict)
    _seqs: dict[int, set[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def paths(self) -> list[Path]:
        return sorted(self.root.glob("*/store/logs/*-backend.log"))

    def poll(self) -> None:
        with self._lock:
            for path in self.paths():
                self._poll(path, self._files.setdefault(path, _Followed()))

    def follow(self, stop: threading.Event) -> None:
        while not stop.wait(POLL_SECS):
            self.poll()

    def gaps(self) -> int:
        """Completion lines numbered below one that was read but never read themselves."""
        with self._lock:
            return sum(max(seqs) - len(seqs) for seqs in self._seqs.values() if seqs)

    def _poll(self, path: Path, state: _Followed) -> None:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if size < state.offset:
            self.rotations += 1
            copy = path.with_name(path.name + ".1")
            rest = _read(copy, state.offset)
            if rest is None:
                self.torn += 1
            else:
                self._feed(path, state, rest)
            state.offset, state.partial = 0, b""
        data = _read(path, state.offset) or b""
        state.offset += len(data)
        self._feed(path, state, data)

    def _feed(self, path: Path, state: _Followed, data: bytes) -> None:
        lines = (state.partial + data).split(b"\n")
        state.partial = lines.pop()
        for line in lines:
            match = LINE_RE.search(line)
            if match is None:
                continue
            seqs = self._seqs.setdefault(int(match.group(1)), set())
            seq = int(match.group(2))
            if seq not in seqs:
                seqs.add(seq)
                user = match.group(4).decode(errors="replace")
                self.runs[user] += 1
                node = path.relative_to(self.root).parts[0]
                self.where.setdefault(user, []).append((node, int(match.group(3))))


def _read(path: Path, start: int) -> bytes | None:
    """The bytes of `path` from `start` on; None if it is gone or shorter than `start`."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            if f.tell() < start:
                return None
            f.seek(start)
            return f.read()
    except FileNotFoundError:
        return None
