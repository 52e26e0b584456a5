"""How a request's context (proxy/request.py, `Ctx`) hands its answer to the server: a whole
answer in one message where the server takes it and nothing has wrapped its `send`, else the
answer's start and its body."""

from __future__ import annotations

from typing import Any

from proxy.request import JSON, WHOLE_ANSWER, Ctx, Message


class Server:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    async def receive(self) -> Message:
        raise AssertionError("not read in these tests")


def _ctx(server: Server, *, whole: bool) -> Ctx:
    scope: dict[str, Any] = {"type": "http", "headers": []}
    send = server.send
    ctx = Ctx(scope, server.receive, send, "/v1/models", "GET", request_id="rid-1")
    if whole:
        ctx.whole_send = send
    return ctx


async def test_a_server_that_takes_whole_answers_gets_one_message() -> None:
    server = Server()
    ctx = _ctx(server, whole=True)
    await ctx.respond(429, b"{}", extra=[(b"retry-after", b"2")])
    assert server.sent == [
        {
            "type": WHOLE_ANSWER,
            "status": 429,
            "headers": [
                (b"content-type", JSON),
                (b"retry-after", b"2"),
                (b"x-request-id", b"rid-1"),
            ],
            "body": b"{}",
        }
    ]
    assert (ctx.started, ctx.finished, ctx.status, ctx.sent_bytes) == (True, True, 429, 2)
    assert ctx.first_byte > 0


async def test_any_other_server_gets_the_start_and_the_body() -> None:
    server = Server()
    ctx = _ctx(server, whole=False)
    await ctx.respond(200, b"hello", b"text/plain")
    assert [m["type"] for m in server.sent] == ["http.response.start", "http.response.body"]
    assert server.sent[0]["headers"] == [
        (b"content-type", b"text/plain"),
        (b"content-length", b"5"),
        (b"x-request-id", b"rid-1"),
    ]
    assert server.sent[1] == {"type": "http.response.body", "body": b"hello", "more_body": False}
    assert (ctx.started, ctx.finished, ctx.status, ctx.sent_bytes) == (True, True, 200, 5)


async def test_a_wrapped_send_gets_the_start_and_the_body() -> None:
    # A wrapper (the key limits' headers, the media tap) reads the start message: a whole
    # answer would pass it by.
    server = Server()
    ctx = _ctx(server, whole=True)
    seen: list[str] = []

    async def wrapper(message: Message) -> None:
        seen.append(message["type"])
        await server.send(message)

    ctx.send = wrapper
    await ctx.respond(200, b"{}")
    assert seen == ["http.response.start", "http.response.body"]
