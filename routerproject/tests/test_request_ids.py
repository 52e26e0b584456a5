"""Request IDs: which client IDs are kept, and the log filter that puts the ID on each line."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import uuid

import pytest

from routerproject import request_ids
from routerproject.request_ids import MAX_LENGTH_CHARS, RequestIdLogFilter

NEW_ID_RE = re.compile(r"[0-9a-f]{32}")


@pytest.mark.parametrize(
    "given",
    [b"abc-123", b"7f3c9a2e-1b4d-4c5e-9f00-0123456789ab", b"trace:svc/a.b+c=d@e_f", b"x" * 128],
)
def test_a_clients_usable_id_is_kept_as_sent(given: bytes) -> None:
    assert request_ids.from_header(given) == given.decode()


def test_surrounding_whitespace_is_not_part_of_the_id() -> None:
    assert request_ids.from_header(b"  abc  ") == "abc"


@pytest.mark.parametrize(
    "given",
    [
        None,
        b"",
        b"x" * (MAX_LENGTH_CHARS + 1),
        b"two words",
        b'quote"d',
        b"line\nbreak",
        "caf\u00e9".encode(),
    ],
)
def test_a_missing_or_unusable_id_is_replaced_by_a_new_one(given: bytes | None) -> None:
    assert NEW_ID_RE.fullmatch(request_ids.from_header(given))


def test_new_ids_differ() -> None:
    assert len({request_ids.new() for _ in range(1000)}) == 1000


def test_a_new_id_is_a_uuid7_that_starts_with_the_time_it_was_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at_ms = 1_796_000_000_123
    monkeypatch.setattr(request_ids.time, "time_ns", lambda: at_ms * 1_000_000 + 999_999)
    made = request_ids.new()
    parsed = uuid.UUID(made)
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert int(made[:12], 16) == at_ms
    # Later IDs sort after earlier ones (the index they go into grows at its end).
    monkeypatch.setattr(request_ids.time, "time_ns", lambda: (at_ms + 1) * 1_000_000)
    assert request_ids.new() > made


def _record() -> logging.LogRecord:
    return logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)


def test_the_log_filter_names_the_current_request_and_a_dash_outside_one() -> None:
    flt = RequestIdLogFilter()
    outside = _record()
    assert flt.filter(outside) and outside.__dict__["request_id"] == "-"
    token = request_ids.bind("req-1")
    try:
        inside = _record()
        assert flt.filter(inside) and inside.__dict__["request_id"] == "req-1"
    finally:
        request_ids.unbind(token)
    after = _record()
    assert flt.filter(after) and after.__dict__["request_id"] == "-"


async def test_each_task_sees_its_own_request() -> None:
    seen: dict[str, str | None] = {}
    gate = asyncio.Event()

    async def serve(name: str) -> None:
        token = request_ids.bind(name)
        try:
            await gate.wait()  # both requests are in flight at once
            seen[name] = request_ids.current()
        finally:
            request_ids.unbind(token)

    tasks = [asyncio.ensure_future(serve(n)) for n in ("a", "b")]
    gate.set()
    await asyncio.gather(*tasks)
    assert seen == {"a": "a", "b": "b"}
    assert request_ids.current() is None


def test_new_ids_keep_differing_across_random_blocks() -> None:
    # Several blocks' worth, so IDs from a refilled block are among them.
    count = 3 * request_ids.RANDOM_BLOCK_BYTES // 10 + 7
    assert len({request_ids.new()[12:] for _ in range(count)}) == count


def test_each_block_of_random_bits_is_used_once(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks: list[int] = []

    def urandom(size: int) -> bytes:
        blocks.append(size)
        return bytes([len(blocks)]) * size

    monkeypatch.setattr(request_ids.os, "urandom", urandom)
    monkeypatch.setattr(request_ids, "_pool", request_ids._Pool())
    per_block = request_ids.RANDOM_BLOCK_BYTES // 10
    first = {request_ids._random_80() for _ in range(per_block)}
    assert blocks == [request_ids.RANDOM_BLOCK_BYTES]
    assert first == {int.from_bytes(b"\x01" * 10, "big")}
    assert request_ids._random_80() == int.from_bytes(b"\x02" * 10, "big")
    assert len(blocks) == 2


def test_a_forked_child_draws_bits_its_parent_does_not() -> None:
    request_ids.new()  # the parent holds a block with bits left
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next ID and leave at once
        os.write(write, request_ids.new().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert child[12:] != request_ids.new()[12:]


def test_each_thread_draws_from_its_own_block() -> None:
    seen: list[str] = []

    def draw() -> None:
        seen.extend(request_ids.new() for _ in range(500))

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(seen)) == len(seen) == 2000
