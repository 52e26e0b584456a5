"""The log formatters' timestamps and their untouched records (the escaping itself is tested on
a real node, tests/test_hardening_27.py)."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from routerproject import logsafe
from routerproject.logsafe import SafeJsonFormatter, TextFormatter

TEXT = "%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"


def _record(created: float, message: str = "GET /v1 status=%d", *args: Any) -> logging.LogRecord:
    record = logging.LogRecord(
        "router.access", logging.INFO, __file__, 1, message, args or (200,), None
    )
    record.created = created
    record.msecs = (created - int(created)) * 1000 // 1 + 0.0
    record.request_id = "rid"
    return record


@pytest.mark.parametrize("formatter", [TextFormatter(TEXT), SafeJsonFormatter()])
def test_each_second_is_formatted_once_and_reads_as_the_stdlib_writes_it(
    formatter: logging.Formatter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two lines in one second, the next second, and back to the first (another thread's line).
    instants = [1_750_000_000.125, 1_750_000_000.987, 1_750_000_001.002, 1_750_000_000.5]
    plain = logging.Formatter(TEXT)
    expected = [plain.formatTime(_record(created)) for created in instants]
    calls: list[str] = []
    strftime = logsafe.time.strftime

    def counting(fmt: str, t: Any) -> str:
        calls.append(fmt)
        return strftime(fmt, t)

    monkeypatch.setattr(logsafe.time, "strftime", counting)
    assert [formatter.formatTime(_record(created)) for created in instants] == expected
    assert len(calls) == 3
    monkeypatch.undo()
    # A format of its own is the stdlib's business, as before.
    assert formatter.formatTime(_record(instants[0]), "%H:%M") == plain.formatTime(
        _record(instants[0]), "%H:%M"
    )


@pytest.mark.parametrize(
    ("message", "request_id"),
    [("model=%s", "rid"), ("model=%s\n", "rid"), ("model=%s", "r\x1bid")],
)
def test_the_text_formatter_leaves_the_record_as_it_found_it(message: str, request_id: str) -> None:
    record = _record(1_750_000_000.25, message, "chat\u202e")
    record.request_id = request_id
    record.message = record.getMessage()
    before = copy.copy(record.__dict__)
    line = TextFormatter(TEXT).format(record)
    assert "\u202e" not in line and "\x1b" not in line and "\n" not in line
    # What the stdlib's format() sets on every record, and nothing of the escaping.
    assert record.__dict__ == {**before, "asctime": line[:23]}
