"""Lent work the master takes back does not also finish on the helper: the relay's end reaches
the helper's router, which hangs up on its backend, and the backend (as llama-server) stops
the request there. The simulated backend logs a completion line only for work that ran to the
end, so its log is the witness.

The helper's router is stopped (its process group; the backends run in their own sessions and
keep running), as a router that hangs while its machine is up.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from tests.harness import RouterNode, wait_for
from tests.test_lending_silent_helper import AUTH, lending_cluster, lent_now, node_rows, stopped

pytestmark = pytest.mark.integration


def backend_log(node: RouterNode) -> str:
    return "".join(p.read_text() for p in sorted((node.store / "logs").glob("*-backend.log")))


def ran(node: RouterNode, mark: str) -> list[str]:
    """The `user` of every request the node's backends logged as `mark` (completed, cancelled)."""
    return [
        line.rsplit("user=", 1)[1]
        for line in backend_log(node).splitlines()
        if f"sim: {mark} " in line
    ]


def backend_active(node: RouterNode) -> int:
    """Requests the node's text backend runs right now (the sim's own count)."""
    with node.client() as client:
        state = client.get("/router/v1/node/state", headers=AUTH).json()
    url = next(b["base_url"] for b in state["backends"] if b["base_url"])
    active: int = httpx.get(url + "/sim/stats", timeout=5).json()["active"]
    return active


def test_a_request_taken_back_from_a_stopped_helper_is_cancelled_on_its_backend(
    tmp_path: Path,
) -> None:
    # The owner takes 1 s per request; a lent one would take the helper 20 s, far longer than
    # the stop. health_timeout 1 s: the master takes the work back soon after the stop.
    c = lending_cluster(
        tmp_path, owner_ms_per_token=40, helper_ms_per_token=800, health_timeout="1s"
    )
    try:
        owner, helper = c.slaves["o"], c.slaves["h"]
        users = [f"taken-back-{i}" for i in range(3)]
        answers: dict[str, int] = {}

        def call(user: str) -> None:
            body = {
                "model": "big",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 25,
                "user": user,
            }
            with owner.client(timeout=120) as client:
                resp = client.post(
                    "/v1/chat/completions", json=body, headers={"X-Request-Id": user}
                )
            answers[user] = resp.status_code

        threads = [threading.Thread(target=call, args=(u,), daemon=True) for u in users]
        for thread in threads:
            thread.start()
        wait_for(lambda: lent_now(owner), timeout=30)
        # Stopped only once the helper's backend is running the lent request.
        wait_for(lambda: backend_active(helper) == 1, timeout=30)
        with stopped(helper):
            wait_for(
                lambda: any(
                    r["reason"] == "helper_stalled"
                    for r in node_rows(c.master, outcome="relay_refused")
                ),
                timeout=30,
            )
        for thread in threads:
            thread.join(60)
        assert answers == dict.fromkeys(users, 200)
        [taken] = [
            str(r["request_id"])
            for r in node_rows(c.master, outcome="relay_refused")
            if r["reason"] == "helper_stalled"
        ]
        # The resumed router hung up on its backend, which stopped the request there.
        wait_for(lambda: "sim: cancelled" in backend_log(helper), timeout=30)
        assert ran(helper, "cancelled") == [taken]
        assert taken not in ran(helper, "completed")
        # Every request ran exactly once (the helper, answering again, may be lent another).
        assert sorted(ran(owner, "completed") + ran(helper, "completed")) == users
        assert taken in ran(owner, "completed")
    finally:
        c.cleanup()
