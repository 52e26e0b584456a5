"""The owner's cutoff for a lent request (spec: a lent request whose helper has not started
answering after three times the predicted switch and job time plus 30 seconds is cut off and
served by the owner): it ends when the helper starts answering, never half-way through an
answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web

from lending import flow
from lending.flow import CUTOFF_FACTOR, CUTOFF_GRACE_SECS, _cutoff, relay
from lending.planner import Lease
from proxy.forwarding.local import Job, shape_openai
from proxy.node import Node, build_node
from proxy.request import Ctx
from registry.httpclient import close_session
from routerproject.config import load_config

TOKEN = "cluster-secret-for-relay-tests"
WAIT_SECS = 10.0
# The cutoff these tests run with: 3 x (0 + 10 ms) + 0.2 s.
GRACE_SECS = 0.2
CUTOFF_SECS = 0.23
ANSWER = {"model": "fast", "choices": [{"message": {"role": "assistant", "content": "x" * 64}}]}


def lease(**speeds: Any) -> Lease:
    fields: dict[str, Any] = {
        "owner_job_ms": 10.0,
        "helper_switch_ms": 0.0,
        "helper_service_ms": 10.0,
        "probe": False,
    }
    fields.update(speeds)
    return Lease(
        lane="text",
        owner_node_id="o",
        owner_model_id="big",
        helper_node_id="h",
        helper_model_id="fast",
        load_helper_model=False,
        restore_helper_model=False,
        helper_slots=1,
        ttl_ms=30_000,
        **fields,
    )


def test_the_cutoff_is_three_times_switch_plus_job_plus_thirty_seconds() -> None:
    assert (CUTOFF_FACTOR, CUTOFF_GRACE_SECS) == (3.0, 30.0)
    assert _cutoff(lease(helper_switch_ms=1000.0, helper_service_ms=2000.0)) == 39.0
    assert _cutoff(lease(helper_switch_ms=None, helper_service_ms=500.0)) == 31.5


def test_probes_and_leases_without_measured_speeds_have_no_cutoff() -> None:
    assert _cutoff(lease(probe=True)) is None
    assert _cutoff(lease(owner_job_ms=None)) is None
    assert _cutoff(lease(helper_service_ms=None)) is None


@dataclass
class FakeMaster:
    """Answers `offload/request` as a master relaying a helper would, at a chosen pace."""

    header_delay: float = 0.0
    chunk_delay: float = 0.0
    chunks: int = 1
    release: asyncio.Event = field(default_factory=asyncio.Event)
    dies_after: int | None = None
    """Send this many bytes of a body announced whole (Content-Length), then close."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        if self.header_delay:
            # Held until the test ends, well past the cutoff.
            await self.release.wait()
        body = orjson.dumps(ANSWER)
        headers = {"Content-Type": "application/json"}
        if self.dies_after is not None:
            headers["Content-Length"] = str(len(body))
        resp = web.StreamResponse(status=200, headers=headers)
        await resp.prepare(request)
        if self.dies_after is not None:
            await resp.write(body[: self.dies_after])
            assert request.transport is not None
            request.transport.close()
            return resp
        step = -(-len(body) // self.chunks)
        for i in range(0, len(body), step):
            await asyncio.sleep(self.chunk_delay)
            await resp.write(body[i : i + step])
        await resp.write_eof()
        return resp


@pytest.fixture
async def fake_master() -> AsyncIterator[tuple[FakeMaster, str]]:
    fake = FakeMaster()
    app = web.Application()
    app.router.add_post("/router/v1/node/offload/request", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        fake.release.set()
        await runner.cleanup()
        await close_session()


@pytest.fixture
async def owner(tmp_path: Path, fake_master: tuple[FakeMaster, str]) -> AsyncIterator[Node]:
    (tmp_path / "kcpps").mkdir()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": {
                    "role": "slave",
                    "node_id": "o",
                    "token": TOKEN,
                    "public_url": "http://127.0.0.1:18996",
                    "master_url": fake_master[1],
                    "store_dir": str(tmp_path / "store"),
                },
                "models": {"config_dir": str(tmp_path / "kcpps")},
                "backend": {"mode": "sim"},
            }
        )
    )
    node = build_node(load_config(config_path, environ={}))
    yield node
    if node.client is not None:
        await node.client.aclose()


@dataclass
class Client:
    """The owner's client connection: what it was sent."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if "body" in m)


def lent_request(client: Client) -> tuple[Ctx, Job]:
    scope = {"type": "http", "headers": [], "query_string": b""}
    ctx = Ctx(scope, client.receive, client.send, "/v1/chat/completions", "POST")
    body = orjson.dumps({"model": "big", "messages": [{"role": "user", "content": "hi"}]})
    job = Job(
        cfg=None,  # type: ignore[arg-type]
        lane="text",
        model_id="big",
        public_id="big",
        backend_path="/v1/chat/completions",
        body=body,
    )
    return ctx, job


async def test_an_answer_that_streams_back_past_the_cutoff_is_not_cut_off(
    owner: Node, fake_master: tuple[FakeMaster, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flow, "CUTOFF_GRACE_SECS", GRACE_SECS)
    assert _cutoff(lease()) == pytest.approx(CUTOFF_SECS)
    fake, _ = fake_master
    # Headers at once, then the body over four times the cutoff.
    fake.chunks, fake.chunk_delay = 4, CUTOFF_SECS
    client = Client()
    ctx, job = lent_request(client)

    answered = await asyncio.wait_for(relay(ctx, owner, job, lease(), shape_openai), WAIT_SECS)

    assert answered
    assert client.messages[0]["status"] == 200
    assert orjson.loads(client.body()) == {**ANSWER, "model": "big"}


async def test_a_helper_that_has_not_started_answering_is_still_cut_off(
    owner: Node, fake_master: tuple[FakeMaster, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flow, "CUTOFF_GRACE_SECS", GRACE_SECS)
    fake, _ = fake_master
    fake.header_delay = 1.0
    client = Client()
    ctx, job = lent_request(client)

    answered = await asyncio.wait_for(relay(ctx, owner, job, lease(), shape_openai), WAIT_SECS)

    assert not answered
    assert client.messages == []  # the owner serves it itself, so the client is still unanswered


async def test_an_answer_that_breaks_off_is_run_by_the_owner_and_never_reaches_the_client(
    owner: Node, fake_master: tuple[FakeMaster, str]
) -> None:
    fake, _ = fake_master
    fake.dies_after = 20  # of a longer body, announced by its length
    client = Client()
    ctx, job = lent_request(client)

    answered = await asyncio.wait_for(relay(ctx, owner, job, lease(), shape_openai), WAIT_SECS)

    assert not answered
    assert client.messages == []
