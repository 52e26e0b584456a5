"""The simulated backend's textfamily paths: just enough of each to test routing.

Every answer says which path it was asked on and under which model (`model`, rewritten by the
router on the way out) and also `seen_model`, a copy the router leaves alone, so a test sees
the served ID the request arrived with. Responses are stored in the process, as vLLM stores
them, so a follow-up on the wrong replica gets vLLM's 404.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from proxy.sim import server
from proxy.sim.chat import _SAMPLE_ARGUMENTS, _dict
from proxy.sim.server import STATE_KEY, SimState

RESPONSES_KEY = web.AppKey("sim_responses", dict[str, dict[str, Any]])
"""Stored responses by ID, as vLLM keeps them until it restarts."""

# The tokens of a simulated reply: few, so tests stay fast.
REPLY_WORDS = ("sim", "reply")


def _ready(request: web.Request) -> tuple[SimState, web.Response | None]:
    state = request.app[STATE_KEY]
    return state, None if state.loaded else server._loading()


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    _, parsed = await server._read_json(request)
    return parsed


async def _work(state: SimState, request: web.Request, body: dict[str, Any]) -> None:
    duration_ms = state.weights.base_ms
    async with state.slot(request.path, duration_ms, seen=server._seen(request, body)):
        await asyncio.sleep(duration_ms / 1000.0)


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    out = []
    for name, data in events:
        head = f"event: {name}\n".encode() if name else b""
        out.append(head + b"data: " + orjson.dumps(data) + b"\n\n")
    return b"".join(out)


async def _stream(request: web.Request, payload: bytes) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    # Event by event, as a real server flushes them.
    for event in payload.split(b"\n\n"):
        if event:
            await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp


# -- Responses -------------------------------------------------------------------------------


def _response(state: SimState, body: dict[str, Any], status: str) -> dict[str, Any]:
    model = server._model_name(state, body)
    text = " ".join(REPLY_WORDS)
    return {
        # Unique across processes, as vLLM's are: replicas must not hand out the same ID.
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "seen_model": body.get("model"),
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            }
        ],
        "usage": {"input_tokens": 1, "output_tokens": len(REPLY_WORDS), "total_tokens": 3},
    }


async def handle_responses(request: web.Request) -> web.StreamResponse:
    state, loading = _ready(request)
    if loading is not None:
        return loading
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    stored = request.app[RESPONSES_KEY]
    previous = body.get("previous_response_id")
    if previous is not None and previous not in stored:
        # vLLM continues only a response it stores itself.
        return server._error(404, f"Response with id '{previous}' not found.", "NotFoundError")
    await _work(state, request, body)
    if body.get("stream") is not True:
        done = _response(state, body, "completed")
        stored[done["id"]] = done
        return server._json(done)
    started = _response(state, body, "in_progress")
    done = {**started, "status": "completed"}
    stored[done["id"]] = done
    events: list[tuple[str | None, dict[str, Any]]] = [
        ("response.created", {"type": "response.created", "response": started}),
    ]
    events += [
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": word})
        for word in REPLY_WORDS
    ]
    events.append(("response.completed", {"type": "response.completed", "response": done}))
    return await _stream(request, _sse(events))


def _stored(request: web.Request) -> dict[str, Any] | None:
    found: dict[str, Any] | None = request.app[RESPONSES_KEY].get(request.match_info["rid"])
    return found


def _no_response(request: web.Request) -> web.Response:
    rid = request.match_info["rid"]
    return server._error(404, f"Response with id '{rid}' not found.", "NotFoundError")


async def handle_response_get(request: web.Request) -> web.Response:
    found = _stored(request)
    return server._json(found) if found is not None else _no_response(request)


async def handle_response_delete(request: web.Request) -> web.Response:
    found = request.app[RESPONSES_KEY].pop(request.match_info["rid"], None)
    if found is None:
        return _no_response(request)
    return server._json({"id": found["id"], "object": "response", "deleted": True})


async def handle_response_cancel(request: web.Request) -> web.Response:
    found = _stored(request)
    if found is None:
        return _no_response(request)
    found["status"] = "cancelled"
    return server._json(found)


async def handle_input_tokens(request: web.Request) -> web.Response:
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    state = request.app[STATE_KEY]
    return server._json(
        {
            "object": "response.input_tokens",
            "input_tokens": len(orjson.dumps(body.get("input", ""))) // 4 + 1,
            "model": server._model_name(state, body),
            "seen_model": body.get("model"),
        }
    )


# -- Anthropic messages ----------------------------------------------------------------------
#
# As llama-server serves them: the whole message, or its event stream with every event the
# Anthropic SDKs assemble a message from (message_start, content_block_start/delta/stop,
# message_delta with the stop reason and output usage, message_stop). A request that offers
# tools gets a call of the first one, unless its last turn carries a tool's result.


def _anthropic_refusal(body: dict[str, Any]) -> str | None:
    """Why a Messages request is refused, naming the field; None when it is fine."""
    if not isinstance(body.get("messages"), list):
        return "messages: must be a list"
    limit = body.get("max_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        return "max_tokens: must be a positive integer"
    return None


def _anthropic_tool_use(state: SimState, body: dict[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    if isinstance(choice, dict) and choice.get("type") == "none":
        return None
    last = body["messages"][-1] if body["messages"] else None
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "tool_result" for part in content
    ):
        return None
    name = tools[0].get("name")
    if not isinstance(name, str) or not name:
        return None
    schema = _dict(tools[0].get("input_schema"))
    props = _dict(schema.get("properties"))
    required = schema.get("required")
    arguments = {
        key: _SAMPLE_ARGUMENTS.get(str(_dict(props.get(key)).get("type")), "sim")
        for key in (required if isinstance(required, list) else [])
        if isinstance(key, str)
    }
    return {"type": "tool_use", "id": state.next_id("toolu"), "name": name, "input": arguments}


def _anthropic_message(state: SimState, body: dict[str, Any]) -> dict[str, Any]:
    tool_use = _anthropic_tool_use(state, body)
    limit = body.get("max_tokens")
    words = list(REPLY_WORDS)
    stop = "end_turn"
    if tool_use is not None:
        content = [tool_use]
        stop = "tool_use"
    else:
        if isinstance(limit, int) and limit < len(words):
            words, stop = words[:limit], "max_tokens"
        content = [{"type": "text", "text": " ".join(words)}]
    return {
        "id": state.next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": server._model_name(state, body),
        "seen_model": body.get("model"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": len(words) if tool_use is None else 1},
    }


def _block_events(index: int, block: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """One content block as its start, deltas and stop events."""
    if block["type"] == "tool_use":
        opening = {**block, "input": {}}
        arguments = orjson.dumps(block["input"]).decode()
        half = len(arguments) // 2
        deltas = [
            {"type": "input_json_delta", "partial_json": piece}
            for piece in (arguments[:half], arguments[half:])
        ]
    else:
        opening = {"type": "text", "text": ""}
        words = block["text"].split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        deltas = [{"type": "text_delta", "text": piece} for piece in pieces]
    events: list[tuple[str | None, dict[str, Any]]] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def _message_events(message: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    usage = message["usage"]
    opening = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0},
    }
    events: list[tuple[str | None, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": opening}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    # As llama-server: the closing usage has the output tokens only (the input tokens were in
    # message_start), so whoever counts the stream's tokens must read both events.
    ending = {
        "type": "message_delta",
        "delta": delta,
        "usage": {"output_tokens": usage["output_tokens"]},
    }
    events.append(("message_delta", ending))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


async def handle_messages(request: web.Request) -> web.StreamResponse:
    state, loading = _ready(request)
    if loading is not None:
        return loading
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    wrong = server._wrong_model(state, body)
    if wrong is not None:
        return wrong
    refused = _anthropic_refusal(body)
    if refused is not None:
        # llama-server answers its Anthropic path's errors in OpenAI's envelope.
        return server._bad_request(refused)
    await _work(state, request, body)
    message = _anthropic_message(state, body)
    if body.get("stream") is not True:
        return server._json(message)
    return await _stream(request, _sse(_message_events(message)))


async def handle_count_tokens(request: web.Request) -> web.Response:
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    return server._json({"input_tokens": len(orjson.dumps(body.get("messages", []))) // 4 + 1})


# -- the rest: an echo of path and model -----------------------------------------------------


async def handle_echo(request: web.Request) -> web.Response:
    """Rerank, score, classify, pooling, embed, a catch-all text path: path and model back."""
    state, loading = _ready(request)
    if loading is not None:
        return loading
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    wrong = server._wrong_model(state, body)
    if wrong is not None:
        return wrong
    await _work(state, request, body)
    return server._json(
        {
            "object": "sim.echo",
            "path": request.path,
            "model": server._model_name(state, body),
            "seen_model": body.get("model"),
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
    )


async def handle_tokenize(request: web.Request) -> web.Response:
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    content = body.get("content", "")
    words = content.split() if isinstance(content, str) else []
    # One token per word, numbered by position: enough for a count.
    return server._json({"tokens": list(range(1, len(words) + 1))})


async def handle_music(request: web.Request) -> web.Response:
    """KoboldCpp's music UI (HTML) and API (JSON), as the text process serves them."""
    state, loading = _ready(request)
    if loading is not None:
        return loading
    alias = state.config.alias
    if request.path.startswith("/musicui"):
        page = f"<!doctype html><title>sim music {alias}</title><p>{request.path}</p>"
        return web.Response(text=page, content_type="text/html")
    return server._json(
        {
            "path": request.path,
            "method": request.method,
            "model": alias,
            "query": request.query_string,
        }
    )


ECHO_PATHS = (
    "/v1/rerank",
    "/v1/reranking",
    "/rerank",
    "/v2/rerank",
    "/v2/embed",
    "/api/extra/embeddings",
    "/classify",
    "/score",
    "/v1/score",
    "/pooling",
    # A path only the router's text catch-all leads to.
    "/v1/sim/{tail:.*}",
)


def register(app: web.Application) -> None:
    """Add this family's routes to the simulated backend."""
    app[RESPONSES_KEY] = {}
    app.router.add_post("/v1/responses", handle_responses)
    app.router.add_post("/v1/responses/input_tokens", handle_input_tokens)
    app.router.add_get("/v1/responses/{rid}", handle_response_get)
    app.router.add_delete("/v1/responses/{rid}", handle_response_delete)
    app.router.add_post("/v1/responses/{rid}/cancel", handle_response_cancel)
    app.router.add_post("/v1/messages", handle_messages)
    app.router.add_post("/v1/messages/count_tokens", handle_count_tokens)
    app.router.add_post("/tokenize", handle_tokenize)
    for path in ECHO_PATHS:
        app.router.add_post(path, handle_echo)
    app.router.add_get("/musicui", handle_music)
    app.router.add_get("/musicui/{tail:.*}", handle_music)
    app.router.add_route("*", "/api/extra/music/{tail:.*}", handle_music)
