"""Translate the OpenAI answers back to Ollama and Kobold (the requests came in through
`translate`), and backend errors to Anthropic's envelope.

Everything here is pure: callers pass parsed bodies, bytes and clock readings, and get the same
back.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import orjson

from proxy.families.text.translate import NS_PER_SEC, JSONDict
from proxy.forwarding.rewrite import LineBuffer, split_lines
from routerproject.errors import anthropic_envelope

# A single SSE delta is tiny; a line this long is garbage and is skipped rather
# than buffered without bound.
STREAM_MAX_LINE_BYTES = 16 * 1024 * 1024
EMPTY_ERROR_MESSAGE = "backend returned an empty error"

NS_PER_MS = 1_000_000

_DATA_PREFIX = b"data:"
_DONE_PAYLOAD = b"[DONE]"


def rfc3339_utc(now_ns: int) -> str:
    """Nanosecond RFC 3339 timestamp in UTC, as Ollama writes ``created_at``."""
    seconds, fraction_ns = divmod(now_ns, NS_PER_SEC)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction_ns:09d}Z"


def _first_choice(resp: Any) -> JSONDict:
    if isinstance(resp, dict):
        choices = resp.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            return choices[0]
    return {}


def _str_field(obj: Any, key: str) -> str:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


def _choice_text(choice: JSONDict) -> str:
    """Text of a completions choice, a chat choice or a chat stream delta."""
    text = choice.get("text")
    if isinstance(text, str):
        return text
    for key in ("message", "delta"):
        content = _str_field(choice.get(key), "content")
        if content:
            return content
    return ""


def _choice_thinking(choice: JSONDict) -> str:
    for key in ("message", "delta"):
        reasoning = _str_field(choice.get(key), "reasoning_content")
        if reasoning:
            return reasoning
    return ""


def _parsed_arguments(text: Any) -> JSONDict:
    """A call's JSON-text arguments as the object Ollama clients expect."""
    if isinstance(text, dict):
        return text
    if isinstance(text, str) and text.strip():
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
        # Arguments the model did not write as an object stay readable rather than vanish.
        return {"arguments": text}
    return {}


def _ollama_call(index: int, call_id: Any, name: Any, arguments: Any) -> JSONDict:
    function: JSONDict = {"index": index, "name": name if isinstance(name, str) else ""}
    function["arguments"] = _parsed_arguments(arguments)
    out: JSONDict = {"function": function}
    if isinstance(call_id, str) and call_id:
        out["id"] = call_id
    return out


def _message_tool_calls(choice: JSONDict) -> list[JSONDict]:
    """An OpenAI answer's tool calls in Ollama's shape."""
    message = choice.get("message")
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return []
    out = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append(
                _ollama_call(index, call.get("id"), function.get("name"), function.get("arguments"))
            )
    return out


def _done_reason(finish_reason: Any) -> str:
    return "length" if finish_reason == "length" else "stop"


def _token_count(usage: Any, key: str) -> int:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _duration_ns(timings: Any, key: str) -> int:
    # llama-server reports per-phase timings; Ollama clients divide by these
    # durations to show tokens/s, so a real value beats a constant zero.
    value = timings.get(key) if isinstance(timings, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return int(value * NS_PER_MS)
    return 0


def _ollama_done_fields(
    *, finish_reason: Any, usage: Any, timings: Any, started_ns: int, now_ns: int
) -> JSONDict:
    return {
        "done": True,
        "done_reason": _done_reason(finish_reason),
        "total_duration": max(0, now_ns - started_ns),
        "load_duration": 0,
        "prompt_eval_count": _token_count(usage, "prompt_tokens"),
        "prompt_eval_duration": _duration_ns(timings, "prompt_ms"),
        "eval_count": _token_count(usage, "completion_tokens"),
        "eval_duration": _duration_ns(timings, "predicted_ms"),
    }


def _response_fields(resp: Any) -> tuple[Any, Any]:
    if isinstance(resp, dict):
        return resp.get("usage"), resp.get("timings")
    return None, None


def openai_to_ollama_chat(
    resp: dict[str, Any], *, model: str, started_ns: int, now_ns: int
) -> dict[str, Any]:
    choice = _first_choice(resp)
    message: JSONDict = {"role": "assistant", "content": _choice_text(choice)}
    thinking = _choice_thinking(choice)
    if thinking:
        message["thinking"] = thinking
    calls = _message_tool_calls(choice)
    if calls:
        message["tool_calls"] = calls
    usage, timings = _response_fields(resp)
    return {
        "model": model,
        "created_at": rfc3339_utc(now_ns),
        "message": message,
        **_ollama_done_fields(
            finish_reason=choice.get("finish_reason"),
            usage=usage,
            timings=timings,
            started_ns=started_ns,
            now_ns=now_ns,
        ),
    }


def openai_to_ollama_generate(
    resp: dict[str, Any], *, model: str, started_ns: int, now_ns: int
) -> dict[str, Any]:
    choice = _first_choice(resp)
    out: JSONDict = {
        "model": model,
        "created_at": rfc3339_utc(now_ns),
        "response": _choice_text(choice),
    }
    thinking = _choice_thinking(choice)
    if thinking:
        out["thinking"] = thinking
    usage, timings = _response_fields(resp)
    out.update(
        _ollama_done_fields(
            finish_reason=choice.get("finish_reason"),
            usage=usage,
            timings=timings,
            started_ns=started_ns,
            now_ns=now_ns,
        )
    )
    out["context"] = []
    return out


def openai_to_kobold(resp: dict[str, Any]) -> dict[str, Any]:
    choice = _first_choice(resp)
    finish_reason = _done_reason(choice.get("finish_reason"))
    return {"results": [{"text": _choice_text(choice), "finish_reason": finish_reason}]}


def _error_message(obj: Any) -> str | None:
    """The message of an OpenAI error envelope or one of its common variants."""
    if not isinstance(obj, dict):
        return None
    error = obj.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str):
            return message
    elif isinstance(error, str):
        return error
    # vLLM's older `{"object": "error", "message": ...}` and FastAPI's `{"detail": ...}`.
    for key in ("message", "detail"):
        value = obj.get(key)
        if isinstance(value, str):
            return value
    return None


def openai_error_to_ollama(body: bytes) -> bytes:
    """``{"error": "<message>"}`` from an OpenAI error body (or its raw text)."""
    try:
        message = _error_message(orjson.loads(body))
    except orjson.JSONDecodeError:
        message = None
    if message is None:
        message = body.decode("utf-8", "replace").strip() or EMPTY_ERROR_MESSAGE
    return orjson.dumps({"error": message})


def openai_error_to_anthropic(status: int, body: bytes) -> bytes:
    """Anthropic's error envelope from a backend's error body (OpenAI's, a variant, or raw
    text); a body already in Anthropic's shape (a node that translated it) is kept."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and doc.get("type") == "error" and isinstance(doc.get("error"), dict):
        return body
    message = _error_message(doc)
    if message is None:
        message = body.decode("utf-8", "replace").strip() or EMPTY_ERROR_MESSAGE
    error = doc.get("error") if isinstance(doc, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return orjson.dumps(
        anthropic_envelope(status, message, code=code if isinstance(code, str) else None)
    )


def _stream_error(obj: JSONDict) -> str | None:
    error = obj.get("error")
    if error is None and obj.get("object") != "error":
        return None
    message = _error_message(obj)
    if message is not None:
        return message
    return EMPTY_ERROR_MESSAGE if error is None else orjson.dumps(error).decode()


class OllamaStreamTranslator:
    """Turn an OpenAI SSE stream into Ollama NDJSON records.

    One record per non-empty content delta; ``finish`` writes the closing
    ``done`` record from the usage and finish reason seen on the way. After a
    backend error the error record is the last thing the client gets, since
    Ollama clients treat ``{"error": ...}`` as the end of the stream.
    """

    def __init__(
        self,
        *,
        kind: Literal["chat", "generate"],
        model: str,
        started_ns: int,
        max_line_bytes: int = STREAM_MAX_LINE_BYTES,
    ) -> None:
        self._kind = kind
        self._model = model
        self._started_ns = started_ns
        self._max_line_bytes = max_line_bytes
        self._lines = LineBuffer()
        self._skipping = False
        self._usage: Any = None
        self._timings: Any = None
        self._finish_reason: Any = None
        # Tool calls arrive in pieces (a name, then argument fragments) keyed by index;
        # Ollama sends each call whole, once the backend has finished it.
        self._calls: dict[int, JSONDict] = {}
        self._calls_sent = False
        self.errored = False

    def feed(self, sse_chunk: bytes, now_ns: int) -> bytes:
        if not sse_chunk or self.errored:
            return b""
        if self._skipping:
            end = sse_chunk.find(b"\n") + 1
            if end == 0:
                return b""
            self._skipping = False
            sse_chunk = sse_chunk[end:]
        region = self._lines.take(sse_chunk)
        if self._lines.pending_len > self._max_line_bytes:
            self._lines.drain()
            self._skipping = True
        if not region:
            return b""
        return b"".join(self._translate_line(line, now_ns) for line in split_lines(region))

    def finish(self, now_ns: int) -> bytes:
        rest = self._lines.drain()
        out = b"" if self._skipping or not rest else self._translate_line(rest, now_ns)
        if self.errored:
            return out
        out += self._flush_calls(now_ns)
        record = self._record(now_ns, "", "")
        record.update(
            _ollama_done_fields(
                finish_reason=self._finish_reason,
                usage=self._usage,
                timings=self._timings,
                started_ns=self._started_ns,
                now_ns=now_ns,
            )
        )
        if self._kind == "generate":
            record["context"] = []
        return out + orjson.dumps(record) + b"\n"

    def _record(self, now_ns: int, text: str, thinking: str) -> JSONDict:
        record: JSONDict = {"model": self._model, "created_at": rfc3339_utc(now_ns)}
        if self._kind == "chat":
            message: JSONDict = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            record["message"] = message
        else:
            record["response"] = text
            if thinking:
                record["thinking"] = thinking
        return record

    def _translate_line(self, line: bytes, now_ns: int) -> bytes:
        if self.errored or not line.startswith(_DATA_PREFIX):
            return b""
        payload = line[len(_DATA_PREFIX) :].strip()
        if not payload or payload == _DONE_PAYLOAD:
            return b""
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(obj, dict):
            return b""
        error = _stream_error(obj)
        if error is not None:
            self.errored = True
            return orjson.dumps({"error": error}) + b"\n"
        if isinstance(obj.get("usage"), dict):
            self._usage = obj["usage"]
        if isinstance(obj.get("timings"), dict):
            self._timings = obj["timings"]
        choice = _first_choice(obj)
        self._gather_calls(choice)
        text = _choice_text(choice)
        thinking = _choice_thinking(choice)
        out = b""
        if text or thinking:
            record = self._record(now_ns, text, thinking)
            record["done"] = False
            out = orjson.dumps(record) + b"\n"
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
            out += self._flush_calls(now_ns)
        return out

    def _gather_calls(self, choice: JSONDict) -> None:
        delta = choice.get("delta")
        pieces = delta.get("tool_calls") if isinstance(delta, dict) else None
        if not isinstance(pieces, list):
            return
        for piece in pieces:
            if not isinstance(piece, dict):
                continue
            index = piece.get("index")
            key = index if isinstance(index, int) else len(self._calls)
            call = self._calls.setdefault(key, {"id": None, "name": "", "arguments": ""})
            if isinstance(piece.get("id"), str):
                call["id"] = piece["id"]
            function = piece.get("function")
            if isinstance(function, dict):
                if isinstance(function.get("name"), str):
                    call["name"] += function["name"]
                if isinstance(function.get("arguments"), str):
                    call["arguments"] += function["arguments"]

    def _flush_calls(self, now_ns: int) -> bytes:
        if not self._calls or self._calls_sent or self._kind != "chat":
            return b""
        self._calls_sent = True
        record = self._record(now_ns, "", "")
        record["message"]["tool_calls"] = [
            _ollama_call(number, call["id"], call["name"], call["arguments"])
            for number, (_, call) in enumerate(sorted(self._calls.items()))
        ]
        record["done"] = False
        return orjson.dumps(record) + b"\n"


# --------------------------------------------------------------------- embeddings


def openai_to_ollama_embed(
    resp: Any, *, model: str, legacy: bool, started_ns: int, now_ns: int
) -> dict[str, Any]:
    data = resp.get("data") if isinstance(resp, dict) else None
    if not isinstance(data, list):
        raise ValueError("embeddings answer has no data list")
    ordered = sorted(
        (d for d in data if isinstance(d, dict)),
        key=lambda d: d.get("index", 0) if isinstance(d.get("index"), int) else 0,
    )
    vectors = [d.get("embedding") for d in ordered]
    if not all(isinstance(v, list) for v in vectors):
        raise ValueError("embeddings answer holds a non-list vector")
    if legacy:
        return {"embedding": vectors[0] if vectors else []}
    usage = resp.get("usage")
    return {
        "model": model,
        "embeddings": vectors,
        "total_duration": max(0, now_ns - started_ns),
        "load_duration": 0,
        "prompt_eval_count": _token_count(usage, "prompt_tokens"),
    }
