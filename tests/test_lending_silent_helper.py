"""A hung helper on a real cluster: its router process group is stopped (SIGSTOP), so nothing
resets a connection and nothing answers.

Each test stops a node, so each starts its own cluster. While the helper is stopped only the
master's and the owner's own node endpoints are asked (a site-wide query would wait on the
stopped node too). The leases here are probes, which have no cutoff at all: lent work comes
back only because the master noticed the helper does not answer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import CLUSTER_TOKEN, Cluster, RouterNode, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
ANSWER_SECS = 90.0


def lending_cluster(
    root: Path, *, owner_ms_per_token: int, helper_ms_per_token: int, **master: Any
) -> Cluster:
    c = start_cluster(
        root,
        [],
        {
            "o": [text_model("big", output_ms_per_token=owner_ms_per_token)],
            "h": [text_model("fast", output_ms_per_token=helper_ms_per_token)],
        },
        master_sections={
            "cluster": {
                "offload_probe_idle": "100ms",
                # One request in the owner's backend: the rest are held, and can be lent.
                "scheduling_backend_depth": 1,
                **master,
            }
        },
    )
    try:
        with c.master.client() as client:
            link = {
                "anchor": {"node_id": "o", "model_id": "big"},
                "lends_to": [{"node_id": "h", "model_id": "fast"}],
                "acknowledge_different_weights": True,
            }
            resp = client.post("/router/v1/site/text-routing-groups", json=link)
            assert resp.status_code == 200, resp.text
            client.post("/router/v1/load", json={"model": "fast"}).raise_for_status()
    except BaseException:
        c.cleanup()
        raise
    return c


class Burst:
    """`n` client requests to the owner at once, each answered (or not) exactly once."""

    def __init__(self, node: RouterNode, n: int, max_tokens: int) -> None:
        self.responses: list[httpx.Response] = []
        self._lock = threading.Lock()
        body = {
            "model": "big",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": max_tokens,
        }

        def call() -> None:
            with node.client(timeout=ANSWER_SECS * 2) as client:
                resp = client.post("/v1/chat/completions", json=body)
            with self._lock:
                self.responses.append(resp)

        self._threads = [threading.Thread(target=call, daemon=True) for _ in range(n)]
        for thread in self._threads:
            thread.start()

    def join(self) -> list[httpx.Response]:
        for thread in self._threads:
            thread.join(ANSWER_SECS)
        assert not any(t.is_alive() for t in self._threads), "a client is still unanswered"
        return self.responses


def node_rows(node: RouterNode, **params: str) -> list[dict[str, Any]]:
    """One node's own decision rows (never asks any other node)."""
    with node.client() as client:
        resp = client.get(
            "/router/v1/node/offload/decisions",
            params={"limit": "5000", **params},
            headers=AUTH,
        )
    resp.raise_for_status()
    records: list[dict[str, Any]] = resp.json()["records"]
    return records


def lent_now(owner: RouterNode) -> list[dict[str, Any]]:
    with owner.client() as client:
        resp = client.get("/router/v1/node/offload/summary", headers=AUTH)
    resp.raise_for_status()
    return [r for r in resp.json()["held_requests"] if r["state"] == "lent"]


@contextlib.contextmanager
def stopped(node: RouterNode) -> Iterator[None]:
    """The node's router process group stopped: connections open, nothing answered."""
    os.killpg(node.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(node.proc.pid, signal.SIGCONT)


def assert_all_answered_once(responses: list[httpx.Response], n: int) -> None:
    assert [r.status_code for r in responses] == [200] * n
    assert all(r.json()["model"] == "big" for r in responses)


def assert_given_back(
    c: Cluster, refused: list[dict[str, Any]], returned: list[dict[str, Any]]
) -> None:
    """The lent request went back as the stall check's "no", under a lease with no cutoff."""
    assert [r["helper_node_id"] for r in refused if r["reason"] == "helper_stalled"] == ["h"]
    # Any later relay to the silent helper is refused at once; each one came back to the owner.
    assert {r["reason"] for r in refused} <= {"helper_stalled", "helper_unreachable"}
    assert len(returned) == len(refused)
    assert {r["helper_node_id"] for r in returned} == {"h"}
    grants = [r for r in node_rows(c.master, kind="plan") if r["outcome"] != "skipped"]
    assert grants and {r["outcome"] for r in grants} == {"probe"}


STATUS_MISSED = "node h does not answer its status poll in time (runtime status"


def test_a_helper_that_stops_answering_its_status_poll_gives_its_lent_work_back(
    tmp_path: Path,
) -> None:
    # The owner takes 1 s per request; a lent request would take the helper 10 s.
    c = lending_cluster(tmp_path, owner_ms_per_token=40, helper_ms_per_token=400)
    try:
        burst = Burst(c.slaves["o"], 4, max_tokens=25)
        wait_for(lambda: lent_now(c.slaves["o"]), timeout=30)
        with stopped(c.slaves["h"]):
            # The owner's next finished job asks the master, whose plan polls the helper.
            assert_all_answered_once(burst.join(), 4)
            refused = node_rows(c.master, outcome="relay_refused")
            returned = node_rows(c.slaves["o"], outcome="returned")
        assert_given_back(c, refused, returned)
        out = c.master.output()
        # A missed status poll only skips it for planning; the work went back once a question
        # of health_timeout went unanswered too (the confirmation or the health poll).
        assert STATUS_MISSED in out
        assert "node h does not answer (" in out
    finally:
        c.cleanup()


def test_a_helper_that_fails_a_health_poll_gives_its_lent_work_back(tmp_path: Path) -> None:
    # One request in the owner's backend and one lent. The owner's job takes 10 s, so no
    # owner event reaches the master before its health poll of the stopped helper times out
    # (1 s, after at most one 1 s interval): only the health poll can give the work back.
    c = lending_cluster(
        tmp_path, owner_ms_per_token=400, helper_ms_per_token=400, control_timeout="1s"
    )
    try:
        burst = Burst(c.slaves["o"], 2, max_tokens=25)
        wait_for(lambda: lent_now(c.slaves["o"]), timeout=30)
        with stopped(c.slaves["h"]):
            assert_all_answered_once(burst.join(), 2)
            refused = node_rows(c.master, outcome="relay_refused")
            returned = node_rows(c.slaves["o"], outcome="returned")
        assert_given_back(c, refused, returned)
        assert "node h does not answer (health poll failed)" in c.master.output()
    finally:
        c.cleanup()


def test_plans_leave_out_a_silent_helper_and_take_it_back_once_it_answers(
    tmp_path: Path,
) -> None:
    c = lending_cluster(tmp_path, owner_ms_per_token=40, helper_ms_per_token=2)
    try:
        with stopped(c.slaves["h"]):
            assert_all_answered_once(Burst(c.slaves["o"], 4, max_tokens=10).join(), 4)
            # The burst's plans polled h; on a busy machine the last poll may still be waiting
            # for its timeout, and h must not answer it (resumed) before then.
            wait_for(lambda: STATUS_MISSED in c.master.output(), timeout=30)
            plans = node_rows(c.master, kind="plan")
            lent = node_rows(c.slaves["o"], outcome="lent")
        # Not a candidate while silent: no plan row names it, nothing was lent to it.
        assert [r for r in plans if r.get("helper_node_id") == "h"] == []
        assert lent == []

        wait_for(lambda: "node h answers again" in c.master.output(), timeout=30)
        assert_all_answered_once(Burst(c.slaves["o"], 6, max_tokens=10).join(), 6)
        plans = node_rows(c.master, kind="plan")
        assert any(r.get("helper_node_id") == "h" and r["outcome"] == "probe" for r in plans)
        assert any(r["helper_node_id"] == "h" for r in node_rows(c.slaves["o"], outcome="lent"))
    finally:
        c.cleanup()
