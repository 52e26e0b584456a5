"""Helper-side lending on real clusters: own work takes borrowed work back, restore after
borrow, and a master that is itself the helper serving lent work in-process."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Cluster, RouterNode, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration


def link(c: Cluster, owner: tuple[str, str], helper: tuple[str, str], **flags: bool) -> None:
    body = {
        "anchor": {"node_id": owner[0], "model_id": owner[1]},
        "lends_to": [{"node_id": helper[0], "model_id": helper[1], **flags}],
        "acknowledge_different_weights": True,
    }
    with c.master.client() as client:
        resp = client.post("/router/v1/site/text-routing-groups", json=body)
        assert resp.status_code == 200, resp.text


def burst(
    node: RouterNode, model: str, n: int, max_tokens: int
) -> tuple[list[int], threading.Thread]:
    statuses: list[int] = []

    def call() -> None:
        with node.client(timeout=120) as client:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": max_tokens,
            }
            resp = client.post("/v1/chat/completions", json=body)
            statuses.append(resp.status_code)
            assert resp.json()["model"] == model

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()

    def join() -> None:
        for t in threads:
            t.join()

    joiner = threading.Thread(target=join)
    joiner.start()
    return statuses, joiner


def rows(c: Cluster, **params: str) -> list[dict[str, Any]]:
    with c.master.client() as client:
        return client.get(
            "/router/v1/site/offload/decisions", params={"limit": "2000", **params}
        ).json()["records"]


def loaded(c: Cluster, node_id: str) -> list[str]:
    with c.master.client() as client:
        state = client.get("/router/v1/site/nodes/state", params={"node_id": node_id}).json()
    return [m["model_id"] for b in state["backends"] for m in b["loaded_models"]]


def test_the_helpers_own_request_takes_back_borrowed_work_it_has_not_started(
    tmp_path: Path,
) -> None:
    c = start_cluster(
        tmp_path,
        [],
        {
            "o": [text_model("big", output_ms_per_token=40)],
            "h": [text_model("fast", output_ms_per_token=30)],
        },
        master_sections={
            "cluster": {
                "offload_probe_idle": "100ms",
                "offload_probe_helper_slots": 4,
                "scheduling_backend_depth": 1,
            }
        },
    )
    try:
        link(c, ("o", "big"), ("h", "fast"))
        with c.master.client() as client:
            client.post("/router/v1/load", json={"model": "fast"}).raise_for_status()
        statuses, joiner = burst(c.slaves["o"], "big", 8, 10)
        # Wait until the helper holds several borrowed requests, then give it work of its own.
        wait_for(lambda: len([r for r in rows(c, outcome="lent")]) >= 3, timeout=30)
        with c.slaves["h"].client() as client:
            body = {
                "model": "fast",
                "messages": [{"role": "user", "content": "mine"}],
                "max_tokens": 2,
            }
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        joiner.join(120)
        assert statuses == [200] * 8
        returned = rows(c, outcome="borrowed_returned")
        assert returned and {r["reason"] for r in returned} <= {
            "own_work_arrived",
            "helper_busy_on_arrival",
        }
        assert rows(c, outcome="returned")  # the owner logged each one coming back
    finally:
        c.cleanup()


def test_a_helper_reloads_the_model_borrowed_work_displaced(tmp_path: Path) -> None:
    c = start_cluster(
        tmp_path,
        [],
        {
            "o": [text_model("big", output_ms_per_token=40)],
            "h": [
                text_model("fast", output_ms_per_token=2),
                text_model("mine", output_ms_per_token=2),
            ],
        },
        master_sections={
            "cluster": {"offload_probe_idle": "100ms", "offload_restore_delay": "300ms"}
        },
    )
    try:
        link(c, ("o", "big"), ("h", "fast"), load_if_unloaded=True, restore_after_borrow=True)
        with c.slaves["h"].client() as client:
            body = {
                "model": "mine",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1,
            }
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert loaded(c, "h") == ["mine"]
        # The helper must switch, so its probe bar is 12 x 100 ms of its own idle time.
        statuses, joiner = burst(c.slaves["o"], "big", 10, 20)
        joiner.join(120)
        assert statuses == [200] * 10
        assert rows(c, outcome="lent"), "nothing was lent"
        wait_for(lambda: loaded(c, "h") == ["mine"], timeout=30)
    finally:
        c.cleanup()


def test_a_master_that_is_the_helper_serves_lent_work_in_process(tmp_path: Path) -> None:
    c = start_cluster(
        tmp_path,
        [text_model("fast", output_ms_per_token=2)],
        {"o": [text_model("big", output_ms_per_token=40)]},
        master_sections={"cluster": {"offload_probe_idle": "100ms"}},
    )
    try:
        link(c, ("o", "big"), ("master", "fast"))
        with c.master.client() as client:
            client.post("/router/v1/load", json={"model": "fast"}).raise_for_status()
        # No waiting here: a probe held back only by the idle bar is planned again by the
        # master's probe-due timer the moment the helper has idled long enough.
        statuses, joiner = burst(c.slaves["o"], "big", 8, 10)
        joiner.join(120)
        assert statuses == [200] * 8
        with c.master.client() as client:
            served = [
                r
                for r in client.get("/router/v1/site/analytics").json()["records"]
                if r["borrowed"]
            ]
        assert served and all(r["model_id"] == "fast" for r in served)
    finally:
        c.cleanup()
