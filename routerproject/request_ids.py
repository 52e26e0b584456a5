"""Request IDs: the one name a request goes by in answers, analytics rows, decision rows and logs.

The ASGI front gives every request an ID as it arrives (the client's own `X-Request-Id` when it
sent a usable one, else a new one), answers with it, and passes it on to every node the request
travels through, so one ID finds a request's rows on the owner, the master and the helper.

While the request runs, `current()` returns it (a context variable: each request is its own
task), and `RequestIdLogFilter` puts it on every log line the request causes. Stdlib only: the
logging configuration loads the filter before Django is set up.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import threading
import time

HEADER = b"x-request-id"

# Longer IDs, or characters outside this set, are not used as given: an ID goes into headers we
# send to other nodes and into log lines, where a space, a quote or a newline would let a client
# forge what an operator reads. Such a request gets a new ID instead of an error, because a
# client's tracing header must never make an otherwise good request fail.
MAX_LENGTH_CHARS = 128
_ACCEPTED_RE = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,%d}" % MAX_LENGTH_CHARS)

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


# A new ID is a UUIDv7 (RFC 9562) written as 32 hex digits: the Unix time in milliseconds,
# then 74 random bits. Unique without coordination between nodes, sortable by when the request
# arrived, and appended at the end of the indexes that hold it. A random ID lands on a different
# index page each time: batches of 80 analytics rows (a 50 ms flush under load) into a table of
# 500,000 cost 18-20 us of CPU a row with random IDs and 6 us with these (SQLite, WAL; 11-12
# us against 6 at 20,000 rows; bench/request_ids.py), and the gap grows with the table.
_VERSION_7 = 0x7 << 76
_VARIANT = 0b10 << 62
_RAND_A_MASK = (1 << 12) - 1
_RAND_B_MASK = (1 << 62) - 1


# The random bits come from the OS a block at a time: a getrandom() call for every request was
# a system call on the hot path. Each thread draws from its own block (no lock), and a forked
# child starts without one, so it never repeats its parent's bits.
RANDOM_BLOCK_BYTES = 4096
_RANDOM_BYTES_PER_ID = 10


class _Pool(threading.local):
    def __init__(self) -> None:
        self.block = b""
        self.at = 0


_pool = _Pool()


def _forget_pool() -> None:
    global _pool
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _random_80() -> int:
    pool = _pool
    at = pool.at
    end = at + _RANDOM_BYTES_PER_ID
    if end > len(pool.block):
        pool.block = os.urandom(RANDOM_BLOCK_BYTES)
        at, end = 0, _RANDOM_BYTES_PER_ID
    pool.at = end
    return int.from_bytes(pool.block[at:end], "big")


def new() -> str:
    """A fresh ID: a UUIDv7 as 32 hex digits, its first 12 the time it was made."""
    ms = time.time_ns() // 1_000_000
    rand = _random_80()
    value = (
        (ms << 80)
        | _VERSION_7
        | ((rand >> 62) & _RAND_A_MASK) << 64
        | _VARIANT
        | (rand & _RAND_B_MASK)
    )
    return f"{value:032x}"


def from_header(value: bytes | None) -> str:
    """The client's ID when it sent a usable one, else a new one."""
    if value is not None:
        value = value.strip()
        if _ACCEPTED_RE.fullmatch(value):
            return value.decode("ascii")
    return new()


def bind(request_id: str) -> contextvars.Token[str | None]:
    """Make `request_id` the current one for this task (and the tasks it starts)."""
    return _current.set(request_id)


def unbind(token: contextvars.Token[str | None]) -> None:
    _current.reset(token)


def current() -> str | None:
    """The ID of the request this code runs for, or None outside any request."""
    return _current.get()


class RequestIdLogFilter(logging.Filter):
    """Sets `record.request_id` (`-` outside a request) for the log format to show."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _current.get() or "-"
        return True
