"""The error that ends a stream already under way, in the stream's own format per path family,
and Anthropic's envelope as the OpenAPI document describes it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from proxy.api.schema import openapi_document
from proxy.edge.app import ProxyApp
from proxy.request import Ctx
from routerproject.errors import RouterError, error_body


async def _ended(path: str) -> bytes:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    ctx = Ctx({"type": "http", "headers": []}, receive, send, path, "POST")
    ctx.started = True  # the head went out: only the body can say what went wrong
    await ProxyApp._abort_stream(ctx, RouterError(502, "backend died", type="backend_error"))
    assert ctx.finished and sent[-1]["more_body"] is False
    body: bytes = sent[-1]["body"]
    return body


@pytest.mark.asyncio
async def test_an_anthropic_stream_ends_with_anthropics_error_event() -> None:
    body = await _ended("/v1/messages")
    head, _, data = body.partition(b"\ndata: ")
    assert head == b"event: error" and data.endswith(b"\n\n")
    assert orjson.loads(data) == {
        "type": "error",
        "error": {"type": "api_error", "message": "backend died"},
    }


@pytest.mark.asyncio
async def test_openai_and_ollama_streams_keep_their_error_shapes() -> None:
    openai = await _ended("/v1/chat/completions")
    assert openai.startswith(b"data: ") and b'"type":"backend_error"' in openai
    assert orjson.loads(await _ended("/api/chat")) == {"error": "backend died"}


def test_the_anthropic_envelope_is_the_one_the_document_describes() -> None:
    schema = openapi_document()["components"]["schemas"]["AnthropicError"]
    # Closed to fields the document does not name: a field sent but not described fails.
    closed = {**schema, "unevaluatedProperties": False}
    closed["properties"] = {
        **schema["properties"],
        "error": {
            **schema["properties"]["error"],
            "unevaluatedProperties": False,
            "properties": {
                **schema["properties"]["error"]["properties"],
                "details": {
                    **schema["properties"]["error"]["properties"]["details"],
                    "unevaluatedProperties": False,
                },
            },
        },
    }
    validator = Draft202012Validator(closed)
    for err in (
        RouterError(404, "x", code="model_not_found", param="model"),
        RouterError(500, "y"),
    ):
        body = orjson.loads(error_body("/v1/messages", err))
        assert list(validator.iter_errors(body)) == []
    assert list(validator.iter_errors({"type": "error", "error": {"message": "x"}})) != []
