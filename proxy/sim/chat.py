"""The simulated backend's chat and completions: replies of known length and timing, streamed
or whole, with tool calls, and llama-server's context limits and prompt cache."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from guardians.detect import body_has_image
from proxy.sim import server
from proxy.sim.config import SimWeights
from proxy.work import output_tokens, prompt_tokens_for_bytes, requested_output_tokens


@dataclass(frozen=True)
class _TextReply:
    """Everything about one text reply that is fixed before the work starts."""

    chat: bool
    reply_id: str
    created: int
    model: str
    count: int
    finish_reason: str
    usage: dict[str, Any]
    tool_call: tuple[str, str, str] | None = None
    """(id, function name, JSON arguments) when the reply calls a tool instead of talking."""

    def _envelope(self, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.reply_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def _call(self, arguments: str, *, first: bool) -> dict[str, Any]:
        assert self.tool_call is not None
        call_id, name, _ = self.tool_call
        if not first:
            return {"index": 0, "function": {"arguments": arguments}}
        function = {"name": name, "arguments": arguments}
        return {"index": 0, "id": call_id, "type": "function", "function": function}

    def tool_chunks(self) -> list[bytes]:
        """The streamed tool call as OpenAI sends it: name first, arguments in pieces."""
        assert self.tool_call is not None
        arguments = self.tool_call[2]
        half = len(arguments) // 2
        deltas = [
            {"role": "assistant", "content": None, "tool_calls": [self._call("", first=True)]},
            {"tool_calls": [self._call(arguments[:half], first=False)]},
            {"tool_calls": [self._call(arguments[half:], first=False)]},
        ]
        return [self._event({"index": 0, "finish_reason": None, "delta": d}) for d in deltas]

    def whole(self) -> dict[str, Any]:
        text = " ".join(server._word(i) for i in range(self.count))
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": self.finish_reason}
        if self.tool_call is not None:
            call = self._call(self.tool_call[2], first=True)
            del call["index"]
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        data = self._envelope("chat.completion" if self.chat else "text_completion", choice)
        data["usage"] = self.usage
        return data

    def chunk(self, index: int) -> bytes:
        """SSE event for output token `index`; the words joined by spaces make the text."""
        piece = server._word(index) if index == 0 else " " + server._word(index)
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        if self.chat:
            # OpenAI announces the role in the first delta only.
            choice["delta"] = (
                {"role": "assistant", "content": piece} if index == 0 else {"content": piece}
            )
        else:
            choice["text"] = piece
            choice["logprobs"] = None
        return self._event(choice)

    def final_chunk(self) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish_reason}
        if self.chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
            choice["logprobs"] = None
        return self._event(choice)

    def usage_chunk(self) -> bytes:
        """The chunk a stream ends with when the request asked for `include_usage`."""
        data = self._envelope("chat.completion.chunk" if self.chat else "text_completion", {})
        data["choices"] = []
        data["usage"] = self.usage
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def _event(self, choice: dict[str, Any]) -> bytes:
        data = self._envelope("chat.completion.chunk" if self.chat else "text_completion", choice)
        return b"data: " + orjson.dumps(data) + b"\n\n"


def _wants_usage(body: dict[str, Any]) -> bool:
    # As llama-server and OpenAI: a stream carries usage only when the request asks for it.
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


async def _stream_text(
    request: web.Request,
    state: server.SimState,
    reply: _TextReply,
    prefill_ms: float,
    duration_ms: float,
    *,
    usage: bool,
    user: Any = None,
    seen: dict[str, Any] | None = None,
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    per_token_secs = state.weights.output_ms_per_token / 1000.0
    try:
        async with state.slot(request.path, duration_ms, user, seen):
            await response.prepare(request)
            await asyncio.sleep(prefill_ms / 1000.0)
            if reply.tool_call is not None:
                for chunk in reply.tool_chunks():
                    await response.write(chunk)
            else:
                for index in range(reply.count):
                    await asyncio.sleep(per_token_secs)
                    await response.write(reply.chunk(index))
            await response.write(reply.final_chunk())
            if usage:
                await response.write(reply.usage_chunk())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
    except ConnectionResetError:
        # The client went away between chunks; the slot has already counted it.
        pass
    return response


def _output_budget(
    state: server.SimState, n_prompt: int, n_output: int
) -> tuple[int, bool] | web.Response:
    """The output tokens a reply gets and whether the context cut them short, or the refusal of
    a prompt that fills the context."""
    ctx = state.config.ctx_size
    if ctx and state.config.parallel:
        # As llama-server: each of its -np slots gets an equal share of the window.
        ctx = max(1, ctx // state.config.parallel)
    capped = False
    if ctx:
        # As llama-server: a prompt that fills the context is refused, and generation stops
        # when the context is full, whatever max_tokens asked for.
        if n_prompt >= ctx:
            return server._error(
                400,
                "the request exceeds the available context size, try increasing it",
                "exceed_context_size_error",
            )
        capped = n_output > ctx - n_prompt
        n_output = min(n_output, ctx - n_prompt)
    return n_output, capped


def _finish_reason(
    body: dict[str, Any], tool_call: tuple[str, str, str] | None, capped: bool
) -> str:
    # Every reply runs to its token budget, so it ends by length whenever one was set.
    if tool_call is not None:
        return "tool_calls"
    if capped or requested_output_tokens(body) is not None:
        return "length"
    return "stop"


def _usage(weights: SimWeights, n_prompt: int, n_output: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_output,
        "total_tokens": n_prompt + n_output,
        # As llama-server with a prompt cache: how much of the prompt was reused.
        **(
            {"prompt_tokens_details": {"cached_tokens": cached}}
            if weights.prompt_cache_entries
            else {}
        ),
    }


async def _handle_text(request: web.Request, chat: bool) -> web.StreamResponse:
    state = server._state(request)
    if not state.loaded:
        return server._loading()
    raw, parsed = await server._read_json(request)
    if isinstance(parsed, web.Response):
        return parsed
    body = parsed
    wrong = server._wrong_model(state, body)
    if wrong is not None:
        return wrong
    if not state.vision and body_has_image(body):
        return server._bad_request("image input is not supported by this model")
    tool_call: tuple[str, str, str] | None = None
    if chat:
        refused = _check_tool_history(body.get("messages"))
        if refused is not None:
            return server._bad_request(refused)
        tool_call = _tool_call_for(state, body)
    weights = state.weights
    n_prompt = prompt_tokens_for_bytes(len(raw))
    n_output = output_tokens(body)
    budget = _output_budget(state, n_prompt, n_output)
    if isinstance(budget, web.Response):
        return budget
    n_output, capped = budget
    cached = min(n_prompt, state.cached_tokens(server.prompt_text(body)))
    prefill_ms = weights.base_ms + weights.prompt_ms_per_token * (n_prompt - cached)
    duration_ms = prefill_ms + weights.output_ms_per_token * n_output
    reply = _TextReply(
        chat=chat,
        reply_id=state.next_id("chatcmpl" if chat else "cmpl"),
        created=int(time.time()),
        model=server._model_name(state, body),
        count=n_output,
        finish_reason=_finish_reason(body, tool_call, capped),
        usage=_usage(weights, n_prompt, n_output, cached),
        tool_call=tool_call,
    )
    if body.get("stream") is True:
        return await _stream_text(
            request,
            state,
            reply,
            prefill_ms,
            duration_ms,
            usage=_wants_usage(body),
            user=body.get("user"),
            seen=server._seen(request, body),
        )
    async with state.slot(request.path, duration_ms, body.get("user"), server._seen(request, body)):
        await asyncio.sleep(duration_ms / 1000.0)
    return server._json(reply.whole())


# A value of each JSON Schema type, for the arguments of a simulated tool call.
_SAMPLE_ARGUMENTS: dict[str, Any] = {
    "string": "sim",
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "array": [],
    "object": {},
}


def _tool_call_for(state: server.SimState, body: dict[str, Any]) -> tuple[str, str, str] | None:
    """A call of the first tool offered, unless the model was just given a tool's result.

    What a tool-calling model does with a question it needs a tool for: it calls the tool, then
    answers in words once the result is in the conversation. Its arguments fill every required
    parameter with a value of the declared type.
    """
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    messages = body.get("messages")
    if (
        isinstance(messages, list)
        and messages
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "tool"
    ):
        return None
    function = _dict(_dict(tools[0]).get("function"))
    name = function.get("name")
    if not isinstance(name, str) or not name:
        return None
    params = _dict(function.get("parameters"))
    props = _dict(params.get("properties"))
    required = params.get("required")
    arguments = {
        key: _SAMPLE_ARGUMENTS.get(str(_dict(props.get(key)).get("type")), "sim")
        for key in (required if isinstance(required, list) else [])
        if isinstance(key, str)
    }
    return state.next_id("call"), name, orjson.dumps(arguments).decode()


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _check_tool_history(messages: Any) -> str | None:
    """Why a chat history is refused, as strict OpenAI servers refuse it; None when it is fine.

    An assistant's tool call carries its arguments as a JSON string and an ID, and every tool
    result names the call it answers by that ID.
    """
    if not isinstance(messages, list):
        return None
    call_ids: set[str] = set()
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
                return f"messages[{index}].tool_calls: arguments must be a JSON string"
            if not isinstance(call.get("id"), str):
                return f"messages[{index}].tool_calls: each call needs an id"
            call_ids.add(call["id"])
        if message.get("role") == "tool" and message.get("tool_call_id") not in call_ids:
            return f"messages[{index}]: tool_call_id does not name an earlier tool call"
    return None


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await _handle_text(request, chat=True)


async def handle_completions(request: web.Request) -> web.StreamResponse:
    return await _handle_text(request, chat=False)
