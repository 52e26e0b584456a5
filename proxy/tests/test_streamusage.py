"""Usage in streams: the backend is always asked for it; a client that did not ask never sees it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.forwarding.streamusage import UsageStripper, ask_for_usage


def _body(**doc: Any) -> bytes:
    return orjson.dumps(doc)


def test_a_stream_that_did_not_ask_gets_include_usage_added() -> None:
    asked = ask_for_usage(_body(model="m", stream=True, messages=[]))
    assert asked is not None
    assert orjson.loads(asked) == {
        "model": "m",
        "stream": True,
        "messages": [],
        "stream_options": {"include_usage": True},
    }


def test_the_clients_other_stream_options_are_kept() -> None:
    asked = ask_for_usage(_body(stream=True, stream_options={"include_usage": False, "x": 1}))
    assert asked is not None
    assert orjson.loads(asked)["stream_options"] == {"include_usage": True, "x": 1}


@pytest.mark.parametrize(
    "body",
    [
        _body(stream=True, stream_options={"include_usage": True}),
        _body(stream=False),
        _body(model="m"),
        _body(stream="yes"),
        _body(stream=True, stream_options="include_usage"),
        b"[1, 2]",
        b"not json",
    ],
)
def test_a_body_that_asked_or_is_no_stream_goes_unchanged(body: bytes) -> None:
    assert ask_for_usage(body) is None


CONTENT = b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"usage"}}],"usage":null}\n\n'
FINAL = b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
USAGE = (
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,'
    b'"total_tokens":12},"timings":{"predicted_n":3}}\n\n'
)
DONE = b"data: [DONE]\n\n"
STREAM = CONTENT + FINAL + USAGE + DONE


def _strip_in_pieces(data: bytes, size: int) -> bytes:
    stripper = UsageStripper()
    out = b"".join(stripper.feed(data[i : i + size]) for i in range(0, len(data), size))
    return out + stripper.close()


def _events(data: bytes) -> list[dict[str, Any] | str]:
    out: list[dict[str, Any] | str] = []
    for block in data.split(b"\n\n"):
        if block:
            payload = block.removeprefix(b"data: ")
            out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(STREAM)])
def test_the_usage_chunk_and_every_usage_key_leave_the_stream_however_it_is_split(
    size: int,
) -> None:
    out = _strip_in_pieces(STREAM, size)
    # The usage-only event goes whole, blank separator included; "usage" as content stays.
    assert out.count(b"\n\n") == 3 and b"\n\n\n" not in out
    events = _events(out)
    assert len(events) == 3 and events[-1] == "[DONE]"
    first, final = events[0], events[1]
    assert isinstance(first, dict) and isinstance(final, dict)
    assert first == {"id": "c1", "choices": [{"index": 0, "delta": {"content": "usage"}}]}
    assert out.endswith(FINAL + DONE)


def test_a_stream_without_usage_passes_byte_for_byte() -> None:
    plain = FINAL.replace(b"\n\n", b"\r\n\r\n") + b": keep-alive\n\n" + DONE
    assert _strip_in_pieces(plain, 3) == plain


def test_a_crlf_usage_event_is_dropped_with_its_separator() -> None:
    crlf = USAGE.replace(b"\n", b"\r\n") + DONE
    assert _strip_in_pieces(crlf, 5) == DONE


def test_a_line_longer_than_any_usage_chunk_passes_through_whole() -> None:
    long_line = b'data: {"choices":[{"delta":{"content":"' + b"u" * 300 + b'"}}],"usage":{}}\n\n'
    stripper = UsageStripper(max_line_bytes=64)
    out = b"".join(stripper.feed(long_line[i : i + 50]) for i in range(0, len(long_line), 50))
    out += stripper.feed(USAGE + DONE) + stripper.close()
    assert out == long_line + DONE
