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
import json
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
    # Every character the pattern matches is one `str.isprintable` refuses (a test goes through
    # every code point), and that C loop costs under half the search on nearly every text;
    # the search decides about what isprintable refuses for other reasons (a no-break space).
    if text.isprintable():
        return text
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Whether the format shows the time: the stdlib asks its format string every line.
        self._uses_time = self.usesTime()

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        # logging.Formatter.format for a line without traceback or stack, less its question.
        record.message = record.getMessage()
        if self._uses_time:
            record.asctime = self.formatTime(record, self.datefmt)
        return self.formatMessage(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        message = record.message
        if (message.isprintable() or _UNSAFE_RE.search(message) is None) and (
            not isinstance(request_id, str)
            or request_id.isprintable()
            or _UNSAFE_RE.search(request_id) is None
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
        # json.dumps, given an encoder class, makes an encoder of it for every line: this is
        # the one it would make, made once (an encoder keeps no state between calls).
        self._encoder: json.JSONEncoder | None = None
        if self.json_serializer is json.dumps:
            self._encoder = (self.json_encoder or json.JSONEncoder)(
                skipkeys=False,
                ensure_ascii=self.json_ensure_ascii,
                check_circular=True,
                allow_nan=True,
                indent=self.json_indent,
                separators=None,
                default=self.json_default,
                sort_keys=False,
            )

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        for key, value in log_data.items():
            # A printable string holds nothing to escape (see `escape`), nor does each of its
            # lines: most fields of most lines are left here, without a call.
            if isinstance(value, str) and not value.isprintable():
                unescaped = key in _UNESCAPED_FIELDS
                log_data[key] = _escape_trace(value) if unescaped else escape(value)
        return dict(super().process_log_record(log_data))

    def jsonify_log_record(self, log_data: dict[str, Any]) -> str:
        if self._encoder is None:
            return str(super().jsonify_log_record(log_data))
        return self._encoder.encode(log_data)
