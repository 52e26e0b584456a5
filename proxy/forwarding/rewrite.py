"""Rewrite backend-local model IDs back to the public ID a client asked for.

Pure byte-level helpers used on the proxy's hot path (reference-cluster §4.3-4.4).
Nothing here knows about HTTP or Django: callers feed bytes and get bytes back.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# Ollama's NDJSON records are small; a bigger one means a broken or hostile backend.
NDJSON_MAX_RECORD_BYTES = 4 * 1024 * 1024
# SSE lines can legitimately carry base64 images (image progress streams), so the
# cap is generous; past it the line is passed through untouched instead of failing.
SSE_MAX_LINE_BYTES = 16 * 1024 * 1024
# The usage chunk of an OpenAI stream is tiny; keeping only this much bounds memory
# no matter how long the stream is.
USAGE_TRACKER_CAP_BYTES = 16 * 1024

_MODEL_KEY = b'"model"'
_USAGE_KEY = b'"usage"'
_DATA_PREFIX = b"data:"
_DONE_PAYLOAD = b"[DONE]"
# `"usage": null` shows up on every chunk of some streams; only an object is useful.
# A content token that happens to be the string "usage" is followed by `,` or `}`,
# never by `:{`, so this cannot be fooled by generated text.
_USAGE_OBJECT_RE = re.compile(rb'"usage"\s*:\s*\{')


class InvalidBackendJSON(ValueError):
    """A backend response that must be JSON is not (the router answers 502)."""


def rewrite_json_model(body: bytes, public_id: str) -> bytes:
    """Replace a top-level string ``model`` with ``public_id``; never insert one.

    The substring test is a deliberate fast path: a body that does not mention
    ``"model"`` cannot need rewriting, so it is not parsed (and therefore not
    validated either). A key spelled with JSON escapes is not recognised; no
    backend writes its own keys that way.
    """
    # `find`, not `in`: CPython's `in` on bytes first tries the needle as an integer, and
    # raises and clears a formatted TypeError before it searches (a third of the test's cost).
    if body.find(_MODEL_KEY) < 0:
        return body
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidBackendJSON("backend returned invalid json") from exc
    if not isinstance(obj, dict):
        return body
    current = obj.get("model")
    if not isinstance(current, str) or current == public_id:
        return body
    obj["model"] = public_id
    return orjson.dumps(obj)


class LineBuffer:
    """Reassemble ``\\n``-terminated lines from chunks split at arbitrary offsets.

    ``take`` hands back one contiguous region of complete lines (terminators
    included) so callers can run a cheap substring check over the whole region
    before splitting it. The unfinished tail is kept in a bytearray so a long
    line arriving in many small chunks costs linear, not quadratic, time.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = bytearray()

    @property
    def pending_len(self) -> int:
        return len(self._pending)

    def take(self, chunk: bytes) -> bytes:
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            self._pending += chunk
            return b""
        if self._pending:
            region = bytes(self._pending) + chunk[:cut]
        else:
            region = chunk if cut == len(chunk) else chunk[:cut]
        self._pending = bytearray(chunk[cut:])
        return region

    def drain(self) -> bytes:
        rest = bytes(self._pending)
        self._pending = bytearray()
        return rest


def split_lines(region: bytes) -> list[bytes]:
    """Split on LF only, keeping each terminator (a CR stays attached to its CRLF).

    ``bytes.splitlines`` is avoided because it also breaks at a bare CR, and
    LineBuffer only ever delimits lines at LF; both must agree on what a line is.
    """
    parts = region.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _strip_terminator(line: bytes) -> tuple[bytes, bytes]:
    if line.endswith(b"\r\n"):
        return line[:-2], b"\r\n"
    if line.endswith(b"\n"):
        return line[:-1], b"\n"
    return line, b""


def _rewrite_sse_line(line: bytes, public_id: str) -> bytes:
    if not line.startswith(_DATA_PREFIX) or _MODEL_KEY not in line:
        return line
    content, terminator = _strip_terminator(line)
    prefix_len = len(_DATA_PREFIX)
    if content[prefix_len : prefix_len + 1] == b" ":
        prefix_len += 1
    payload = content[prefix_len:]
    if payload == _DONE_PAYLOAD:
        return line
    try:
        rewritten = rewrite_json_model(payload, public_id)
    except InvalidBackendJSON:
        # The reference drops such lines; passing them on loses nothing for the client.
        return line
    if rewritten is payload:
        return line
    return content[:prefix_len] + rewritten + terminator


class LineFilter:
    """A stream filter over whole ``\n``-terminated lines.

    Each region of complete lines goes through ``_filter``. A line longer than the cap is passed
    on verbatim until its end instead of being buffered, so a filter's memory stays bounded
    whatever the backend sends.
    """

    def __init__(self, max_line_bytes: int) -> None:
        self._max_line_bytes = max_line_bytes
        self._lines = LineBuffer()
        # Set while an over-long line is streamed through verbatim until its end.
        self._passthrough = False

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        head = b""
        if self._passthrough:
            end = chunk.find(b"\n") + 1
            if end == 0:
                return chunk
            self._passthrough = False
            head, chunk = chunk[:end], chunk[end:]
        region = self._lines.take(chunk)
        out = head + self._filter(region) if region else head
        if self._lines.pending_len > self._max_line_bytes:
            self._passthrough = True
            self._passing_through()
            out += self._lines.drain()
        return out

    def close(self) -> bytes:
        if self._passthrough:
            self._passthrough = False
            return b""
        rest = self._lines.drain()
        return self._filter_last(rest) if rest else b""

    def _filter(self, region: bytes) -> bytes:
        raise NotImplementedError

    def _filter_last(self, line: bytes) -> bytes:
        """The unterminated line a stream may end with."""
        return self._filter(line)

    def _passing_through(self) -> None:
        """Called when an over-long line starts to pass through unfiltered."""


class SSERewriter(LineFilter):
    """Rewrite the top-level ``model`` of every JSON ``data:`` line of an SSE stream.

    Every byte that is not a rewritten JSON payload is emitted exactly as
    received, so blank lines (event boundaries) and line endings survive.
    """

    def __init__(self, public_id: str, *, max_line_bytes: int = SSE_MAX_LINE_BYTES) -> None:
        super().__init__(max_line_bytes)
        self._public_id = public_id

    def _filter_last(self, line: bytes) -> bytes:
        return _rewrite_sse_line(line, self._public_id)

    def _filter(self, region: bytes) -> bytes:
        if _MODEL_KEY not in region:
            return region
        return b"".join(_rewrite_sse_line(line, self._public_id) for line in split_lines(region))


class NDJSONRewriter:
    """Rewrite the top-level ``model`` of each record of an Ollama NDJSON stream.

    Unlike SSE, every record must be JSON: a broken record or one over the size
    cap raises InvalidBackendJSON and the caller aborts the stream.
    """

    def __init__(self, public_id: str, max_record_bytes: int = NDJSON_MAX_RECORD_BYTES) -> None:
        self._public_id = public_id
        self._max_record_bytes = max_record_bytes
        self._lines = LineBuffer()

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        region = self._lines.take(chunk)
        if self._lines.pending_len > self._max_record_bytes:
            raise InvalidBackendJSON("backend ndjson record exceeds the size limit")
        if not region:
            return b""
        return b"".join(self._rewrite_record(line) for line in split_lines(region))

    def close(self) -> bytes:
        rest = self._lines.drain()
        return self._rewrite_record(rest) if rest else b""

    def _rewrite_record(self, line: bytes) -> bytes:
        content, terminator = _strip_terminator(line)
        if len(content) > self._max_record_bytes:
            raise InvalidBackendJSON("backend ndjson record exceeds the size limit")
        if not content.strip():
            return line
        try:
            obj = orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            raise InvalidBackendJSON("backend returned invalid json") from exc
        if not isinstance(obj, dict):
            return line
        current = obj.get("model")
        if not isinstance(current, str) or current == self._public_id:
            return line
        obj["model"] = self._public_id
        return orjson.dumps(obj) + terminator


class UsageTracker:
    """Remember the last ``usage`` object seen in an OpenAI SSE stream.

    Only the unfinished tail line and the last candidate line are kept, together
    at most ``cap_bytes``; a line that does not fit is skipped, which is safe
    because real usage chunks are a few hundred bytes.
    """

    def __init__(self, cap_bytes: int = USAGE_TRACKER_CAP_BYTES) -> None:
        self._cap_bytes = cap_bytes
        self._lines = LineBuffer()
        self._last: bytes | None = None
        # Set while discarding the rest of an over-long line.
        self._skipping = False

    @property
    def buffered_bytes(self) -> int:
        return self._lines.pending_len + (len(self._last) if self._last is not None else 0)

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._skipping:
            end = chunk.find(b"\n") + 1
            if end == 0:
                return
            self._skipping = False
            chunk = chunk[end:]
        region = self._lines.take(chunk)
        if region and _USAGE_KEY in region:
            self._remember(region)
        if self.buffered_bytes > self._cap_bytes:
            self._lines.drain()
            self._skipping = True

    def usage(self) -> dict[str, Any] | None:
        rest = self._lines.drain()
        if rest and not self._skipping and _USAGE_KEY in rest:
            self._remember(rest)
        if self._last is None:
            return None
        content, _ = _strip_terminator(self._last)
        return usage_from_json(content[len(_DATA_PREFIX) :])

    def _remember(self, region: bytes) -> None:
        for line in reversed(split_lines(region)):
            if (
                line.startswith(_DATA_PREFIX)
                and len(line) <= self._cap_bytes
                and _USAGE_OBJECT_RE.search(line) is not None
            ):
                self._last = line
                return


def usage_from_json(body: bytes) -> dict[str, Any] | None:
    """The ``usage`` object of a JSON response, or None when absent or invalid."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    return usage if isinstance(usage, dict) else None
