"""Per-key limits: `rpm`, `tpm` and `max_concurrent` of stored keys, counted across the cluster.

Pure (no Django, no I/O): the front door asks `Limiter.admit` once per metered request, after
the key is known and before the request is queued or forwarded, and gives the ticket back with
`Limiter.release` when the request ends, however it ends; the node that ran the backend
charges the tokens it reported with `Limiter.charge`.

Counting. Each node counts its own admissions in one-second buckets (`WINDOW_SECS` + 1 of
them at most per key): a request counts against `rpm` for at least `WINDOW_SECS` and at most
one second more, so no sliding minute ever holds more than the limit from one node's own
counts. Tokens are the charged prompt + completion tokens in the same buckets, plus the
estimates reserved by requests still in flight (their completion is not known until they end).

Across the cluster (registry/limitsync.py moves the numbers): every node reports its own
counts per key (`Limiter.report`) to the master, the master keeps the last report of each node
(`Ledger`) and answers with the sum of everyone else's; a node adds that sum to its own live
counts (`Limiter.take_remote`). A node therefore sees another node's admissions late by at
most one report and one answer: that is the slack of a limit across nodes (README, "Limits").
A remote sum older than `STALE_SECS` is dropped: a node that lost the master counts alone
again, as a standalone node always does.

Why not the `limits` library: its windows take the wall clock inside, cannot add what other
nodes counted to a key's own count, and have no notion of a reservation replaced by the
charge at the end; what is left for it to do is the hundred lines of buckets below.

Memory: at most `WINDOW_SECS` + 1 buckets per key, and only keys of the table in force
(`Limiter.follow`): a key revoked or removed drops its counters at the next request or report.

Registry of in-process state (house style rule 4): `_limiter` below is the process's only
limiter and `_ledger` the master's reports; `reset_for_tests()` puts fresh ones in. Both
forget by themselves: buckets leave the window, reports go stale.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from access.keys import KeyTable, current_table

WINDOW_SECS = 60
"""rpm and tpm count over a sliding minute (bucketed by the second)."""
STALE_SECS = 5.0
"""A remote sum (or a node's report on the master) older than this no longer counts."""
CONCURRENT_RETRY_AFTER_SECS = 1
MIN_RETRY_AFTER_SECS = 1

# Which limit refused a request (metrics label, error wording).
REQUESTS = "requests"
TOKENS = "tokens"
CONCURRENT = "concurrent"

Clock = Callable[[], float]
Counts = tuple[int, int, int]
"""(requests in the window, tokens in the window including reservations, requests in flight)."""
ZERO: Counts = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrent is not None


class _Usage:
    """One key's counts on this node."""

    __slots__ = ("buckets", "in_flight", "requests", "reserved", "tokens")

    def __init__(self) -> None:
        # [second, requests, tokens], oldest first; a second appears once.
        self.buckets: deque[list[int]] = deque()
        self.requests = 0
        self.tokens = 0
        self.in_flight = 0
        self.reserved = 0

    def expire(self, second: int) -> None:
        buckets = self.buckets
        while buckets and second - buckets[0][0] > WINDOW_SECS:
            _, requests, tokens = buckets.popleft()
            self.requests -= requests
            self.tokens -= tokens

    def add(self, second: int, requests: int, tokens: int) -> None:
        buckets = self.buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += requests
            buckets[-1][2] += tokens
        else:
            buckets.append([second, requests, tokens])
        self.requests += requests
        self.tokens += tokens

    def counts(self) -> Counts:
        return self.requests, self.tokens + self.reserved, self.in_flight

    def empty(self) -> bool:
        return not self.buckets and not self.in_flight and not self.reserved

    def retry_after(self, now: float, excess: int, field: int) -> int:
        """Seconds until `excess` of this node's own counts (field 1: requests, 2: tokens) have
        left the window. What other nodes counted is not known by the second here, so when
        this node's own counts do not cover the excess the answer is when its oldest leaves:
        a lower bound, the client learns more on its retry."""
        freed = 0
        for bucket in self.buckets:
            freed += bucket[field]
            if freed >= excess:
                return _secs_until(bucket[0] + WINDOW_SECS + 1, now)
        if self.buckets:
            return _secs_until(self.buckets[0][0] + WINDOW_SECS + 1, now)
        return MIN_RETRY_AFTER_SECS


def _secs_until(at: float, now: float) -> int:
    return max(MIN_RETRY_AFTER_SECS, math.ceil(at - now))


@dataclass(slots=True)
class Ticket:
    """An admitted request's hold on its key's counts, given back by `Limiter.release`."""

    name: str
    usage: _Usage
    reserved: int
    released: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    limits: Limits
    remaining_requests: int | None
    remaining_tokens: int | None
    refused_by: str | None = None
    retry_after_secs: int = 0
    ticket: Ticket | None = None

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The `x-ratelimit-*` headers (contract §8): the pair of each limit the key has."""
        out: list[tuple[bytes, bytes]] = []
        limits = self.limits
        if limits.rpm is not None:
            out.append((b"x-ratelimit-limit-requests", str(limits.rpm).encode()))
            out.append((b"x-ratelimit-remaining-requests", str(self.remaining_requests).encode()))
        if limits.tpm is not None:
            out.append((b"x-ratelimit-limit-tokens", str(limits.tpm).encode()))
            out.append((b"x-ratelimit-remaining-tokens", str(self.remaining_tokens).encode()))
        return out


def _remaining(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(0, limit - used)


class Limiter:
    """This node's counts per key, and the other nodes' last known sum."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.fingerprint: str | None = None
        self._names: frozenset[str] | None = None
        self._metered_tokens: frozenset[str] | None = None
        self._usage: dict[str, _Usage] = {}
        self._remote: dict[str, Counts] = {}
        self._remote_at = -math.inf

    # -- the key table in force -------------------------------------------------------------

    def follow(self, table: KeyTable) -> None:
        """Keep counters only for the keys of `table` (a key revoked or removed drops them)."""
        if table.fingerprint == self.fingerprint:
            return
        self.fingerprint = table.fingerprint
        names = frozenset(record.name for record in table.records)
        self._names = names
        self._metered_tokens = frozenset(r.name for r in table.records if r.tpm is not None)
        for name in [n for n in self._usage if n not in names]:
            del self._usage[name]
        self._remote = {n: c for n, c in self._remote.items() if n in names}

    def _known(self, name: str) -> bool:
        return self._names is None or name in self._names

    # -- one request ------------------------------------------------------------------------

    def admit(self, name: str, limits: Limits, cost_tokens: int) -> Decision:
        """Count a request of key `name` that would use about `cost_tokens`, or refuse it.

        Checked in this order: `rpm`, `tpm`, `max_concurrent`. A request whose estimate alone
        is above `tpm` still runs when the key used no tokens in the window: it could never
        run otherwise."""
        now = self.clock()
        second = math.floor(now)
        usage = self._usage.get(name)
        if usage is None:
            usage = self._usage[name] = _Usage()
        usage.expire(second)
        remote_requests, remote_tokens, remote_in_flight = self._remote_counts(name, now)
        requests = usage.requests + remote_requests
        tokens = usage.tokens + usage.reserved + remote_tokens
        in_flight = usage.in_flight + remote_in_flight
        cost = max(0, cost_tokens)
        refused_by, retry = None, 0
        if limits.rpm is not None and requests + 1 > limits.rpm:
            refused_by = REQUESTS
            retry = usage.retry_after(now, requests + 1 - limits.rpm, 1)
        elif limits.tpm is not None and tokens > 0 and tokens + cost > limits.tpm:
            refused_by = TOKENS
            retry = usage.retry_after(now, tokens + cost - limits.tpm, 2)
        elif limits.max_concurrent is not None and in_flight + 1 > limits.max_concurrent:
            refused_by, retry = CONCURRENT, CONCURRENT_RETRY_AFTER_SECS
        if refused_by is not None:
            return Decision(
                False,
                limits,
                _remaining(limits.rpm, requests),
                _remaining(limits.tpm, tokens),
                refused_by,
                retry,
            )
        usage.add(second, 1, 0)
        usage.in_flight += 1
        usage.reserved += cost
        ticket = Ticket(name, usage, cost)
        return Decision(
            True,
            limits,
            _remaining(limits.rpm, requests + 1),
            _remaining(limits.tpm, tokens + cost),
            ticket=ticket,
        )

    def release(self, ticket: Ticket | None) -> None:
        """The request ended: its concurrency slot and its token reservation go (once)."""
        if ticket is None or ticket.released:
            return
        ticket.released = True
        ticket.usage.in_flight -= 1
        ticket.usage.reserved -= ticket.reserved

    def charge(self, name: str | None, tokens: int) -> None:
        """Tokens a request of key `name` used, as its backend reported them (or estimated)."""
        if not name or tokens <= 0:
            return
        if self._metered_tokens is not None and name not in self._metered_tokens:
            return  # a key without `tpm` (or no key of the table): nothing to count them for
        usage = self._usage.get(name)
        if usage is None:
            usage = self._usage[name] = _Usage()
        second = math.floor(self.clock())
        usage.expire(second)
        usage.add(second, 0, tokens)

    # -- across the cluster -----------------------------------------------------------------

    def report(self) -> dict[str, Counts]:
        """This node's own counts per key (keys with nothing counted are left out, and their
        counters dropped)."""
        second = math.floor(self.clock())
        out: dict[str, Counts] = {}
        for name in list(self._usage):
            usage = self._usage[name]
            usage.expire(second)
            if usage.empty():
                del self._usage[name]
                continue
            out[name] = usage.counts()
        return out

    def take_remote(self, counts: Mapping[str, Counts]) -> None:
        """The sum of every other node's counts, as the master last knew them."""
        self._remote = {n: c for n, c in counts.items() if self._known(n)}
        self._remote_at = self.clock()

    def _remote_counts(self, name: str, now: float) -> Counts:
        if now - self._remote_at > STALE_SECS:
            return ZERO
        return self._remote.get(name, ZERO)

    def view(self) -> dict[str, dict[str, Counts]]:
        """Per key: this node's own counts and the cluster's as this node sees them now (the
        node protocol shows it; tests and operators read how far the nodes agree)."""
        now = self.clock()
        here = self.report()
        remote = self._remote if now - self._remote_at <= STALE_SECS else {}
        cluster = add_counts(here, remote)
        return {name: {"here": here.get(name, ZERO), "cluster": cluster[name]} for name in cluster}

    def in_flight(self, name: str) -> int:
        usage = self._usage.get(name)
        return usage.in_flight if usage is not None else 0


def charge_usage(key_name: str | None, tokens: int) -> None:
    """Where a backend's usage is recorded: the tokens count toward the key's `tpm` on this
    node (the node that ran the request, whichever node let it in)."""
    if key_name and tokens > 0:
        _limiter.follow(current_table())
        _limiter.charge(key_name, tokens)


class Ledger:
    """The master's last report from each node, for the sums it answers with."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._reports: dict[str, tuple[float, dict[str, Counts]]] = {}

    def take(self, node_id: str, counts: dict[str, Counts]) -> None:
        self._reports[node_id] = (self.clock(), counts)

    def totals(self, *, excluding: str | None = None) -> dict[str, Counts]:
        """The sum of every fresh report but `excluding`'s (stale ones are forgotten)."""
        now = self.clock()
        for node_id in [n for n, (at, _) in self._reports.items() if now - at > STALE_SECS]:
            del self._reports[node_id]
        return add_counts(*(c for n, (_, c) in self._reports.items() if n != excluding))


def add_counts(*parts: Mapping[str, Counts]) -> dict[str, Counts]:
    out: dict[str, Counts] = {}
    for part in parts:
        for name, (requests, tokens, in_flight) in part.items():
            have = out.get(name, ZERO)
            out[name] = (have[0] + requests, have[1] + tokens, have[2] + in_flight)
    return out


# -- the wire ---------------------------------------------------------------------------------

MAX_WIRE_KEYS = 100_000
"""More keys than any table holds: a report past it is refused whole."""


def counts_to_wire(counts: Mapping[str, Counts]) -> dict[str, list[int]]:
    return {name: list(value) for name, value in counts.items()}


def counts_from_wire(doc: Any) -> dict[str, Counts]:
    """`{"name": [requests, tokens, in_flight]}` from another node; ValueError when malformed."""
    if not isinstance(doc, dict):
        raise ValueError("keys must be an object of [requests, tokens, in_flight]")
    if len(doc) > MAX_WIRE_KEYS:
        raise ValueError(f"keys holds more than {MAX_WIRE_KEYS} entries")
    out: dict[str, Counts] = {}
    for name, value in doc.items():
        if (
            not isinstance(value, list)
            or len(value) != 3
            or not all(type(v) is int and v >= 0 for v in value)
        ):
            raise ValueError(f"keys.{str(name)[:100]} must be three non-negative integers")
        out[str(name)] = (value[0], value[1], value[2])
    return out


# -- the process's limiter --------------------------------------------------------------------

_limiter = Limiter()
"""Every metered request of this process is counted here."""
_ledger = Ledger()
"""On a master: each node's last report (empty elsewhere)."""


def current_limiter() -> Limiter:
    return _limiter


def current_ledger() -> Ledger:
    return _ledger


def reset_for_tests(clock: Clock = time.monotonic) -> Limiter:
    global _limiter, _ledger
    _limiter, _ledger = Limiter(clock), Ledger(clock)
    return _limiter
