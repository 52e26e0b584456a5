"""Faults on real processes: killed and frozen nodes, hung and crashed backends, restarts.

Every test starts its own nodes (`runrouter` subprocesses) and injects the fault with a real
signal: SIGKILL, SIGSTOP/SIGCONT, SIGTERM. Conditions are polled with a deadline, never slept.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import (
    CLUSTER_TOKEN,
    READY_MARK,
    Cluster,
    ModelSpec,
    RouterNode,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def shared(name: str) -> ModelSpec:
    # Same weights and settings on every node: replicas of one public ID.
    return text_model(name, load_ms=50, base_ms=5, output_ms_per_token=1)


@pytest.fixture
def clusters() -> Iterator[list[Cluster]]:
    made: list[Cluster] = []
    try:
        yield made
    finally:
        for c in made:
            for node in c.nodes():
                # A stopped process must run again to be stopped cleanly by cleanup().
                with _no_such_process():
                    os.killpg(node.proc.pid, signal.SIGCONT)
            c.cleanup()


class _no_such_process:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError)


def cluster_nodes(c: Cluster) -> dict[str, dict[str, Any]]:
    with c.master.client() as client:
        state = client.get("/router/v1/site/nodes/state").json()
    return {n["node_id"]: n for n in state["cluster"]["nodes"]}


def text_backend(node: RouterNode) -> dict[str, Any]:
    with node.client() as client:
        state = client.get("/router/v1/site/nodes/state").json()
    return next(b for b in state["backends"] if b["id"] == "text-runtime")


def served_on(c: Cluster, node_id: str) -> int:
    """Requests the node's text backend completed: each one that ran there counts once."""
    node = c.master if node_id == "master" else c.slaves[node_id]
    with node.client() as client:
        state = client.get("/router/v1/node/state", headers=AUTH).json()
    backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
    if backend["base_url"] is None:
        return 0
    completed: int = httpx.get(backend["base_url"] + "/sim/stats").json()["completed"]
    return completed


def freeze(node: RouterNode) -> None:
    os.killpg(node.proc.pid, signal.SIGSTOP)


def thaw(node: RouterNode) -> None:
    os.killpg(node.proc.pid, signal.SIGCONT)


def test_a_refused_replica_is_retried_once_on_another_and_is_suspect_at_once(
    tmp_path: Path, clusters: list[Cluster]
) -> None:
    # Polls every hour: only the refused connection itself can tell the master.
    c = start_cluster(
        tmp_path, [], {"s1": [shared("twin")], "s2": [shared("twin")]}, health_interval="1h"
    )
    clusters.append(c)
    with c.master.client() as client:
        for _ in range(2):
            assert client.post("/v1/chat/completions", json=chat("twin")).status_code == 200
    before = served_on(c, "s2")
    c.slaves["s1"].kill()
    with c.master.client() as client:
        answers = [client.post("/v1/chat/completions", json=chat("twin")) for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
    nodes = cluster_nodes(c)
    assert nodes["s1"]["healthy"] is False and nodes["s1"]["suspect"] is True
    assert nodes["s2"]["healthy"] is True and nodes["s2"]["suspect"] is False
    # Each request ran exactly once, all of them on the surviving replica.
    wait_for(lambda: served_on(c, "s2") == before + 6)


def test_a_frozen_slave_neither_stalls_the_others_health_nor_hangs_its_requests(
    tmp_path: Path, clusters: list[Cluster]
) -> None:
    # Long control and request timeouts: only the poll deadline may decide here.
    c = start_cluster(
        tmp_path,
        [],
        {
            "s1": [text_model("solo1", output_ms_per_token=50)],
            "s2": [text_model("solo2")],
        },
        health_interval="1s",
        master_sections={
            "cluster": {"health_timeout": "1s", "control_timeout": "5m"},
            "backend": {"request_timeout": "5m"},
        },
    )
    clusters.append(c)
    s1, s2 = c.slaves["s1"], c.slaves["s2"]
    with c.master.client(timeout=30) as client:
        assert client.post("/v1/chat/completions", json=chat("solo1")).status_code == 200
        # 400 tokens at 50 ms: a 20 s stream that the node stops sending half-way.
        with client.stream(
            "POST", "/v1/chat/completions", json=chat("solo1", stream=True, max_tokens=400)
        ) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            assert next(ln for ln in lines if ln.startswith("data: {"))
            freeze(s1)
            rest = [ln for ln in lines if ln.startswith("data: ")]
    # The stream ends with an error event rather than hanging until the request timeout.
    assert rest and '"error"' in rest[-1] and "stopped answering" in rest[-1], rest[-3:]
    assert cluster_nodes(c)["s1"]["suspect"] is True

    c.slaves["s2"].kill()
    # With the frozen node's poll still out, the killed one is seen down by the next round.
    wait_for(lambda: cluster_nodes(c)["s2"]["healthy"] is False, timeout=15)
    with c.master.client(timeout=30) as client:
        answer = client.post("/v1/chat/completions", json=chat("solo1"))
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "node_unavailable"

    thaw(s1)
    c.wait_healthy("s1")
    assert cluster_nodes(c)["s1"]["suspect"] is False
    with c.master.client(timeout=30) as client:
        assert client.post("/v1/chat/completions", json=chat("solo1")).status_code == 200
    assert s2.proc.poll() is not None


def test_a_restarted_master_answers_503_with_retry_after_until_its_first_poll_round(
    tmp_path: Path, clusters: list[Cluster]
) -> None:
    c = start_cluster(
        tmp_path,
        [],
        {"s1": [text_model("solo1")]},
        health_interval="1s",
        master_sections={"cluster": {"health_timeout": "5s"}},
    )
    clusters.append(c)
    freeze(c.slaves["s1"])
    old = c.master
    old.stop()
    old.cleanup(drop_db=False)
    port, models, sections = c.specs["master"]
    c.master = start_node(tmp_path / "master", models, port=port, db=old.db, wait=False, **sections)

    def first_answer() -> httpx.Response | None:
        try:
            return httpx.post(
                f"{c.master.base_url}/v1/chat/completions", json=chat("solo1"), timeout=30
            )
        except httpx.TransportError:
            return None

    answer = wait_for(first_answer, timeout=60)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "cluster_not_ready"
    assert answer.headers["retry-after"] == "5"
    # The frozen slave holds the round for its 5 s deadline: /readyz says the same meanwhile.
    ready = httpx.get(f"{c.master.base_url}/readyz", timeout=30)
    assert ready.status_code == 503
    assert "cluster view not ready" in ready.json()["checks"]["registry"]
    wait_for(lambda: READY_MARK in c.master.output(), timeout=60)
    with c.master.client(timeout=30) as client:
        # The round is over (timed out on the frozen slave): the view is what it heard, and a
        # model nobody answered for is unknown again.
        answer = client.post("/v1/chat/completions", json=chat("solo1"))
        assert answer.status_code == 404 and "retry-after" not in answer.headers
        assert client.get("/router/v1/site/nodes/state").json()["cluster"]["view_ready"]
    thaw(c.slaves["s1"])
    c.wait_healthy("s1")
    with c.master.client(timeout=30) as client:
        assert client.post("/v1/chat/completions", json=chat("solo1")).status_code == 200


def test_sigterm_on_a_master_drains_a_forwarded_stream(
    tmp_path: Path, clusters: list[Cluster]
) -> None:
    c = start_cluster(tmp_path, [], {"s1": [text_model("slow", output_ms_per_token=100)]})
    clusters.append(c)
    with c.master.client(timeout=30) as client:
        assert client.post("/v1/chat/completions", json=chat("slow", max_tokens=1)).is_success
        # 30 tokens at 100 ms: the master is told to stop 3 s before the answer is complete.
        with client.stream(
            "POST", "/v1/chat/completions", json=chat("slow", stream=True, max_tokens=30)
        ) as stream:
            lines = stream.iter_lines()
            assert next(ln for ln in lines if ln.startswith("data: {"))
            c.master.proc.send_signal(signal.SIGTERM)
            rest = [ln for ln in lines if ln.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert c.master.proc.wait(30) == 0


def test_a_hung_local_backend_is_skipped_for_a_healthy_remote_replica(
    tmp_path: Path, clusters: list[Cluster]
) -> None:
    c = start_cluster(tmp_path, [shared("twin")], {"s1": [shared("twin")]})
    clusters.append(c)
    with c.master.client(timeout=30) as client:
        assert client.post("/v1/chat/completions", json=chat("twin")).status_code == 200
    backend = text_backend(c.master)
    assert backend["probe_ok"] is True
    pid = backend["pid"]
    before = served_on(c, "s1")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: text_backend(c.master)["probe_ok"] is False)
        with c.master.client(timeout=30) as client:
            for _ in range(3):
                assert client.post("/v1/chat/completions", json=chat("twin")).status_code == 200
        wait_for(lambda: served_on(c, "s1") == before + 3)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: text_backend(c.master)["probe_ok"] is True)


def test_a_request_right_after_a_backend_crash_runs_on_the_restarted_backend(
    tmp_path: Path,
) -> None:
    node = start_node(tmp_path, [text_model("solo")])
    try:
        with node.client(timeout=30) as client:
            for _ in range(5):
                assert client.post("/v1/chat/completions", json=chat("solo")).status_code == 200
                pid = text_backend(node)["pid"]
                os.kill(pid, signal.SIGKILL)
                # Sent at once, before the router can have seen the exit.
                answer = client.post("/v1/chat/completions", json=chat("solo"))
                assert answer.status_code == 200, answer.text
                assert text_backend(node)["pid"] != pid
    finally:
        node.cleanup()


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, command line) of every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        found[int(entry)] = (int(fields[1]), int(fields[2]), cmd)
    return found


def _worker_cluster(router_pid: int) -> int | None:
    procs = _processes()
    for pid, (ppid, _pgid, cmd) in procs.items():
        if ppid == router_pid and "qcluster" in cmd:
            return pid
    return None


def test_a_killed_worker_cluster_is_restarted_and_none_of_its_workers_outlive_the_node(
    tmp_path: Path,
) -> None:
    node = start_node(tmp_path, [text_model("solo")], workers=True)
    try:
        first = wait_for(lambda: _worker_cluster(node.proc.pid))
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: (pid := _worker_cluster(node.proc.pid)) != first and pid)
        groups = {first, second}  # each cluster leads its own process group
        # The dead cluster's workers went with it; the new one's are running.
        wait_for(lambda: not any(g == first for _p, g, _c in _processes().values()))
        assert node.stop(timeout=60) == 0
        wait_for(lambda: not any(g in groups for _p, g, _c in _processes().values()))
    finally:
        node.cleanup()


def test_a_request_that_reached_its_node_is_not_retried_when_the_node_dies(
    tmp_path: Path, clusters: list[Cluster]
) -> None:
    slow = text_model("twin", load_ms=50, base_ms=5, output_ms_per_token=100)
    c = start_cluster(tmp_path, [], {"s1": [slow], "s2": [slow]}, health_interval="1h")
    clusters.append(c)
    with c.master.client(timeout=30) as client:
        for _ in range(2):
            assert client.post("/v1/chat/completions", json=chat("twin", max_tokens=1)).is_success
    answers: list[httpx.Response] = []

    def send() -> None:
        with c.master.client(timeout=60) as client:
            # 50 tokens at 100 ms: it is running on its node when that node is killed.
            answers.append(client.post("/v1/chat/completions", json=chat("twin", max_tokens=50)))

    sender = threading.Thread(target=send)
    sender.start()

    def running_on() -> str | None:
        for name in ("s1", "s2"):
            with c.slaves[name].client() as client:
                state = client.get("/router/v1/node/state", headers=AUTH).json()
            if state["active_requests"]:
                return name
        return None

    name = wait_for(running_on)
    other = "s2" if name == "s1" else "s1"
    before = served_on(c, other)
    c.slaves[name].kill()
    sender.join(60)
    assert len(answers) == 1
    # It may have run: the client is told, and it does not run a second time elsewhere.
    assert answers[0].status_code == 502, answers[0].text
    assert answers[0].json()["error"]["code"] == "node_failed"
    assert served_on(c, other) == before
