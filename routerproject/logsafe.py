"""Log lines that client text cannot forge or hide: the formatters of the text and JSON logs.

A model name, a path, a header value or any other text a client sends reaches log lines (the
access line, warnings that quote what was refused). Written raw, a newline in it starts a line
that reads as the node's own, a carriage return or an ANSI escape rewrites what a terminal
shows, a NUL cuts the line for some tools and a right-to-left override reverses what follows.
So every message, and every string field a JSON line carries, goes through `escape`: control
characters (C0, DEL, C1), the Unicode line and paragraph separators and the bidirectional
controls become visible escapes (`\\n`, `\\x1b`, `\\u202e`); every other character, UTF-8
names included, is written as it is. Escaping at the formatter covers every logger, including
lines we never wrote ourselves.

A backslash is left as it is: escaping it would double the ones `%r` already writes, and a
literal `\\n` a client types forges no line.

Stdlib only (and python-json-logger): the logging configuration loads this before Django is set up.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from typing import Any

from pythonjsonlogger.json import JsonFormatter

_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Tracebacks: multi-line on purpose, so only each line is escaped.
_UNESCAPED_FIELDS = frozenset({"exc_info", "exc_text", "stack_info"})


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """`text` with every character that could forge, rewrite or hide a log line made visible."""
    return _UNSAFE_RE.sub(_visible, text)


def _escape_trace(text: str) -> str:
    # A traceback keeps its lines; what an exception's message quotes loses its other tricks.
    return "\n".join(escape(line) for line in text.split("\n"))


class _SecondStamp(logging.Formatter):
    """`formatTime` that formats each second's date and time once: every line of one second
    shares it (the access line made `time.strftime` a per-request cost), with the record's own
    milliseconds appended as `logging.Formatter` does."""

    # (whole second, its formatted date and time): one tuple, read and swapped whole, so
    # threads logging at once never pair one second with another's text.
    _stamp: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        stamp = self._stamp
        if stamp[0] != second:
            stamp = (second, time.strftime(self.default_time_format, self.converter(second)))
            self._stamp = stamp
        if not self.default_msec_format:
            return stamp[1]
        return self.default_msec_format % (stamp[1], record.msecs)


class TextFormatter(_SecondStamp):
    """The text log's formatter: the message and the request ID escaped, the rest as usual."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        if _UNSAFE_RE.search(record.message) is None and (
            not isinstance(request_id, str) or _UNSAFE_RE.search(request_id) is None
        ):
            # Nothing to escape (nearly every line): format the record itself, uncopied.
            return super().formatMessage(record)
        safe = copy.copy(record)
        safe.message = escape(record.message)
        if isinstance(request_id, str):
            safe.request_id = escape(request_id)
        return super().formatMessage(safe)

    def formatException(self, ei: Any) -> str:
        return _escape_trace(super().formatException(ei))


class SafeJsonFormatter(_SecondStamp, JsonFormatter):
    """The JSON log's formatter: every string field escaped, UTF-8 written as it is (JSON's own
    `\\u` escapes would make every non-ASCII name unreadable to an operator reading the file)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("json_ensure_ascii", False)
        super().__init__(*args, **kwargs)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        for key, value in log_data.items():
            if isinstance(value, str):
                unescaped = key in _UNESCAPED_FIELDS
                log_data[key] = _escape_trace(value) if unescaped else escape(value)
        return dict(super().process_log_record(log_data))
