from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.families.text import replies, translate
from proxy.families.text.replies import (
    OllamaStreamTranslator,
    openai_error_to_ollama,
    openai_to_kobold,
    openai_to_ollama_chat,
    openai_to_ollama_generate,
    rfc3339_utc,
)
from proxy.families.text.translate import (
    TranslationError,
    kobold_generate_request,
    ollama_chat_request,
    ollama_generate_request,
)

STARTED_NS = 1_700_000_000_000_000_000
NOW_NS = 1_700_000_001_500_000_123
NOW_TEXT = "2023-11-14T22:13:21.500000123Z"


# ------------------------------------------------------------ Ollama chat request


def test_an_ollama_chat_request_becomes_a_streaming_chat_completion_by_default():
    path, body, stream = ollama_chat_request(
        {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert path == "/v1/chat/completions"
    assert stream is True
    assert body == {
        "model": "llama",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_an_ollama_chat_request_with_stream_false_asks_for_no_usage_stream_options():
    _, body, stream = ollama_chat_request(
        {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    )
    assert stream is False
    assert body["stream"] is False
    assert "stream_options" not in body


def test_ollama_options_map_to_openai_sampling_fields():
    _, body, _ = ollama_chat_request(
        {
            "model": "llama",
            "messages": [],
            "stream": False,
            "options": {
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 40,
                "seed": 7,
                "stop": ["</s>", "\n\n"],
                "num_predict": 128,
                "repeat_penalty": 1.1,
                "presence_penalty": 0.5,
                "frequency_penalty": 0.25,
                "num_ctx": 4096,
            },
        }
    )
    assert body == {
        "model": "llama",
        "messages": [],
        "stream": False,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "stop": ["</s>", "\n\n"],
        "max_tokens": 128,
        "repeat_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
    }


def test_ollama_unlimited_num_predict_and_random_seed_are_left_to_the_backend():
    _, body, _ = ollama_chat_request(
        {"messages": [], "options": {"num_predict": -1, "seed": -1, "top_k": 40.0}}
    )
    assert "max_tokens" not in body
    assert "seed" not in body
    assert body["top_k"] == 40


def test_an_ollama_single_stop_string_becomes_a_list():
    _, body, _ = ollama_chat_request({"messages": [], "options": {"stop": "END"}})
    assert body["stop"] == ["END"]


def test_ollama_json_format_becomes_a_json_object_response_format():
    _, body, _ = ollama_chat_request({"messages": [], "format": "json"})
    assert body["response_format"] == {"type": "json_object"}


def test_an_ollama_schema_format_becomes_a_json_schema_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    _, body, _ = ollama_chat_request({"messages": [], "format": schema})
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema},
    }


def test_ollama_message_images_become_image_url_content_parts():
    _, body, _ = ollama_chat_request(
        {
            "model": "vision",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": "what is this?",
                    "images": ["QUJD", "data:image/jpeg;base64,REVG"],
                },
            ],
        }
    )
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,REVG"}},
            ],
        },
    ]


def test_an_empty_images_list_keeps_plain_string_content():
    _, body, _ = ollama_chat_request(
        {"messages": [{"role": "user", "content": "hi", "images": []}]}
    )
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_a_message_without_content_gets_empty_content():
    _, body, _ = ollama_chat_request({"messages": [{"role": "assistant"}]})
    assert body["messages"] == [{"role": "assistant", "content": ""}]


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 3}]},
            "messages[1].content",
        ),
        ({"messages": [{"role": "user", "content": "a", "images": "QUJD"}]}, "messages[0].images"),
        (
            {"messages": [{"role": "user", "content": "a", "images": ["QUJD", 5]}]},
            "messages[0].images[1]",
        ),
        ({"messages": [], "model": 3}, "model"),
        ({"messages": [], "stream": "yes"}, "stream"),
        ({"messages": [], "options": []}, "options"),
        ({"messages": [], "options": {"temperature": "hot"}}, "options.temperature"),
        ({"messages": [], "options": {"temperature": True}}, "options.temperature"),
        ({"messages": [], "options": {"top_k": 1.5}}, "options.top_k"),
        ({"messages": [], "options": {"num_predict": "10"}}, "options.num_predict"),
        ({"messages": [], "options": {"seed": 1.5}}, "options.seed"),
        ({"messages": [], "options": {"stop": [1]}}, "options.stop"),
        ({"messages": [], "format": "xml"}, "format"),
        ({"messages": [], "format": 5}, "format"),
    ],
)
def test_an_ollama_chat_field_of_the_wrong_type_names_that_field(
    request_body: dict[str, Any], param: str
):
    with pytest.raises(TranslationError) as caught:
        ollama_chat_request(request_body)
    assert caught.value.param == param
    assert param in caught.value.message


@pytest.mark.parametrize(
    "translate", [ollama_chat_request, ollama_generate_request, kobold_generate_request]
)
def test_a_body_that_is_not_an_object_is_refused(translate: Any):
    with pytest.raises(TranslationError) as caught:
        translate(["not", "an", "object"])
    assert caught.value.param is None


# ------------------------------------------------------------ Ollama generate request


def test_an_ollama_generate_request_becomes_a_completion_with_the_system_prefix():
    path, body, stream = ollama_generate_request(
        {
            "model": "llama",
            "prompt": "Why?",
            "system": "Answer briefly.",
            "options": {"num_predict": 5},
        }
    )
    assert path == "/v1/completions"
    assert stream is True
    assert body == {
        "model": "llama",
        "prompt": "Answer briefly.\n\nWhy?",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 5,
    }


def test_an_ollama_generate_request_without_system_sends_the_prompt_as_is():
    _, body, stream = ollama_generate_request({"model": "llama", "prompt": "Why?", "stream": False})
    assert stream is False
    assert body == {"model": "llama", "prompt": "Why?", "stream": False}


def test_an_ollama_generate_request_with_images_becomes_a_chat_completion():
    path, body, _ = ollama_generate_request(
        {
            "model": "vision",
            "prompt": "describe",
            "system": "You see images.",
            "images": ["QUJD"],
            "stream": False,
            "format": "json",
        }
    )
    assert path == "/v1/chat/completions"
    assert body == {
        "model": "vision",
        "messages": [
            {"role": "system", "content": "You see images."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "describe"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                ],
            },
        ],
        "stream": False,
        "response_format": {"type": "json_object"},
    }


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"prompt": ["a"]}, "prompt"),
        ({"prompt": "a", "system": 1}, "system"),
        ({"prompt": "a", "images": "QUJD"}, "images"),
        ({"prompt": "a", "images": [None]}, "images[0]"),
        ({"prompt": "a", "options": {"top_p": "x"}}, "options.top_p"),
    ],
)
def test_an_ollama_generate_field_of_the_wrong_type_names_that_field(
    request_body: dict[str, Any], param: str
):
    with pytest.raises(TranslationError) as caught:
        ollama_generate_request(request_body)
    assert caught.value.param == param


# ------------------------------------------------------------ Kobold request


def test_a_kobold_generate_request_maps_its_sampling_fields():
    path, body, stream = kobold_generate_request(
        {
            "model": "llama",
            "prompt": "Once upon",
            "max_length": 80,
            "max_context_length": 4096,
            "temperature": 0.7,
            "top_p": 0.92,
            "top_k": 100,
            "rep_pen": 1.07,
            "stop_sequence": ["\nUser:"],
            "sampler_seed": 42,
            "stream": True,
        }
    )
    assert path == "/v1/completions"
    assert stream is False
    assert body == {
        "model": "llama",
        "prompt": "Once upon",
        "stream": False,
        "max_tokens": 80,
        "temperature": 0.7,
        "top_p": 0.92,
        "top_k": 100,
        "repeat_penalty": 1.07,
        "stop": ["\nUser:"],
        "seed": 42,
    }


def test_a_kobold_random_seed_and_missing_model_are_omitted():
    _, body, _ = kobold_generate_request({"prompt": "x", "sampler_seed": -1})
    assert body == {"prompt": "x", "stream": False}


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x", "max_length": "many"}, "max_length"),
        ({"prompt": "x", "rep_pen": [1]}, "rep_pen"),
        ({"prompt": "x", "stop_sequence": [1, 2]}, "stop_sequence"),
        ({"prompt": "x", "sampler_seed": "7"}, "sampler_seed"),
        ({"prompt": "x", "model": {}}, "model"),
    ],
)
def test_a_kobold_field_of_the_wrong_type_names_that_field(
    request_body: dict[str, Any], param: str
):
    with pytest.raises(TranslationError) as caught:
        kobold_generate_request(request_body)
    assert caught.value.param == param


# ------------------------------------------------------------ responses

CHAT_RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-1",
    "model": "local-id",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
}


def test_rfc3339_timestamps_are_utc_with_nanoseconds_and_z():
    assert rfc3339_utc(NOW_NS) == NOW_TEXT
    assert rfc3339_utc(0) == "1970-01-01T00:00:00.000000000Z"


def test_an_openai_chat_answer_becomes_an_ollama_chat_answer():
    out = openai_to_ollama_chat(CHAT_RESPONSE, model="public", started_ns=STARTED_NS, now_ns=NOW_NS)
    assert out == {
        "model": "public",
        "created_at": NOW_TEXT,
        "message": {"role": "assistant", "content": "Hello!"},
        "done": True,
        "done_reason": "stop",
        "total_duration": NOW_NS - STARTED_NS,
        "load_duration": 0,
        "prompt_eval_count": 9,
        "prompt_eval_duration": 0,
        "eval_count": 3,
        "eval_duration": 0,
    }


def test_a_length_finish_and_missing_usage_are_reported_ollama_style():
    resp = {"choices": [{"message": {"content": "cut"}, "finish_reason": "length"}]}
    out = openai_to_ollama_chat(resp, model="m", started_ns=STARTED_NS, now_ns=NOW_NS)
    assert out["done_reason"] == "length"
    assert (out["prompt_eval_count"], out["eval_count"]) == (0, 0)


def test_llama_server_timings_fill_the_ollama_durations():
    resp = {**CHAT_RESPONSE, "timings": {"prompt_ms": 12.5, "predicted_ms": 300.0}}
    out = openai_to_ollama_chat(resp, model="m", started_ns=STARTED_NS, now_ns=NOW_NS)
    assert out["prompt_eval_duration"] == 12_500_000
    assert out["eval_duration"] == 300_000_000


def test_reasoning_content_becomes_ollama_thinking():
    resp = {"choices": [{"message": {"content": "4", "reasoning_content": "2+2"}}]}
    out = openai_to_ollama_chat(resp, model="m", started_ns=STARTED_NS, now_ns=NOW_NS)
    assert out["message"] == {"role": "assistant", "content": "4", "thinking": "2+2"}


def test_a_malformed_answer_translates_to_empty_content_rather_than_failing():
    out = openai_to_ollama_chat({"choices": "?"}, model="m", started_ns=NOW_NS, now_ns=STARTED_NS)
    assert out["message"]["content"] == ""
    assert out["total_duration"] == 0


def test_an_openai_completion_becomes_an_ollama_generate_answer():
    resp = {
        "choices": [{"text": "42", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1},
    }
    out = openai_to_ollama_generate(resp, model="public", started_ns=STARTED_NS, now_ns=NOW_NS)
    assert out == {
        "model": "public",
        "created_at": NOW_TEXT,
        "response": "42",
        "done": True,
        "done_reason": "length",
        "total_duration": NOW_NS - STARTED_NS,
        "load_duration": 0,
        "prompt_eval_count": 4,
        "prompt_eval_duration": 0,
        "eval_count": 1,
        "eval_duration": 0,
        "context": [],
    }


def test_a_chat_answer_to_an_image_generate_fills_the_response_text():
    out = openai_to_ollama_generate(CHAT_RESPONSE, model="m", started_ns=STARTED_NS, now_ns=NOW_NS)
    assert out["response"] == "Hello!"


@pytest.mark.parametrize(
    ("finish", "expected"), [("stop", "stop"), ("length", "length"), (None, "stop")]
)
def test_an_openai_completion_becomes_a_kobold_result(finish: str | None, expected: str):
    resp = {"choices": [{"text": " there was", "finish_reason": finish}]}
    assert openai_to_kobold(resp) == {
        "results": [{"text": " there was", "finish_reason": expected}]
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"error":{"message":"context too long","type":"invalid_request_error"}}',
            "context too long",
        ),
        (b'{"error":"boom"}', "boom"),
        (b'{"object":"error","message":"vllm says no","code":400}', "vllm says no"),
        (b'{"detail":"Not Found"}', "Not Found"),
        (b"  upstream exploded \n", "upstream exploded"),
        (b"[1, 2]", "[1, 2]"),
        (b"", "backend returned an empty error"),
    ],
)
def test_openai_errors_become_ollama_errors(body: bytes, message: str):
    assert orjson.loads(openai_error_to_ollama(body)) == {"error": message}


# ------------------------------------------------------------ OllamaStreamTranslator


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


CHAT_STREAM = (
    b": ping\n\n"
    + _sse({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    + _sse({"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]})
    + _sse({"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": None}]})
    + _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    + _sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    + b"data: [DONE]\n\n"
)


def _chat_delta(text: str) -> dict[str, Any]:
    return {
        "model": "public",
        "created_at": NOW_TEXT,
        "message": {"role": "assistant", "content": text},
        "done": False,
    }


CHAT_FINAL = {
    "model": "public",
    "created_at": NOW_TEXT,
    "message": {"role": "assistant", "content": ""},
    "done": True,
    "done_reason": "length",
    "total_duration": NOW_NS - STARTED_NS,
    "load_duration": 0,
    "prompt_eval_count": 5,
    "prompt_eval_duration": 0,
    "eval_count": 2,
    "eval_duration": 0,
}


def _records(ndjson: bytes) -> list[dict[str, Any]]:
    assert ndjson.endswith(b"\n")
    return [orjson.loads(line) for line in ndjson.split(b"\n")[:-1]]


def _chat_translator() -> OllamaStreamTranslator:
    return OllamaStreamTranslator(kind="chat", model="public", started_ns=STARTED_NS)


def test_an_openai_chat_stream_becomes_ollama_ndjson_with_a_final_done_record():
    translator = _chat_translator()
    out = translator.feed(CHAT_STREAM, NOW_NS) + translator.finish(NOW_NS)
    assert _records(out) == [_chat_delta("Hel"), _chat_delta("lo"), CHAT_FINAL]


def test_the_stream_translator_gives_the_same_records_for_a_split_at_every_offset():
    translator = _chat_translator()
    expected = translator.feed(CHAT_STREAM, NOW_NS) + translator.finish(NOW_NS)
    for cut in range(len(CHAT_STREAM) + 1):
        translator = _chat_translator()
        out = translator.feed(CHAT_STREAM[:cut], NOW_NS)
        out += translator.feed(CHAT_STREAM[cut:], NOW_NS)
        assert out + translator.finish(NOW_NS) == expected, cut


def test_the_stream_translator_handles_crlf_fed_one_byte_at_a_time():
    stream = CHAT_STREAM.replace(b"\n", b"\r\n")
    translator = _chat_translator()
    out = b"".join(translator.feed(stream[i : i + 1], NOW_NS) for i in range(len(stream)))
    out += translator.finish(NOW_NS)
    assert _records(out) == [_chat_delta("Hel"), _chat_delta("lo"), CHAT_FINAL]


def test_a_stream_without_usage_reports_zero_counts():
    translator = _chat_translator()
    stream = _sse({"choices": [{"delta": {"content": "x"}, "finish_reason": "stop"}]})
    records = _records(translator.feed(stream, NOW_NS) + translator.finish(NOW_NS))
    assert records[-1]["done_reason"] == "stop"
    assert (records[-1]["prompt_eval_count"], records[-1]["eval_count"]) == (0, 0)


def test_an_openai_completion_stream_becomes_ollama_generate_records():
    stream = (
        _sse({"choices": [{"text": "4", "finish_reason": None}]})
        + _sse({"choices": [{"text": "2", "finish_reason": "stop"}]})
        + _sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        + b"data: [DONE]\n\n"
    )
    translator = OllamaStreamTranslator(kind="generate", model="public", started_ns=STARTED_NS)
    records = _records(translator.feed(stream, NOW_NS) + translator.finish(NOW_NS))
    delta = {"model": "public", "created_at": NOW_TEXT, "done": False}
    assert records[:2] == [{**delta, "response": "4"}, {**delta, "response": "2"}]
    assert records[2]["response"] == ""
    assert records[2]["done"] is True
    assert records[2]["context"] == []
    assert (records[2]["prompt_eval_count"], records[2]["eval_count"]) == (3, 2)


def test_a_chat_stream_answering_an_image_generate_fills_the_response_field():
    translator = OllamaStreamTranslator(kind="generate", model="public", started_ns=STARTED_NS)
    out = translator.feed(_sse({"choices": [{"delta": {"content": "a cat"}}]}), NOW_NS)
    assert _records(out)[0]["response"] == "a cat"


def test_a_streamed_backend_error_becomes_an_ollama_error_record_and_ends_the_stream():
    translator = _chat_translator()
    stream = (
        _sse({"choices": [{"delta": {"content": "a"}}]})
        + _sse({"error": {"message": "out of memory", "code": 500}})
        + _sse({"choices": [{"delta": {"content": "b"}}]})
    )
    out = translator.feed(stream, NOW_NS) + translator.finish(NOW_NS)
    assert _records(out) == [_chat_delta("a"), {"error": "out of memory"}]
    assert translator.errored is True


def test_the_stream_translator_skips_junk_lines_and_translates_a_last_unterminated_line():
    translator = _chat_translator()
    out = translator.feed(b"event: x\ndata: not json\ndata: [1]\n\n", NOW_NS)
    out += translator.feed(b'data: {"choices":[{"delta":{"content":"z"}}]}', NOW_NS)
    out += translator.finish(NOW_NS)
    records = _records(out)
    assert records[0] == _chat_delta("z")
    assert records[1]["done"] is True


def test_the_stream_translator_skips_an_over_long_line_and_recovers():
    translator = OllamaStreamTranslator(
        kind="chat", model="public", started_ns=STARTED_NS, max_line_bytes=64
    )
    stream = (
        b'data: {"choices":[{"delta":{"content":"'
        + b"x" * 200
        + b'"}}]}\n\n'
        + _sse({"choices": [{"delta": {"content": "ok"}}]})
    )
    out = b"".join(translator.feed(stream[i : i + 40], NOW_NS) for i in range(0, len(stream), 40))
    assert _records(out) == [_chat_delta("ok")]


def test_ollama_embed_bodies_become_openai_embeddings() -> None:
    assert translate.ollama_embed_request({"model": "m", "input": "a"}, legacy=False) == {
        "model": "m",
        "input": "a",
    }
    assert translate.ollama_embed_request({"model": "m", "prompt": "a"}, legacy=True) == {
        "model": "m",
        "input": "a",
    }
    for body, legacy, param in (
        ({"input": []}, False, "input"),
        ({"input": ["a", 2]}, False, "input"),
        ({"prompt": ["a"]}, True, "prompt"),
    ):
        with pytest.raises(translate.TranslationError) as err:
            translate.ollama_embed_request(body, legacy=legacy)
        assert err.value.param == param


def test_openai_embeddings_answers_become_ollama_ones_in_index_order() -> None:
    resp = {
        "data": [{"index": 1, "embedding": [0.2]}, {"index": 0, "embedding": [0.1]}],
        "usage": {"prompt_tokens": 4},
    }
    out = replies.openai_to_ollama_embed(
        resp, model="pub", legacy=False, started_ns=1_000, now_ns=3_500
    )
    assert out == {
        "model": "pub",
        "embeddings": [[0.1], [0.2]],
        "total_duration": 2_500,
        "load_duration": 0,
        "prompt_eval_count": 4,
    }
    legacy = replies.openai_to_ollama_embed(resp, model="pub", legacy=True, started_ns=0, now_ns=0)
    assert legacy == {"embedding": [0.1]}
    with pytest.raises(ValueError):
        replies.openai_to_ollama_embed(
            {"data": [{"embedding": "x"}]}, model="p", legacy=False, started_ns=0, now_ns=0
        )


# ------------------------------------------------------------ Ollama tools, think, keep_alive

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def test_ollama_tools_and_a_tool_call_history_become_openais() -> None:
    body = {
        "model": "m",
        "stream": False,
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"function": {"name": "get_time", "arguments": {}}},
                ],
            },
            {"role": "tool", "content": "12:00", "tool_name": "get_time"},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ],
    }
    _, out, _ = ollama_chat_request(body)
    assert out["tools"] == [WEATHER]
    calls = out["messages"][1]["tool_calls"]
    assert calls == [
        {
            "id": "call_1_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        },
        {"id": "call_1_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    # Each result answers the call of its tool, whatever order the results come in.
    assert [m.get("tool_call_id") for m in out["messages"][2:]] == ["call_1_1", "call_1_0"]


def test_a_tool_result_without_a_name_answers_the_oldest_open_call_and_ids_are_kept() -> None:
    messages = [
        {
            "role": "assistant",
            "tool_calls": [{"id": "abc", "function": {"name": "f", "arguments": {}}}],
        },
        {"role": "tool", "content": "1"},
        {"role": "tool", "content": "2", "tool_call_id": "given"},
    ]
    _, out, _ = ollama_chat_request({"model": "m", "messages": messages})
    assert [m.get("tool_call_id") for m in out["messages"][1:]] == ["abc", "given"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"function": {}}]}, "tools[0]"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}]},
            "messages[0].tool_calls[0].function.name",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": [1]}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"think": "very"}, "think"),
        ({"think": 1}, "think"),
        ({"keep_alive": "soon"}, "keep_alive"),
        ({"keep_alive": True}, "keep_alive"),
    ],
)
def test_a_bad_tool_think_or_keep_alive_field_is_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(TranslationError) as refused:
        ollama_chat_request({"model": "m", **body})
    assert refused.value.param == param


def test_think_becomes_the_chat_template_switch_and_a_level_the_reasoning_effort() -> None:
    _, on, _ = ollama_chat_request({"model": "m", "messages": [], "think": True})
    assert on["chat_template_kwargs"] == {"enable_thinking": True}
    assert "reasoning_effort" not in on
    _, off, _ = ollama_chat_request({"model": "m", "messages": [], "think": False})
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    _, high, _ = ollama_generate_request({"model": "m", "prompt": "x", "think": "high"})
    assert (high["chat_template_kwargs"], high["reasoning_effort"]) == (
        {"enable_thinking": True},
        "high",
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        ("0", 0.0),
        ("0s", 0.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        (-1, -1.0),
        ("-1m", -60.0),
        (2.5, 2.5),
    ],
)
def test_keep_alive_reads_seconds_and_go_durations(value: Any, seconds: float) -> None:
    assert translate.keep_alive_seconds({"keep_alive": value}) == seconds
    assert translate.keep_alive_seconds({}) is None


def test_a_request_without_messages_or_prompt_is_a_load_request() -> None:
    assert translate.is_load_request("chat", {"model": "m"})
    assert translate.is_load_request("chat", {"model": "m", "messages": []})
    assert not translate.is_load_request("chat", {"messages": [{"role": "user"}]})
    assert translate.is_load_request("generate", {"model": "m", "prompt": ""})
    assert not translate.is_load_request("generate", {"prompt": "hi"})
    assert not translate.is_load_request("generate", {"images": ["aGk="]})


def test_an_openai_tool_call_answer_becomes_ollamas() -> None:
    resp = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call-1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        },
                        {"id": "call-2", "function": {"name": "f", "arguments": "not json"}},
                    ],
                },
            }
        ]
    }
    out = openai_to_ollama_chat(resp, model="pub", started_ns=STARTED_NS, now_ns=NOW_NS)
    assert out["message"]["tool_calls"] == [
        {
            "id": "call-1",
            "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}},
        },
        {
            "id": "call-2",
            "function": {"index": 1, "name": "f", "arguments": {"arguments": "not json"}},
        },
    ]
    assert out["message"]["content"] == ""
    assert (out["done"], out["done_reason"]) == (True, "stop")


def _sse_stream(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def test_streamed_tool_call_pieces_reach_the_ollama_client_as_one_whole_call() -> None:
    def delta(piece: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": piece, "finish_reason": finish}]}

    stream = _sse_stream(
        delta(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_", "arguments": ""},
                    }
                ],
            }
        ),
        delta({"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": '{"ci'}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Rome"}'}}]}),
        delta({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}},
    )
    translator = OllamaStreamTranslator(kind="chat", model="pub", started_ns=STARTED_NS)
    # Fed in small pieces, as a network delivers it.
    out = b"".join(translator.feed(stream[i : i + 7], NOW_NS) for i in range(0, len(stream), 7))
    out += translator.finish(NOW_NS)
    records = [orjson.loads(line) for line in out.splitlines()]
    with_calls = [r for r in records if r["message"].get("tool_calls")]
    assert [r["message"]["tool_calls"] for r in with_calls] == [
        [
            {
                "id": "c1",
                "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Rome"}},
            }
        ]
    ]
    assert records[-1]["done"] is True and records[-1]["eval_count"] == 7
    assert all(r["done"] is False for r in records[:-1])


def test_a_stream_that_ends_without_a_finish_reason_still_delivers_its_tool_call() -> None:
    stream = _sse_stream(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}
                        ]
                    },
                }
            ]
        }
    )
    translator = OllamaStreamTranslator(kind="chat", model="pub", started_ns=STARTED_NS)
    out = translator.feed(stream, NOW_NS) + translator.finish(NOW_NS)
    records = [orjson.loads(line) for line in out.splitlines()]
    assert records[0]["message"]["tool_calls"][0]["function"]["name"] == "f"
    assert records[-1]["done"] is True
