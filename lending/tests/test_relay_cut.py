"""A helper whose answer breaks off after its headers: the master reads the answer whole before
the owner is sent a byte, so the owner gets its 409 and runs the request itself, instead of a
truncated answer or a 502 it cannot retry (the owner side: test_relay_cutoff.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web

from lending.tests.test_master_silent import FakeSlave, Site, lend, site  # noqa: F401
from lending.tests.test_relay_cutoff import Client
from proxy.edge.nodeapi import handle_offload_request
from proxy.request import Ctx
from routerproject.errors import RouterError

ANSWER = orjson.dumps({"model": "fast", "choices": [{"message": {"content": "x" * 200}}]})


@dataclass
class BreakingHelper:
    """Answers lent requests with a length, then sends `sent` bytes of the body and closes."""

    sent: int
    stream: bool = False
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    async def inference(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        ctype = "text/event-stream" if self.stream else "application/json"
        headers = {"Content-Type": ctype}
        if not self.stream:
            headers["Content-Length"] = str(len(ANSWER))
        resp = web.StreamResponse(status=200, headers=headers)
        await resp.prepare(request)
        await resp.write(ANSWER[: self.sent])
        if self.sent < len(ANSWER):
            # The helper dies here: its connection closes with the answer half sent.
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write_eof()
        return resp


@pytest.fixture(autouse=True)
def helper(monkeypatch: pytest.MonkeyPatch) -> BreakingHelper:
    """The fake helper node answers lent requests this way (autouse: set before the site's
    servers are built from the class)."""
    fake = BreakingHelper(sent=len(ANSWER) // 3)

    async def inference(_slave: FakeSlave, request: web.Request) -> web.StreamResponse:
        return await fake.inference(request)

    monkeypatch.setattr(FakeSlave, "inference", inference)
    return fake


def lent_request(owner: Client) -> Ctx:
    headers = [
        (b"x-tensors-offload-owner", b"o"),
        (b"x-tensors-offload-owner-model", b"big"),
        (b"x-tensors-offload-path", b"/v1/chat/completions"),
        (b"x-tensors-offload-lane", b"text"),
        (b"content-type", b"application/json"),
    ]
    scope = {"type": "http", "headers": headers, "query_string": b""}
    ctx = Ctx(scope, owner.receive, owner.send, "/router/v1/node/offload/request", "POST")
    ctx.body = b'{"model": "big"}'
    ctx.request_id = "cut-1"
    return ctx


async def test_an_answer_cut_short_after_its_headers_goes_back_to_the_owner(
    site: Site,  # noqa: F811
    helper: BreakingHelper,
) -> None:
    lend(site)
    owner = Client()
    with pytest.raises(RouterError) as err:
        await asyncio.wait_for(handle_offload_request(lent_request(owner), site.node), 10)
    assert (err.value.status, err.value.code) == (409, "offload_returned")
    # Nothing of the broken answer reached the owner: it runs the request itself.
    assert owner.messages == []
    cut = [r for r in site.rows if r.get("outcome") == "relay_refused"]
    assert [(r["reason"], r["request_id"], r["helper_node_id"]) for r in cut] == [
        ("helper_cut_off", "cut-1", "h")
    ]


async def test_a_whole_answer_is_passed_on_with_its_length(
    site: Site,  # noqa: F811
    helper: BreakingHelper,
) -> None:
    lend(site)
    helper.sent = len(ANSWER)
    owner = Client()
    await asyncio.wait_for(handle_offload_request(lent_request(owner), site.node), 10)
    start, *body = owner.messages
    assert start["status"] == 200
    assert (b"content-length", str(len(ANSWER)).encode()) in start["headers"]
    assert b"".join(m["body"] for m in body) == ANSWER
    assert not [r for r in site.rows if r.get("outcome") == "relay_refused"]


async def test_a_stream_goes_on_as_it_comes(
    site: Site,  # noqa: F811
    helper: BreakingHelper,
) -> None:
    # A stream's first bytes are the client's at once: it is relayed chunk by chunk, and a
    # stream that breaks is the owner's to end with an error event.
    lend(site)
    helper.stream, helper.sent = True, len(ANSWER)
    owner = Client()
    await asyncio.wait_for(handle_offload_request(lent_request(owner), site.node), 10)
    assert owner.messages[0]["status"] == 200
    assert not any(k == b"content-length" for k, _ in owner.messages[0]["headers"])
    assert b"".join(m.get("body", b"") for m in owner.messages[1:]) == ANSWER
