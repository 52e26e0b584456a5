"""The master and a node that stops answering (spec: the stall check's "no"; a node whose poll
fails contributes nothing to a plan).

The slaves are small HTTP servers on loopback that answer the node protocol the master uses,
and can be "stopped": their answers wait, as a SIGSTOPped router's would, until resumed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from lending.master import MasterLending, RelayRefused
from lending.planner import Lease
from proxy.node import Node, build_node
from registry.httpclient import close_session
from routerproject.config import load_config

TOKEN = "cluster-secret-for-master-tests"
WAIT_SECS = 10.0
# Long enough that a loaded test machine never makes the answering owner look silent.
STATUS_TIMEOUT = "1s"
STATUS_SECS = 1.0
# Long: a test that resumes a stopped helper does so well within it, on any machine.
HEALTH_TIMEOUT = "30s"
NO_COSTS: dict[str, list[Any]] = {"models": [], "loads": [], "tokens": []}


@dataclass
class FakeSlave:
    node_id: str
    model_id: str
    status: dict[str, Any]
    url: str = ""
    running: asyncio.Event = field(default_factory=asyncio.Event)
    """Cleared while the node is stopped: it accepts connections but answers nothing."""
    finish_answers: asyncio.Event = field(default_factory=asyncio.Event)
    answers_start: bool = False
    """Inference answers send their headers at once, then wait for `finish_answers`."""
    borrowed_status: int = 200
    status_polls: int = 0
    borrowed_polls: int = 0
    asked: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at every status or stall-check question that arrives."""
    inference_arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.running.set()

    def snapshot(self) -> dict[str, Any]:
        record = {
            "local_id": self.model_id,
            "model_hash": "a" * 64,
            "config_hash": "b" * 64,
            "filename": f"{self.model_id}.kcpps",
            "has_llm": True,
            "context_size": 4096,
            "text_ineligible_reason": None,
        }
        return {
            "node_id": self.node_id,
            "node_url": self.url,
            "models": [record],
            "protocol_version": 2,
        }

    async def runtime_status(self, request: web.Request) -> web.Response:
        self.status_polls += 1
        self.asked.set()
        await self.running.wait()
        return web.json_response({"node_id": self.node_id, **self.status})

    async def borrowed(self, request: web.Request) -> web.Response:
        self.borrowed_polls += 1
        self.asked.set()
        await self.running.wait()
        if self.borrowed_status != 200:
            return web.json_response({"error": "not found"}, status=self.borrowed_status)
        return web.json_response({"borrowed": 1})

    async def inference(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.inference_arrived.set()
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        if self.answers_start:
            await resp.prepare(request)
        await self.finish_answers.wait()
        if not self.answers_start:
            await resp.prepare(request)
        await resp.write(b'{"model": "fast"}')
        await resp.write_eof()
        return resp

    async def grant(self, request: web.Request) -> web.Response:
        return web.json_response(await request.json())

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/router/v1/node/runtime-status", self.runtime_status)
        app.router.add_get("/router/v1/node/offload/borrowed", self.borrowed)
        app.router.add_post("/router/v1/node/inference/v1/chat/completions", self.inference)
        app.router.add_post("/router/v1/node/offload/grant", self.grant)
        return app

    def release_all(self) -> None:
        self.running.set()
        self.finish_answers.set()


@dataclass
class Site:
    node: Node
    master: MasterLending
    owner: FakeSlave
    helper: FakeSlave
    rows: list[dict[str, Any]]


@pytest.fixture
async def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Site]:
    owner = FakeSlave(
        "o",
        "big",
        {
            "text_queue": [
                {"model_id": "big", "pending_count": 3, "lendable_count": 3, "backlog_count": 4}
            ],
            "costs": NO_COSTS,
        },
    )
    helper = FakeSlave(
        "h",
        "fast",
        {
            "active_text_config": "fast.kcpps",
            "accepting_borrowed_text": True,
            "idle_for_ms": 600_000,
            "costs": NO_COSTS,
        },
    )
    runners = []
    for slave in (owner, helper):
        runner = web.AppRunner(slave.app(), shutdown_timeout=0.1)
        await runner.setup()
        tcp = web.TCPSite(runner, "127.0.0.1", 0)
        await tcp.start()
        slave.url = f"http://127.0.0.1:{tcp._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        runners.append(runner)
    (tmp_path / "kcpps").mkdir()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "cluster": {
                    "role": "master",
                    "node_id": "master",
                    "token": TOKEN,
                    "public_url": "http://127.0.0.1:18995",
                    "slave_urls": [owner.url, helper.url],
                    "store_dir": str(tmp_path / "store"),
                    "lending_status_timeout": STATUS_TIMEOUT,
                    "health_timeout": HEALTH_TIMEOUT,
                    # Plans must be the only askers unless a test says otherwise.
                    "lending_reprobe_interval": "1h",
                },
                "models": {"config_dir": str(tmp_path / "kcpps")},
                "backend": {"mode": "sim"},
            }
        )
    )
    node = build_node(load_config(config_path, environ={}))
    for slave in (owner, helper):
        node.cluster.apply_poll(slave.url, slave.snapshot())
    link = {
        "owner_node_id": "o",
        "owner_model_id": "big",
        "helper_node_id": "h",
        "helper_model_id": "fast",
        "load_if_unloaded": True,
        "restore_after_borrow": False,
    }
    node.lending.set_links({"text": [link], "image": []})
    rows: list[dict[str, Any]] = []
    monkeypatch.setattr(node.decisions, "record", lambda **fields: rows.append(fields))
    master = node.master
    assert master is not None
    try:
        yield Site(node, master, owner, helper, rows)
    finally:
        owner.release_all()
        helper.release_all()
        await master.close()
        for runner in runners:
            await runner.cleanup()
        if node.client is not None:
            await node.client.aclose()
        await close_session()


def lend(site: Site) -> None:
    lease = Lease(
        lane="text",
        owner_node_id="o",
        owner_model_id="big",
        helper_node_id="h",
        helper_model_id="fast",
        load_helper_model=True,
        restore_helper_model=False,
        helper_slots=1,
        probe=True,
        ttl_ms=30_000,
        owner_job_ms=None,
        helper_switch_ms=None,
        helper_service_ms=None,
    )
    site.master.book[("text", "o", "big")] = (lease, time.monotonic() + 30.0)


async def relay(site: Site, answering: asyncio.Event | None = None) -> tuple[int, bytes]:
    """One lent request through the master, as `offload/request` sends it."""
    async with site.master.open_helper(
        lane="text",
        owner_node="o",
        owner_model="big",
        path="/v1/chat/completions",
        body=b'{"model": "big"}',
        content_type="application/json",
    ) as resp:
        if answering is not None:
            answering.set()
        return resp.status, await resp.read()


async def lent_request(site: Site) -> asyncio.Task[tuple[int, bytes]]:
    lend(site)
    task = asyncio.ensure_future(relay(site))
    await asyncio.wait_for(site.helper.inference_arrived.wait(), WAIT_SECS)
    return task


def refusals(site: Site) -> list[str]:
    return [r["reason"] for r in site.rows if r.get("outcome") == "relay_refused"]


def plan_rows_naming(site: Site, helper: str) -> list[dict[str, Any]]:
    return [r for r in site.rows if r["kind"] == "plan" and r.get("helper_node_id") == helper]


def short_health_timeout(site: Site, monkeypatch: pytest.MonkeyPatch, secs: float) -> None:
    config = site.node.config
    cluster = config.cluster.model_copy(update={"health_timeout": secs})
    monkeypatch.setattr(site.node, "config", config.model_copy(update={"cluster": cluster}))


def spy_calls(site: Site, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float | None]]:
    """Every node call the master makes from now on: (base URL, path, timeout)."""
    client = site.node.client
    assert client is not None
    calls: list[tuple[str, str, float | None]] = []
    call_ok = client.call_ok

    async def spy(method: str, base_url: str, path: str, **kwargs: Any) -> Any:
        calls.append((base_url, path, kwargs.get("timeout")))
        return await call_ok(method, base_url, path, **kwargs)

    monkeypatch.setattr(client, "call_ok", spy)
    return calls


async def until_asked(slave: FakeSlave, predicate: Any) -> None:
    """Until `predicate()` holds, re-checked at each question `slave` gets."""
    async with asyncio.timeout(WAIT_SECS):
        while not predicate():
            slave.asked.clear()
            await slave.asked.wait()


async def test_a_helper_slow_to_answer_its_status_poll_keeps_its_lent_work(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = spy_calls(site, monkeypatch)
    lent = await lent_request(site)
    site.helper.running.clear()

    await site.master.plan("completed")

    # Skipped for planning at once; the work it was lent stays while a longer question waits.
    assert site.master.silent == {"h"}
    await until_asked(site.helper, lambda: site.helper.status_polls == 2)
    confirm = site.master._confirms["h"]
    asked = [(path, timeout) for url, path, timeout in calls if url == site.helper.url]
    assert asked == [
        ("/router/v1/node/runtime-status", STATUS_SECS),
        ("/router/v1/node/runtime-status", 30.0),
    ]
    assert not lent.done()
    site.helper.running.set()  # the stopped router resumes and answers what waited

    await asyncio.wait_for(confirm, WAIT_SECS)
    assert site.master.silent == set()
    site.helper.finish_answers.set()
    assert await asyncio.wait_for(lent, WAIT_SECS) == (200, b'{"model": "fast"}')
    assert refusals(site) == []


async def test_a_helper_that_misses_the_longer_question_too_loses_its_lent_requests(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    short_health_timeout(site, monkeypatch, 1.5)
    calls = spy_calls(site, monkeypatch)
    lent = await lent_request(site)
    site.helper.running.clear()

    await site.master.plan("completed")

    with pytest.raises(RelayRefused) as refused:
        await asyncio.wait_for(lent, WAIT_SECS)
    assert refused.value.reason == "helper_stalled"
    assert refusals(site) == ["helper_stalled"]
    assert site.master.silent == {"h"}
    assert site.master.relays["h"] == set()
    timeouts = [t for url, path, t in calls if url == site.helper.url and "status" in path]
    assert timeouts[:2] == [STATUS_SECS, 1.5]


async def test_a_silent_helper_gets_no_more_lent_requests(site: Site) -> None:
    site.helper.running.clear()
    await site.master.plan("completed")
    lend(site)  # a lease the owner still holds, granted before the helper went silent

    with pytest.raises(RelayRefused) as refused:
        await asyncio.wait_for(relay(site), WAIT_SECS)

    assert refused.value.reason == "helper_unreachable"
    assert not site.helper.inference_arrived.is_set()


async def test_plans_poll_with_the_short_timeout_and_skip_a_silent_node_until_it_answers(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = spy_calls(site, monkeypatch)
    site.helper.running.clear()

    await site.master.plan("enqueued")
    await site.master.plan("completed")
    await site.master.plan("tick")
    await until_asked(site.helper, lambda: site.helper.status_polls == 2)

    # One plan poll with the short timeout, then the one longer question; later plans skip it.
    helper_polls = [timeout for url, _, timeout in calls if url == site.helper.url]
    assert helper_polls == [STATUS_SECS, 30.0]
    assert helper_polls[0] == site.node.config.cluster.lending_status_timeout
    assert helper_polls[1] == site.node.config.cluster.health_timeout
    assert [url for url, _, _ in calls].count(site.owner.url) == 3
    assert plan_rows_naming(site, "h") == []

    # A successful health poll says it answers again: the next plan polls it and plans it.
    site.helper.running.set()
    site.node.cluster.apply_poll(site.helper.url, site.helper.snapshot())
    assert site.master.silent == set()
    await site.master.plan("completed")

    assert [url for url, _, _ in calls].count(site.helper.url) == 3
    assert [r["outcome"] for r in plan_rows_naming(site, "h")] == ["probe"]


async def test_a_silent_node_is_probed_in_the_background_and_planned_once_it_answers(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = site.node.config
    cluster = config.cluster.model_copy(update={"lending_reprobe_interval": 0.01})
    monkeypatch.setattr(site.node, "config", config.model_copy(update={"cluster": cluster}))
    answered = asyncio.Event()
    node_answers = site.master.node_answers

    def answers(node_id: str) -> None:
        node_answers(node_id)
        answered.set()

    monkeypatch.setattr(site.master, "node_answers", answers)
    site.helper.running.clear()
    await site.master.plan("enqueued")
    assert site.master.silent == {"h"}

    site.helper.running.set()  # the stopped process resumes and answers what waited
    await asyncio.wait_for(answered.wait(), WAIT_SECS)

    assert site.master.silent == set()
    await site.master.plan("completed")
    assert [r["outcome"] for r in plan_rows_naming(site, "h")] == ["probe"]


async def test_a_failed_health_poll_returns_lent_work_and_a_good_one_ends_the_silence(
    site: Site,
) -> None:
    lent = await lent_request(site)

    site.node.cluster.mark_unhealthy(site.helper.url, "timed out")

    with pytest.raises(RelayRefused) as refused:
        await asyncio.wait_for(lent, WAIT_SECS)
    assert refused.value.reason == "helper_stalled"
    assert site.master.silent == {"h"}

    site.node.cluster.apply_poll(site.helper.url, site.helper.snapshot())
    assert site.master.silent == set()


async def test_a_request_the_helper_has_started_answering_is_not_taken_back(site: Site) -> None:
    site.helper.answers_start = True
    lend(site)
    answering = asyncio.Event()
    lent = asyncio.ensure_future(relay(site, answering))
    await asyncio.wait_for(answering.wait(), WAIT_SECS)
    site.helper.running.clear()

    await site.master.plan("completed")
    assert site.master.silent == {"h"}
    site.helper.finish_answers.set()

    assert await asyncio.wait_for(lent, WAIT_SECS) == (200, b'{"model": "fast"}')
    assert refusals(site) == []


async def test_a_stall_check_nobody_answers_returns_the_lent_work(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    short_health_timeout(site, monkeypatch, 0.4)
    calls = spy_calls(site, monkeypatch)
    lent = await lent_request(site)
    site.helper.running.clear()

    await site.master._check_stalled("h")

    assert calls == [(site.helper.url, "/router/v1/node/offload/borrowed", 0.4)]

    with pytest.raises(RelayRefused) as refused:
        await asyncio.wait_for(lent, WAIT_SECS)
    assert refused.value.reason == "helper_stalled"
    assert site.master.silent == {"h"}


async def test_a_helper_on_a_build_without_the_stall_check_keeps_its_lent_work(
    site: Site,
) -> None:
    lent = await lent_request(site)
    site.helper.borrowed_status = 404

    await site.master._check_stalled("h")

    assert not lent.done()
    assert site.master.silent == set()
    site.helper.finish_answers.set()
    assert await asyncio.wait_for(lent, WAIT_SECS) == (200, b'{"model": "fast"}')


async def test_a_stall_check_answered_late_but_within_the_health_timeout_keeps_the_work(
    site: Site,
) -> None:
    lent = await lent_request(site)
    site.helper.running.clear()

    check = asyncio.ensure_future(site.master._check_stalled("h"))
    await until_asked(site.helper, lambda: site.helper.borrowed_polls == 1)
    await asyncio.sleep(STATUS_SECS + 0.2)  # longer than the status poll: slow, not a no
    site.helper.running.set()
    await asyncio.wait_for(check, WAIT_SECS)

    assert not lent.done()
    assert site.master.silent == set()
    site.helper.finish_answers.set()
    assert await asyncio.wait_for(lent, WAIT_SECS) == (200, b'{"model": "fast"}')
