from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from proxy.forwarding.rewrite import (
    InvalidBackendJSON,
    NDJSONRewriter,
    SSERewriter,
    UsageTracker,
    rewrite_json_model,
    usage_from_json,
)

PUBLIC = "llama-3-2"


def _feed_split(
    feed: Callable[[bytes], bytes], close: Callable[[], bytes], data: bytes, cut: int
) -> bytes:
    return feed(data[:cut]) + feed(data[cut:]) + close()


def _feed_bytewise(
    feed: Callable[[bytes], bytes], close: Callable[[], bytes], data: bytes
) -> bytes:
    return b"".join(feed(data[i : i + 1]) for i in range(len(data))) + close()


# ------------------------------------------------------------ rewrite_json_model


def test_it_replaces_a_top_level_string_model():
    out = rewrite_json_model(b'{"id":"x","model":"local","n":1}', PUBLIC)
    assert orjson.loads(out) == {"id": "x", "model": PUBLIC, "n": 1}


def test_it_never_inserts_a_model_key():
    body = b'{"data":[{"model":"local"}]}'
    assert rewrite_json_model(body, PUBLIC) == body


def test_it_leaves_nested_models_untouched_while_rewriting_the_top_level_one():
    out = rewrite_json_model(b'{"model":"local","meta":{"model":"local"}}', PUBLIC)
    assert orjson.loads(out) == {"model": PUBLIC, "meta": {"model": "local"}}


@pytest.mark.parametrize("value", [b"null", b"3", b'{"name":"local"}', b'["local"]'])
def test_it_leaves_a_model_that_is_not_a_string(value: bytes):
    body = b'{"model":' + value + b"}"
    assert rewrite_json_model(body, PUBLIC) == body


def test_it_returns_a_json_body_that_is_not_an_object_unchanged():
    body = b'["model", {"model": "local"}]'
    assert rewrite_json_model(body, PUBLIC) == body


def test_it_raises_on_invalid_json_that_mentions_model():
    with pytest.raises(InvalidBackendJSON):
        rewrite_json_model(b'{"model": "local", ', PUBLIC)


def test_it_skips_parsing_a_body_that_does_not_mention_model():
    body = b"this is not json at all"
    assert rewrite_json_model(body, PUBLIC) is body


def test_it_preserves_unicode_and_numbers_when_rewriting():
    original = {"model": "local", "text": "caf\u00e9 \u2603 <b>", "p": 0.1, "big": 2**63}
    out = rewrite_json_model(orjson.dumps(original), PUBLIC)
    assert orjson.loads(out) == {**original, "model": PUBLIC}


def test_it_returns_the_same_bytes_when_the_model_is_already_public():
    body = b'{ "model" : "llama-3-2" }'
    assert rewrite_json_model(body, PUBLIC) is body


# ------------------------------------------------------------ SSERewriter

SSE_IN = (
    b": keep-alive comment\n"
    b"\n"
    b"event: message\n"
    b"id: 7\n"
    b'data: {"id":"a","model":"local","choices":[{"delta":{"content":"hi"}}]}\n'
    b"\n"
    b'data:{"model":"local","nested":{"model":"local"}}\n'
    b"\n"
    b'data: not json but mentions "model"\n'
    b"\n"
    b'data: {"choices":[]}\n'
    b"\n"
    b'data: {"model":null}\n'
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
SSE_OUT = (
    b": keep-alive comment\n"
    b"\n"
    b"event: message\n"
    b"id: 7\n"
    b'data: {"id":"a","model":"llama-3-2","choices":[{"delta":{"content":"hi"}}]}\n'
    b"\n"
    b'data:{"model":"llama-3-2","nested":{"model":"local"}}\n'
    b"\n"
    b'data: not json but mentions "model"\n'
    b"\n"
    b'data: {"choices":[]}\n'
    b"\n"
    b'data: {"model":null}\n'
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)


def test_the_sse_rewriter_rewrites_data_lines_and_passes_everything_else():
    rewriter = SSERewriter(PUBLIC)
    assert rewriter.feed(SSE_IN) + rewriter.close() == SSE_OUT


def test_the_sse_rewriter_gives_the_same_output_for_a_split_at_every_offset():
    for cut in range(len(SSE_IN) + 1):
        rewriter = SSERewriter(PUBLIC)
        assert _feed_split(rewriter.feed, rewriter.close, SSE_IN, cut) == SSE_OUT, cut


def test_the_sse_rewriter_handles_a_stream_fed_one_byte_at_a_time():
    rewriter = SSERewriter(PUBLIC)
    assert _feed_bytewise(rewriter.feed, rewriter.close, SSE_IN) == SSE_OUT


def test_the_sse_rewriter_keeps_crlf_line_endings_at_every_split():
    crlf_in = SSE_IN.replace(b"\n", b"\r\n")
    crlf_out = SSE_OUT.replace(b"\n", b"\r\n")
    for cut in range(len(crlf_in) + 1):
        rewriter = SSERewriter(PUBLIC)
        assert _feed_split(rewriter.feed, rewriter.close, crlf_in, cut) == crlf_out, cut


def test_the_sse_rewriter_emits_nothing_for_a_partial_line_until_it_completes():
    rewriter = SSERewriter(PUBLIC)
    assert rewriter.feed(b'data: {"model":"lo') == b""
    assert rewriter.feed(b'cal"}\n\n') == b'data: {"model":"llama-3-2"}\n\n'


def test_the_sse_rewriter_rewrites_a_last_line_without_a_terminator_on_close():
    rewriter = SSERewriter(PUBLIC)
    assert rewriter.feed(b'data: {"model":"local"}') == b""
    assert rewriter.close() == b'data: {"model":"llama-3-2"}'


def test_the_sse_rewriter_streams_an_over_long_line_through_and_recovers_after_it():
    long_line = b'data: {"model":"local","pad":"' + b"x" * 200 + b'"}\n'
    stream = long_line + b'data: {"model":"local"}\n\n'
    rewriter = SSERewriter(PUBLIC, max_line_bytes=64)
    out = b"".join(rewriter.feed(stream[i : i + 50]) for i in range(0, len(stream), 50))
    out += rewriter.close()
    assert out == long_line + b'data: {"model":"llama-3-2"}\n\n'


# ------------------------------------------------------------ NDJSONRewriter

NDJSON_IN = (
    b'{"model":"local","message":{"role":"assistant","content":"a"},"done":false}\n'
    b'{"error":"model \\"local\\" crashed"}\n'
    b"\n"
    b'{"model":"local","done":true,"nested":{"model":"local"}}\n'
)
NDJSON_OUT = (
    b'{"model":"llama-3-2","message":{"role":"assistant","content":"a"},"done":false}\n'
    b'{"error":"model \\"local\\" crashed"}\n'
    b"\n"
    b'{"model":"llama-3-2","done":true,"nested":{"model":"local"}}\n'
)


def test_the_ndjson_rewriter_rewrites_records_and_keeps_newlines():
    rewriter = NDJSONRewriter(PUBLIC)
    assert rewriter.feed(NDJSON_IN) + rewriter.close() == NDJSON_OUT


def test_the_ndjson_rewriter_gives_the_same_output_for_a_split_at_every_offset():
    for cut in range(len(NDJSON_IN) + 1):
        rewriter = NDJSONRewriter(PUBLIC)
        assert _feed_split(rewriter.feed, rewriter.close, NDJSON_IN, cut) == NDJSON_OUT, cut


def test_the_ndjson_rewriter_handles_a_stream_fed_one_byte_at_a_time():
    rewriter = NDJSONRewriter(PUBLIC)
    assert _feed_bytewise(rewriter.feed, rewriter.close, NDJSON_IN) == NDJSON_OUT


def test_the_ndjson_rewriter_keeps_crlf_boundaries_at_every_split():
    crlf_in = NDJSON_IN.replace(b"\n", b"\r\n")
    crlf_out = NDJSON_OUT.replace(b"\n", b"\r\n")
    for cut in range(len(crlf_in) + 1):
        rewriter = NDJSONRewriter(PUBLIC)
        assert _feed_split(rewriter.feed, rewriter.close, crlf_in, cut) == crlf_out, cut


def test_the_ndjson_rewriter_keeps_boundaries_when_the_public_id_is_shorter():
    rewriter = NDJSONRewriter("m")
    out = rewriter.feed(b'{"model":"a-much-longer-local-id"}\n{"model":"x"}\n') + rewriter.close()
    assert out == b'{"model":"m"}\n{"model":"m"}\n'


def test_the_ndjson_rewriter_rejects_a_record_that_is_not_json():
    rewriter = NDJSONRewriter(PUBLIC)
    with pytest.raises(InvalidBackendJSON):
        rewriter.feed(b'{"model":"local"}\nnot json\n')


def test_the_ndjson_rewriter_rejects_a_truncated_final_record_on_close():
    rewriter = NDJSONRewriter(PUBLIC)
    rewriter.feed(b'{"model":"local","done":')
    with pytest.raises(InvalidBackendJSON):
        rewriter.close()


def test_the_ndjson_rewriter_rejects_an_over_long_complete_record():
    rewriter = NDJSONRewriter(PUBLIC, max_record_bytes=32)
    with pytest.raises(InvalidBackendJSON):
        rewriter.feed(b'{"model":"local","pad":"' + b"x" * 40 + b'"}\n')


def test_the_ndjson_rewriter_rejects_an_over_long_record_before_it_ends():
    rewriter = NDJSONRewriter(PUBLIC, max_record_bytes=32)
    rewriter.feed(b'{"model":"local","pad":"')
    with pytest.raises(InvalidBackendJSON):
        rewriter.feed(b"x" * 40)


def test_the_ndjson_rewriter_accepts_a_record_exactly_at_the_limit():
    record = b'{"model":"local","p":"' + b"x" * 10 + b'"}'
    rewriter = NDJSONRewriter(PUBLIC, max_record_bytes=len(record))
    assert rewriter.feed(record + b"\n") == b'{"model":"llama-3-2","p":"xxxxxxxxxx"}\n'


# ------------------------------------------------------------ UsageTracker

USAGE = {"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46}


def _chunk(content: str) -> bytes:
    payload = {"model": "local", "choices": [{"delta": {"content": content}}], "usage": None}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _usage_chunk() -> bytes:
    return b"data: " + orjson.dumps({"model": "local", "choices": [], "usage": USAGE}) + b"\n\n"


def test_the_usage_tracker_finds_the_usage_of_the_final_chunk():
    tracker = UsageTracker()
    tracker.feed(_chunk("a") + _chunk("b") + _usage_chunk() + b"data: [DONE]\n\n")
    assert tracker.usage() == USAGE


def test_the_usage_tracker_is_not_fooled_by_null_usage_or_a_usage_token():
    tracker = UsageTracker()
    tracker.feed(_usage_chunk() + _chunk("usage") + _chunk("x") + b"data: [DONE]\n\n")
    assert tracker.usage() == USAGE


def test_the_usage_tracker_returns_none_when_the_stream_has_no_usage():
    tracker = UsageTracker()
    tracker.feed(_chunk("a") + b"data: [DONE]\n\n")
    assert tracker.usage() is None


def test_the_usage_tracker_finds_usage_split_at_every_offset():
    stream = _chunk("a") + _usage_chunk() + b"data: [DONE]\n\n"
    for cut in range(len(stream) + 1):
        tracker = UsageTracker()
        tracker.feed(stream[:cut])
        tracker.feed(stream[cut:])
        assert tracker.usage() == USAGE, cut


def test_the_usage_tracker_reads_a_final_usage_line_without_a_terminator():
    tracker = UsageTracker()
    tracker.feed(_chunk("a") + _usage_chunk().rstrip(b"\n"))
    assert tracker.usage() == USAGE


def test_the_usage_tracker_keeps_bounded_memory_over_a_long_stream():
    cap = 1024
    tracker = UsageTracker(cap_bytes=cap)
    piece = _chunk("token ") + _usage_chunk()
    # An over-long line arriving in pieces must be dropped, not accumulated.
    huge = b'data: {"usage":{"prompt_tokens":1},"pad":"' + b"y" * 10 * cap + b'"}\n\n'
    stream = piece * 2000 + huge + piece * 10
    for start in range(0, len(stream), 333):
        tracker.feed(stream[start : start + 333])
        assert tracker.buffered_bytes <= cap
    assert tracker.usage() == USAGE


def test_the_usage_tracker_ignores_a_usage_line_longer_than_its_cap():
    tracker = UsageTracker(cap_bytes=64)
    tracker.feed(b'data: {"usage":{"prompt_tokens":1},"pad":"' + b"z" * 100 + b'"}\n\n')
    assert tracker.usage() is None


def test_usage_from_json_reads_a_non_streaming_body():
    assert usage_from_json(orjson.dumps({"choices": [], "usage": USAGE})) == USAGE


@pytest.mark.parametrize(
    "body", [b"{", b"[]", b'{"choices":[]}', b'{"usage":null}', b'{"usage":3}', b""]
)
def test_usage_from_json_returns_none_for_a_body_without_usable_usage(body: bytes):
    assert usage_from_json(body) is None
