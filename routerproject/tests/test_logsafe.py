"""The log formatters' timestamps and their untouched records (the escaping itself is tested on
a real node, tests/test_hardening_27.py)."""

from __future__ import annotations

import copy
import datetime
import json
import logging
import sys
from typing import Any

import pytest
from pythonjsonlogger.json import JsonEncoder, JsonFormatter

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


def test_every_character_escaped_is_one_isprintable_refuses() -> None:
    # escape() and the text formatter skip the search on a printable text: this keeps it sound.
    matched = [c for c in range(0x110000) if logsafe._UNSAFE_RE.match(chr(c))]
    assert len(matched) > 0x40
    assert [hex(c) for c in matched if chr(c).isprintable()] == []


@pytest.mark.parametrize(
    "text", ["chat", "", "caf\u00e9 \u00a0nbsp", "zero\u200bwidth", "\ue000", "a\nb\u202e", "\x85"]
)
def test_escape_is_the_substitution_it_stands_for(text: str) -> None:
    assert logsafe.escape(text) == logsafe._UNSAFE_RE.sub(logsafe._visible, text)


def test_the_text_line_is_the_stdlibs_and_the_time_is_formatted_only_when_shown() -> None:
    record = _record(1_750_000_000.25, "model=%s \u00a0", "chat")
    assert TextFormatter(TEXT).format(record) == logging.Formatter(TEXT).format(_copy(record))
    bare = _record(1_750_000_000.25)
    assert TextFormatter("%(message)s").format(bare) == "GET /v1 status=200"
    assert not hasattr(bare, "asctime")


def test_a_line_with_a_traceback_is_the_stdlibs_with_the_trace_escaped() -> None:
    try:
        raise ValueError("bad\x1b")
    except ValueError:
        record = _record(1_750_000_000.25)
        record.exc_info = sys.exc_info()
    line = TextFormatter(TEXT).format(record)
    assert line.startswith("2025-06-15 ") and "ValueError: bad\\x1b" in line
    assert line.split("\n")[0] == logging.Formatter(TEXT).format(_record(1_750_000_000.25))


def _copy(record: logging.LogRecord) -> logging.LogRecord:
    return copy.copy(record)


@pytest.mark.parametrize("indent", [None, 2])
def test_the_json_line_is_what_json_dumps_writes(indent: int | None) -> None:
    formatter = SafeJsonFormatter("%(message)s", json_indent=indent)
    data: dict[str, Any] = {
        "message": "caf\u00e9",
        "ms": 1.25,
        "lent_to": None,
        "when": datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
        "nested": {"a": [1, 2.5, True]},
    }
    expected = json.dumps(data, cls=JsonEncoder, ensure_ascii=False, indent=indent)
    assert formatter.jsonify_log_record(data) == expected


def test_a_clean_json_line_is_the_one_the_library_writes() -> None:
    fmt = "%(asctime)s %(levelname)s %(name)s %(message)s"
    record = _record(1_750_000_000.25, "POST /v1 model=%s", "caf\u00e9")
    record.__dict__.update({"event": "access", "lent": False, "key_name": None, "ms": 1.2})
    plain = JsonFormatter(fmt, json_ensure_ascii=False)
    assert SafeJsonFormatter(fmt).format(_copy(record)) == plain.format(_copy(record))
