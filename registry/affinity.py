"""Cache-affine routing: which replica last served a conversation's leading messages.

llama-server and vLLM keep the processed prompt of a slot and reuse it when the next request
starts with the same tokens, so the replica that served turn N of a chat starts turn N+1
almost at once while any other replica processes the whole history again.

A request's *prefix fingerprints* are a chain of hashes over its leading messages (chat) or
over fixed-size blocks of its prompt (completions): fingerprint i covers everything up to
boundary i, so two bodies share fingerprint i exactly when they share that much of their
prompt. Only digests and byte counts are kept, never content.

The *affinity table* maps a fingerprint (per public model and lane) to the replica that last
served it, with the replica's model generation at that time: an entry whose replica has since
loaded another model (or reloaded this one) holds no cache and is ignored. It is an LRU
bounded by a size, entries expire after a TTL, and a node that goes down loses its entries.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

# Prompt tokens per body byte as the sim and the gate count them (proxy/work.py); routing
# only needs an estimate of how much prefill a cached prefix saves.
BYTES_PER_TOKEN = 4
# A completion prompt is cut in blocks of this many bytes: a shorter shared prefix is too
# cheap to re-process to be worth steering for.
BLOCK_BYTES = 512
# Only the longest few boundaries are looked up per request: turn N+1 of a chat extends turn
# N's whole body by an answer and a question, and a regenerated answer repeats turn N's.
LEVELS_KEPT = 4
# Bounded work per request: at most this many messages or blocks are hashed (the latest
# boundaries of a longer body are not fingerprinted, so it simply rotates).
MAX_LEVELS = 512
# Prefill saved below this is noise next to a request's own fixed cost: rotate instead.
MIN_SAVING_MS = 50.0


class Fingerprint(NamedTuple):
    digest: bytes
    prefix_bytes: int
    """Bytes of prompt this fingerprint covers (canonical JSON of the messages, or text)."""

    @property
    def tokens(self) -> int:
        return self.prefix_bytes // BYTES_PER_TOKEN


def _chain(pieces: Iterable[bytes]) -> list[Fingerprint]:
    out: list[Fingerprint] = []
    digest = b""
    covered = 0
    for count, piece in enumerate(pieces):
        if count >= MAX_LEVELS:
            break
        digest = hashlib.blake2b(digest + piece, digest_size=16).digest()
        covered += len(piece)
        out.append(Fingerprint(digest, covered))
    return out[-LEVELS_KEPT:]


def fingerprints(doc: Mapping[str, Any]) -> list[Fingerprint]:
    """The prefix fingerprints of an OpenAI chat or completion body, shortest first.

    Empty when the body has nothing to fingerprint (no messages, a non-text prompt).
    """
    messages = doc.get("messages")
    if isinstance(messages, list):
        return _chain(
            orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in messages if isinstance(m, dict)
        )
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        raw = prompt.encode()
        # Only whole blocks: a partial tail differs from the next turn's same block.
        whole = len(raw) // BLOCK_BYTES
        return _chain(raw[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] for i in range(whole))
    return []


class ReplicaKey(NamedTuple):
    node_id: str
    local_id: str


@dataclass(slots=True)
class PrefixMatch:
    """Filled by the routing choice: the replica it sent the request to because that replica
    holds the request's prompt up to `prefix_bytes` (lending prices the owner's work without
    it). Empty when the choice was not made for a cached prefix."""

    replica: ReplicaKey | None = None
    prefix_bytes: int = 0

    def bytes_on(self, node_id: str, local_id: str) -> int:
        """Cached prompt bytes on this replica (0 unless it is the one the match names)."""
        if self.replica is None or self.replica != (node_id, local_id):
            return 0
        return self.prefix_bytes


@dataclass
class _Entry:
    replica: ReplicaKey
    generation: int
    expires_at: float


@dataclass
class AffinityTable:
    """Fingerprint -> replica that last served it, bounded by `max_entries` and `ttl` seconds."""

    max_entries: int
    ttl: float
    clock: Callable[[], float] = time.monotonic
    _entries: OrderedDict[tuple[str, str, bytes], _Entry] = field(default_factory=OrderedDict)
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    """Per public model: hits (sent to the cached replica), misses (no usable cached replica),
    overrides (a cached replica existed but the rotation's pick was worth more)."""

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self,
        public_id: str,
        lane: str,
        prints: Sequence[Fingerprint],
        generation_of: Callable[[ReplicaKey], int | None],
    ) -> tuple[ReplicaKey, Fingerprint] | None:
        """The replica holding the longest live prefix, among those `generation_of` knows.

        `generation_of` answers None for a replica that cannot take the request now (node
        down, lane not ready, not a candidate); an entry whose generation differs from the
        replica's current one was made under another load and is dropped.
        """
        now = self.clock()
        for fp in reversed(prints):
            key = (public_id, lane, fp.digest)
            entry = self._entries.get(key)
            if entry is None:
                continue
            if entry.expires_at <= now:
                del self._entries[key]
                continue
            current = generation_of(entry.replica)
            if current is None:
                continue
            if current != entry.generation:
                del self._entries[key]
                continue
            return entry.replica, fp
        return None

    def remember(
        self,
        public_id: str,
        lane: str,
        prints: Sequence[Fingerprint],
        replica: ReplicaKey,
        generation: int,
    ) -> None:
        expires_at = self.clock() + self.ttl
        for fp in prints:
            key = (public_id, lane, fp.digest)
            self._entries[key] = _Entry(replica, generation, expires_at)
            self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def drop_node(self, node_id: str) -> int:
        """Forget every entry of a node's replicas (it went down: its caches are gone)."""
        stale = [k for k, e in self._entries.items() if e.replica.node_id == node_id]
        for key in stale:
            del self._entries[key]
        return len(stale)

    def count(self, public_id: str, outcome: str) -> None:
        self.counts.setdefault(public_id, Counter())[outcome] += 1

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            model: {k: c[k] for k in ("hits", "misses", "overrides")}
            for model, c in sorted(self.counts.items())
        }


def prefers_cached(
    *,
    cached_tokens: int,
    uncached_tokens: int,
    cost: tuple[float, float] | None,
    cached_busy: int,
    other_busy: int,
) -> bool:
    """Whether the replica holding `cached_tokens` of the prompt beats the rotation's pick.

    Staying costs the extra wait behind the cached replica's surplus of in-flight work, each
    in-flight job priced as a request like this one served from cache (its `uncached_tokens`
    of prefill); leaving costs the prefill of the cached part again.

    Priced (`cost`, a cost fit's `(base_ms, ms per prompt token)`): the prefill saved must
    reach MIN_SAVING_MS and exceed that extra wait. Unpriced (no fit yet, as on a router that
    has just started): both sides are counted in prompt tokens, which prices prefill at the
    same rate on both sides and leaves out the fixed cost of a job.
    """
    surplus = cached_busy - other_busy
    if cost is None:
        return surplus <= 0 or surplus * uncached_tokens < cached_tokens
    base_ms, slope = cost
    saving_ms = slope * cached_tokens
    if saving_ms < MIN_SAVING_MS:
        return False
    job_ms = base_ms + slope * uncached_tokens
    return surplus * job_ms < saving_ms
