"""Translate Ollama and Kobold requests to OpenAI (the answers go back in `replies`).

Backends speak only the OpenAI API, so the router converts the client's dialect
on the way in and the backend's answer on the way out. Everything here is pure:
callers pass parsed bodies, bytes and clock readings, and get the same back.
"""

from __future__ import annotations

from typing import Any

import orjson

from routerproject.durations import parse_duration_ns

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

# Ollama streams unless the client says otherwise; Kobold's generate never does.
OLLAMA_STREAM_DEFAULT = True
# Ollama sends bare base64; the OpenAI image_url part wants a data URL.
# Backends decode the bytes themselves, so the declared type is only nominal.
IMAGE_DATA_URL_PREFIX = "data:image/png;base64,"

NS_PER_SEC = 1_000_000_000

# (client key, OpenAI key, expected type) for the plain one-to-one sampling options.
_OLLAMA_OPTION_MAP: tuple[tuple[str, str, type], ...] = (
    ("temperature", "temperature", float),
    ("top_p", "top_p", float),
    ("top_k", "top_k", int),
    ("repeat_penalty", "repeat_penalty", float),
    ("presence_penalty", "presence_penalty", float),
    ("frequency_penalty", "frequency_penalty", float),
)
_KOBOLD_OPTION_MAP: tuple[tuple[str, str, type], ...] = (
    ("temperature", "temperature", float),
    ("top_p", "top_p", float),
    ("top_k", "top_k", int),
    ("rep_pen", "repeat_penalty", float),
)

JSONDict = dict[str, Any]


INT_MIN = -(2**63)
UINT_MAX = 2**64 - 1


class TranslationError(ValueError):
    """A client body the router must refuse with 400; ``param`` names the field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


# --------------------------------------------------------------------- validation


def _require_object(body: Any) -> JSONDict:
    if not isinstance(body, dict):
        raise TranslationError("request body must be a JSON object", None)
    return body


def _optional_str(body: JSONDict, key: str, param: str | None = None) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value
    raise TranslationError(f"{param or key} must be a string", param or key)


def _optional_bool(body: JSONDict, key: str) -> bool | None:
    value = body.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise TranslationError(f"{key} must be a boolean", key)


def _number(value: Any, expected: type, param: str) -> int | float:
    # bool is an int subclass in Python but never a valid sampling value.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TranslationError(f"{param} must be a number", param)
    if expected is not int:
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise TranslationError(f"{param} must be an integer", param)
        # The JSON parser reads an integer past 64 bits as a float.
        value = int(value)
    if not INT_MIN <= value <= UINT_MAX:
        # The body is JSON again for the backend, and JSON encoders (ours, the backends')
        # stop at 64 bits: past them the client is told so, rather than given a traceback.
        raise TranslationError(f"{param} must fit in 64 bits", param)
    return value


def _stop_list(value: Any, param: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise TranslationError(f"{param} must be a string or a list of strings", param)


def _copy_options(
    source: JSONDict, out: JSONDict, table: tuple[tuple[str, str, type], ...], prefix: str
) -> None:
    for source_key, target_key, expected in table:
        value = source.get(source_key)
        if value is not None:
            out[target_key] = _number(value, expected, prefix + source_key)


def _positive_int(source: JSONDict, key: str, param: str) -> int | None:
    """An integer option where zero or a negative value means "no limit/random"."""
    value = source.get(key)
    if value is None:
        return None
    number = _number(value, int, param)
    return int(number) if number > 0 else None


def _non_negative_int(source: JSONDict, key: str, param: str) -> int | None:
    value = source.get(key)
    if value is None:
        return None
    number = _number(value, int, param)
    return int(number) if number >= 0 else None


# ------------------------------------------------------------------ Ollama request


def _apply_ollama_options(body: JSONDict, out: JSONDict) -> None:
    options = body.get("options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise TranslationError("options must be an object", "options")
    _copy_options(options, out, _OLLAMA_OPTION_MAP, "options.")
    # Ollama's seed -1 and num_predict <= 0 mean "random" and "unlimited":
    # leaving them out gives the backend's own default, which means the same.
    seed = _non_negative_int(options, "seed", "options.seed")
    if seed is not None:
        out["seed"] = seed
    max_tokens = _positive_int(options, "num_predict", "options.num_predict")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    stop = options.get("stop")
    if stop is not None:
        out["stop"] = _stop_list(stop, "options.stop")


def _apply_ollama_format(body: JSONDict, out: JSONDict) -> None:
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        # Ollama's structured outputs: `format` is the JSON schema itself.
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": fmt},
        }
    else:
        raise TranslationError('format must be "json" or a JSON schema object', "format")


def _images(value: Any, param: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TranslationError(f"{param} must be a list of base64 strings", param)
    for index, image in enumerate(value):
        if not isinstance(image, str):
            raise TranslationError(f"{param}[{index}] must be a base64 string", f"{param}[{index}]")
    return value


def _content_with_images(text: str, images: list[str]) -> str | list[JSONDict]:
    if not images:
        return text
    parts: list[JSONDict] = [{"type": "text", "text": text}]
    for image in images:
        url = image if image.startswith("data:") else IMAGE_DATA_URL_PREFIX + image
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _call_arguments(value: Any, param: str) -> str:
    # Ollama holds a call's arguments as an object; OpenAI as that object's JSON text.
    if value is None:
        return "{}"
    if isinstance(value, dict):
        return orjson.dumps(value).decode()
    if isinstance(value, str):
        return value
    raise TranslationError(f"{param} must be an object", param)


def _history_tool_calls(value: Any, param: str, index: int) -> list[JSONDict]:
    """An assistant message's Ollama tool calls as OpenAI's, each with an ID of its own."""
    if not isinstance(value, list):
        raise TranslationError(f"{param} must be a list", param)
    calls: list[JSONDict] = []
    for number, call in enumerate(value):
        where = f"{param}[{number}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise TranslationError(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise TranslationError(
                f"{where}.function.name must be a string", f"{where}.function.name"
            )
        # Ollama clients rarely keep the ID they were given; one made from the position is
        # stable for the whole conversation, so the tool's answer can name the call it answers.
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
        calls.append(
            {
                "id": call_id or f"call_{index}_{number}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": _call_arguments(
                        function.get("arguments"), f"{where}.function.arguments"
                    ),
                },
            }
        )
    return calls


def _answered_call(pending: list[tuple[str, str]], message: JSONDict, param: str) -> str:
    """The ID of the call a tool result answers: named by ID, else by tool name, else the
    oldest call not answered yet."""
    given = message.get("tool_call_id")
    chosen: tuple[str, str] | None
    if isinstance(given, str) and given:
        chosen = next((c for c in pending if c[0] == given), (given, ""))
    else:
        name = _optional_str(message, "tool_name", f"{param}.tool_name")
        chosen = next((c for c in pending if c[1] == name), pending[0] if pending else None)
    if chosen is None:
        raise TranslationError(f"{param} is a tool result but no tool call comes before it", param)
    if chosen in pending:
        pending.remove(chosen)
    return chosen[0]


def _ollama_messages(value: Any) -> list[JSONDict]:
    # An absent list is Ollama's "just load the model" request; the router decides
    # what to do with it, so it is translated rather than refused here.
    if value is None:
        return []
    if not isinstance(value, list):
        raise TranslationError("messages must be a list", "messages")
    messages: list[JSONDict] = []
    pending: list[tuple[str, str]] = []  # (call ID, tool name) of calls not yet answered
    for index, message in enumerate(value):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise TranslationError(f"{param} must be an object", param)
        role = message.get("role")
        if not isinstance(role, str):
            raise TranslationError(f"{param}.role must be a string", f"{param}.role")
        content = _optional_str(message, "content", f"{param}.content") or ""
        images = _images(message.get("images"), f"{param}.images")
        out: JSONDict = {"role": role, "content": _content_with_images(content, images)}
        if message.get("tool_calls") is not None:
            calls = _history_tool_calls(message["tool_calls"], f"{param}.tool_calls", index)
            out["tool_calls"] = calls
            pending.extend((c["id"], c["function"]["name"]) for c in calls)
        if role == "tool":
            out["tool_call_id"] = _answered_call(pending, message, param)
        messages.append(out)
    return messages


def _ollama_tools(body: JSONDict, out: JSONDict) -> None:
    # Ollama's tool schema is OpenAI's ({"type": "function", "function": {...}}).
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise TranslationError("tools must be a list", "tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise TranslationError(
                f"tools[{index}] must be an object with function.name", f"tools[{index}]"
            )
    if tools:
        out["tools"] = [{"type": "function", **tool} for tool in tools]


# Ollama's `think` levels, which OpenAI-compatible servers take as `reasoning_effort`.
THINK_LEVELS = frozenset({"low", "medium", "high"})


def _ollama_think(body: JSONDict, out: JSONDict) -> None:
    """`think` as the backends take it: a chat-template switch (llama-server and vLLM read
    `enable_thinking`), and a level as `reasoning_effort`."""
    think = body.get("think")
    if think is None:
        return
    if isinstance(think, bool):
        out["chat_template_kwargs"] = {"enable_thinking": think}
    elif isinstance(think, str) and think in THINK_LEVELS:
        out["chat_template_kwargs"] = {"enable_thinking": True}
        out["reasoning_effort"] = think
    else:
        raise TranslationError('think must be true, false, "low", "medium" or "high"', "think")


def _ollama_common(body: JSONDict) -> tuple[JSONDict, bool]:
    out: JSONDict = {}
    model = _optional_str(body, "model")
    if model is not None:
        out["model"] = model
    stream = _optional_bool(body, "stream")
    return out, OLLAMA_STREAM_DEFAULT if stream is None else stream


def _finish_ollama_body(body: JSONDict, out: JSONDict, stream: bool) -> None:
    out["stream"] = stream
    if stream:
        # Without this the final Ollama record could not report token counts.
        out["stream_options"] = {"include_usage": True}
    _apply_ollama_options(body, out)
    _apply_ollama_format(body, out)
    _ollama_think(body, out)
    keep_alive_seconds(body)  # checked here, acted on by the handler


def ollama_chat_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """``/api/chat`` → ``/v1/chat/completions``."""
    body = _require_object(body)
    out, stream = _ollama_common(body)
    out["messages"] = _ollama_messages(body.get("messages"))
    _ollama_tools(body, out)
    _finish_ollama_body(body, out, stream)
    return CHAT_COMPLETIONS_PATH, out, stream


def keep_alive_seconds(body: JSONDict) -> float | None:
    """Ollama's `keep_alive` in seconds (a number of seconds or a Go duration like `"5m"`);
    None when absent. Negative means "keep loaded"; 0 means "unload once answered"."""
    value = body.get("keep_alive")
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        try:
            return sign * parse_duration_ns(text.lstrip("-")) / NS_PER_SEC
        except ValueError:
            try:
                return float(text)
            except ValueError:
                pass
    raise TranslationError(
        'keep_alive must be a number of seconds or a duration like "5m"', "keep_alive"
    )


def is_load_request(kind: str, body: JSONDict) -> bool:
    """Ollama's load/unload request: a chat without messages or a generate without a prompt."""
    if kind == "chat":
        return not body.get("messages")
    return not body.get("prompt") and not body.get("images") and not body.get("suffix")


def ollama_generate_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """``/api/generate`` → ``/v1/completions``, or chat when images are attached."""
    body = _require_object(body)
    out, stream = _ollama_common(body)
    prompt = _optional_str(body, "prompt") or ""
    system = _optional_str(body, "system") or ""
    images = _images(body.get("images"), "images")
    if images:
        # The completions API has no place for images; only chat can carry them.
        messages: list[JSONDict] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": _content_with_images(prompt, images)})
        out["messages"] = messages
        path = CHAT_COMPLETIONS_PATH
    else:
        out["prompt"] = f"{system}\n\n{prompt}" if system else prompt
        path = COMPLETIONS_PATH
    _finish_ollama_body(body, out, stream)
    return path, out, stream


# ------------------------------------------------------------------ Kobold request


def kobold_generate_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """``/api/v1/generate`` → ``/v1/completions`` (never streaming)."""
    body = _require_object(body)
    out: JSONDict = {}
    model = _optional_str(body, "model")
    if model is not None:
        out["model"] = model
    out["prompt"] = _optional_str(body, "prompt") or ""
    out["stream"] = False
    _copy_options(body, out, _KOBOLD_OPTION_MAP, "")
    max_tokens = _positive_int(body, "max_length", "max_length")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    # Kobold's seed -1 means "random", which is also what omitting it means.
    seed = _non_negative_int(body, "sampler_seed", "sampler_seed")
    if seed is not None:
        out["seed"] = seed
    stop = body.get("stop_sequence")
    if stop is not None:
        out["stop"] = _stop_list(stop, "stop_sequence")
    return COMPLETIONS_PATH, out, False


# ----------------------------------------------------------------------- responses


def ollama_embed_request(body: dict[str, Any], *, legacy: bool) -> dict[str, Any]:
    """``/api/embed`` (``input``: text or list) or legacy ``/api/embeddings`` (``prompt``)."""
    body = _require_object(body)
    if legacy:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise TranslationError("prompt must be a string", "prompt")
        texts: str | list[str] = prompt
    else:
        value = body.get("input")
        if isinstance(value, str):
            texts = value
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            texts = list(value)
        else:
            raise TranslationError("input must be a string or a non-empty list of strings", "input")
    return {"model": body.get("model"), "input": texts}
