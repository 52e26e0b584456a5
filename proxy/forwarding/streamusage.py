"""Token counts of OpenAI streams: asked of the backend always, shown to the client on request.

llama-server, like OpenAI, puts `usage` in a stream only when the request carries
`stream_options.include_usage`. The router needs the counts of every request (analytics, the
cost fits that lending prices with), so it adds the option when a client left it out, and
takes the usage back out of what that client sees: its stream looks as it would without the
router.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.forwarding.rewrite import LineFilter, split_lines

# The OpenAI paths whose streams carry `usage` when asked.
TEXT_STREAM_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# A usage chunk is a few hundred bytes: a longer line is content and passes through whole.
MAX_USAGE_LINE_BYTES = 64 * 1024

_USAGE_KEY = b'"usage"'
_DATA_PREFIX = b"data:"


def ask_for_usage(body: bytes) -> bytes | None:
    """The streaming request `body` with `include_usage` set; None when it needs no change.

    A body that already asks, is not a streaming JSON object, or carries a `stream_options`
    that is not an object (the backend's own error answers that) goes as it came.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("stream") is not True:
        return None
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return None
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    doc["stream_options"] = {**(options or {}), "include_usage": True}
    return orjson.dumps(doc)


def _strip_line(line: bytes) -> bytes | None:
    """The SSE line without its usage; None when the whole event is the usage chunk."""
    if not line.startswith(_DATA_PREFIX) or _USAGE_KEY not in line:
        return line
    body = line[len(_DATA_PREFIX) :]
    terminator = b"\r\n" if body.endswith(b"\r\n") else b"\n" if body.endswith(b"\n") else b""
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return line
    if not isinstance(doc, dict) or "usage" not in doc:
        return line
    choices = doc.get("choices")
    if not choices:
        # The chunk that only carries the usage (choices: []) exists only because it was asked.
        return None
    del doc["usage"]
    return _DATA_PREFIX + b" " + orjson.dumps(doc) + terminator


class UsageStripper(LineFilter):
    """Remove `usage` from an OpenAI SSE stream, byte-exact everywhere else.

    A dropped usage event takes its blank separator line with it, so the client never sees
    an empty event.
    """

    def __init__(self, *, max_line_bytes: int = MAX_USAGE_LINE_BYTES) -> None:
        super().__init__(max_line_bytes)
        self._drop_blank = False

    def _passing_through(self) -> None:
        self._drop_blank = False

    def _filter(self, region: bytes) -> bytes:
        if _USAGE_KEY not in region and not self._drop_blank:
            return region
        out: list[bytes] = []
        for line in split_lines(region):
            if self._drop_blank:
                self._drop_blank = False
                if line.strip() == b"":
                    continue
            stripped = _strip_line(line)
            if stripped is None:
                self._drop_blank = True
                continue
            out.append(stripped)
        return b"".join(out)
