"""IDs a backend handed out (response, job and prompt IDs) and the replica that holds them.

A stored response, an sd.cpp job or a ComfyUI prompt lives in one backend: a later request that
names its ID (``GET /v1/responses/{id}``, ``GET /sdcpp/v1/jobs/{id}``, ``/history/{id}``) must
reach that backend, not whichever replica the rotation picks. The node that answered the
creating request remembers the ID here; the table is bounded (least recently used out first)
and entries expire, since backends forget them too. A node going down keeps its IDs: while it
is down a follow-up gets the 502 every request to it gets, and once it is back its backend
answers for the ID itself (its own 404 if a restart lost it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["DEFAULT_CAPACITY", "DEFAULT_TTL_SECS", "Holder", "StickyIds"]

# Enough for a busy day of jobs on a small cluster; each entry is a few hundred bytes.
DEFAULT_CAPACITY = 50_000
# sd.cpp and ComfyUI keep finished jobs for the process's life, vLLM's stored responses until
# restart: a day covers every client that polls or fetches a result it started.
DEFAULT_TTL_SECS = 24 * 3600.0


class Holder(NamedTuple):
    """Where an ID lives: the node, and the public and served model IDs it was created under."""

    node_id: str
    public_id: str
    local_id: str


class StickyIds:
    """``(family, id) -> Holder``, bounded and expiring; time from an injectable clock."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        ttl_secs: float = DEFAULT_TTL_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._ttl = ttl_secs
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[float, Holder]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, family: str, ident: str, holder: Holder) -> None:
        key = (family, ident)
        self._entries[key] = (self._clock() + self._ttl, holder)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def lookup(self, family: str, ident: str) -> Holder | None:
        key = (family, ident)
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, holder = entry
        if self._clock() >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return holder

    def forget(self, family: str, ident: str) -> None:
        self._entries.pop((family, ident), None)
