"""What an operator sees, on real router processes: /healthz, /readyz and the Dockerfile's
health check, /metrics (and that its lending counters agree with the decision log), and the
access line in text and JSON."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import (
    REPO,
    Cluster,
    RouterNode,
    free_port,
    running_node,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration
ADMIN_KEY = "observability-admin-key"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition, keyed by name and label set."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE_RE.match(line)
        assert match, line
        labels = frozenset(LABEL_RE.findall(match.group(3) or ""))
        out[(match.group(1), labels)] = float(match.group(4))
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The sum of `name` over samples whose labels include `labels` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples(text).items() if n == name and want <= ls)


def scrape(node: RouterNode, **headers: str) -> str:
    with node.client() as client:
        resp = client.get("/metrics", headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    return resp.text


def healthcheck_argv() -> list[str]:
    """The command of the Dockerfile's HEALTHCHECK, as the image would run it."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    match = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])\s*$", text, re.MULTILINE)
    assert match, "the Dockerfile has no HEALTHCHECK CMD"
    argv: list[str] = json.loads(match.group(1))
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


def run_healthcheck(config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROUTER_CONFIG": str(config)}
    env.pop("DATABASE_URL", None)
    return subprocess.run(
        healthcheck_argv(), cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    root = tmp_path_factory.mktemp("observe")
    with running_node(
        root,
        [text_model("chat", load_ms=20, base_ms=2, output_ms_per_token=1)],
        logging={"format": "json"},
    ) as n:
        yield n


# -- health ------------------------------------------------------------------------------------


def test_healthz_and_readyz_answer_on_a_ready_node(node: RouterNode) -> None:
    with node.client() as client:
        live = client.get("/healthz")
        ready = client.get("/readyz")
    assert live.status_code == 200
    assert live.json() == {"status": "ok", "node_id": "node-a"}
    assert ready.status_code == 200, ready.text
    doc = ready.json()
    assert doc["status"] == "ready"
    assert doc["checks"] == {"database": "ok", "registry": "ok"}


def test_the_dockerfile_healthcheck_passes_on_a_ready_node_and_fails_on_a_stopped_one(
    tmp_path: Path,
) -> None:
    with running_node(tmp_path, [text_model("chat")]) as n:
        ok = run_healthcheck(n.config_path)
        assert ok.returncode == 0, ok.stderr
        assert "/readyz: ok" in ok.stdout
        assert n.stop() == 0
        down = run_healthcheck(n.config_path)
    assert down.returncode == 1
    assert "/readyz" in down.stderr


def test_a_slave_without_its_master_is_live_but_not_ready(tmp_path: Path) -> None:
    port = free_port()
    nowhere = f"http://127.0.0.1:{free_port()}"
    with running_node(
        tmp_path,
        [text_model("chat")],
        port=port,
        cluster={
            "role": "slave",
            "node_id": "lonely",
            "token": "observability-cluster-token-123",
            "public_url": f"http://127.0.0.1:{port}",
            "master_url": nowhere,
        },
    ) as n:
        with n.client() as client:
            assert client.get("/healthz").status_code == 200
            ready = client.get("/readyz")
        assert ready.status_code == 503
        doc = ready.json()
        assert doc["status"] == "not_ready"
        assert doc["checks"]["registered"] == "not registered with the master"
        assert doc["checks"]["database"] == "ok"
        assert run_healthcheck(n.config_path).returncode == 1


# -- metrics and the access line ---------------------------------------------------------------


def test_metrics_count_requests_tokens_and_loads(node: RouterNode) -> None:
    before = scrape(node)
    with node.client() as client:
        for _ in range(3):
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        missing_model = client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        assert missing_model.status_code == 404
    after = scrape(node)
    ok = {"model": "chat", "family": "openai", "status": "200", "node": "node-a"}
    assert value(after, "router_requests_total", **ok) - value(
        before, "router_requests_total", **ok
    ) == pytest.approx(3)
    # An unknown model is counted without its name: a typo mints no time series.
    missing = {"model": "", "status": "404"}
    assert value(after, "router_requests_total", **missing) - value(
        before, "router_requests_total", **missing
    ) == pytest.approx(1)
    assert 'model="nope"' not in after
    # The sim reports max_tokens output tokens per answer.
    out = value(after, "router_tokens_total", model="chat", direction="out") - value(
        before, "router_tokens_total", model="chat", direction="out"
    )
    assert out == pytest.approx(9)
    assert value(after, "router_request_duration_seconds_count", model="chat") - value(
        before, "router_request_duration_seconds_count", model="chat"
    ) == pytest.approx(3)
    assert value(after, "router_request_ttfb_seconds_count", model="chat") >= 3
    assert value(after, "router_overhead_seconds_count", family="openai") >= 4
    assert value(after, "router_backend_loads_total", model="chat", outcome="ok") >= 1
    assert value(after, "router_backend_load_seconds_count", model="chat") >= 1
    assert value(after, "router_runtime_loaded_model", runtime="text", model="chat") == 1
    assert value(after, "router_info", node="node-a", role="standalone") == 1
    assert value(after, "router_ready") == 1
    assert value(after, "router_node_up", node="node-a") == 1
    assert ("router_log_writer_backlog", frozenset({("log", "decisions")})) in samples(after)


def test_a_json_access_line_parses_and_carries_the_request_id(node: RouterNode) -> None:
    rid = "req-observability-7f3a"
    with node.client() as client:
        resp = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-ID": rid})
    assert resp.status_code == 200

    def line() -> dict[str, Any] | None:
        for text in list(node.lines):
            if rid in text and text.startswith("{"):
                doc: dict[str, Any] = json.loads(text)
                if doc.get("event") == "access":
                    return doc
        return None

    doc = wait_for(line)
    assert doc["request_id"] == rid
    assert doc["logger"] == "router.access"
    assert doc["path"] == "/v1/chat/completions"
    assert doc["model"] == "chat"
    assert doc["node"] == "node-a"
    assert doc["backend"] == "text/sim"
    assert doc["lent"] is False
    assert doc["status"] == 200
    assert doc["bytes"] == len(resp.content)
    assert doc["ms"] > 0


def test_metrics_need_the_admin_key_when_admin_keys_are_set(tmp_path: Path) -> None:
    with running_node(tmp_path, [text_model("chat")], auth={"admin_keys": [ADMIN_KEY]}) as n:
        with n.client() as client:
            refused = client.get("/metrics")
            wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
            # Orchestrators' probes never need a key.
            assert client.get("/healthz").status_code == 200
            assert client.get("/readyz").status_code == 200
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "unauthorized"
        assert wrong.status_code == 401
        text = scrape(n, Authorization=f"Bearer {ADMIN_KEY}")
        assert "router_info" in text
        # The text access line names every field an operator quotes.
        with n.client() as client:
            client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "rid-text-1"})
        # Every line the request caused names it (a load, say); its access line is one of them.
        line = wait_for(
            lambda: next((ln for ln in n.lines if "[rid-text-1] router.access:" in ln), None)
        )
        for part in ("POST /v1/chat/completions", "model=chat", "node=node-a", "status=200"):
            assert part in line, line
        # A health probe is no access line at INFO.
        assert not [ln for ln in n.lines if "router.access" in ln and "/healthz" in ln]


# -- lending on a real cluster -----------------------------------------------------------------


@pytest.fixture
def lending_cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path,
        [],
        {
            "o": [text_model("big", load_ms=50, base_ms=5, output_ms_per_token=40)],
            "h": [text_model("fast", load_ms=50, base_ms=5, output_ms_per_token=2)],
        },
        master_sections={
            "cluster": {"offload_probe_idle": "100ms", "offload_probe_helper_slots": 2}
        },
    )
    try:
        with c.master.client() as client:
            link = {
                "anchor": {"node_id": "o", "model_id": "big"},
                "lends_to": [{"node_id": "h", "model_id": "fast"}],
                "acknowledge_different_weights": True,
            }
            assert client.post("/router/v1/site/text-routing-groups", json=link).status_code == 200
            assert client.post("/router/v1/load", json={"model": "fast"}).status_code == 200
        # The link reaches the owner with the master's next push: until then its requests
        # skip the router queue, and a burst sent earlier would never wait in it.
        wait_for(
            lambda: any(
                name == "router_queue_depth" and ("model", "big") in labels
                for name, labels in samples(scrape(c.slaves["o"]))
            ),
            timeout=30,
        )
        yield c
    finally:
        c.cleanup()


def _burst(c: Cluster, n: int, max_tokens: int = 10) -> list[httpx.Response]:
    out: list[httpx.Response] = []
    lock = threading.Lock()

    def call() -> None:
        body = {
            "model": "big",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
        }
        with c.slaves["o"].client(timeout=120) as client:
            resp = client.post("/v1/chat/completions", json=body)
        with lock:
            out.append(resp)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _decision_count(c: Cluster, **params: str) -> int:
    with c.master.client() as client:
        doc = client.get(
            "/router/v1/site/offload/decisions", params={"limit": "5000", **params}
        ).json()
    assert "node_errors" not in doc, doc
    return len(doc["records"])


def test_lending_counters_move_as_the_decision_log_says(lending_cluster: Cluster) -> None:
    c = lending_cluster
    owner, master = c.slaves["o"], c.master
    seen: list[str] = []
    stop = threading.Event()

    def scraper() -> None:
        # Scrapes run all through the burst: a scrape must never stall or fail lending.
        while not stop.is_set():
            seen.append(scrape(owner))
            stop.wait(0.05)

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        answers = _burst(c, 8)
    finally:
        stop.set()
        thread.join()
    assert [r.status_code for r in answers] == [200] * 8
    assert len(seen) >= 2
    # Every row reaches the database within the writers' flush interval.
    lent_rows = wait_for(
        lambda: _decision_count(c, kind="dispatch", outcome="lent", node_id="o") or None
    )
    assert lent_rows >= 1

    def settled() -> str | None:
        text = scrape(owner)
        logged = _decision_count(c, kind="dispatch", outcome="lent", node_id="o")
        if value(text, "router_lent_requests_total", lane="text") == logged:
            return text
        return None

    text = wait_for(settled)
    assert value(text, "router_lending_decisions_total", kind="dispatch", outcome="lent") == (
        value(text, "router_lent_requests_total")
    )
    returned = _decision_count(c, kind="dispatch", outcome="returned", node_id="o")
    assert value(text, "router_lent_returned_total", lane="text") == returned
    # The lent answers came from the helper, and the owner's access lines say so.
    lent_lines = [ln for ln in owner.lines if "router.access" in ln and "lent_to=h" in ln]
    assert len(lent_lines) == lent_rows - returned
    # The master counts its plan rows; the probe or grant that lent the work is among them.
    master_text = scrape(master)
    plans = _decision_count(c, kind="plan", node_id="master")
    assert value(master_text, "router_leases_total") == plans
    granted = value(master_text, "router_leases_total", outcome="granted") + value(
        master_text, "router_leases_total", outcome="probe"
    )
    assert granted >= 1
    assert value(master_text, "router_probes_total") == _decision_count(
        c, kind="plan", outcome="probe", node_id="master"
    )
    # The master's cluster view: every node's health and poll age.
    for node_id in ("o", "h"):
        assert value(master_text, "router_node_up", node=node_id) == 1
        assert 0 <= value(master_text, "router_node_last_poll_age_seconds", node=node_id) < 60
    # Routine calls between nodes (polls, runtime status, events) are no INFO lines.
    for n in c.nodes():
        chatter = [
            ln
            for ln in n.lines
            if "HTTP Request:" in ln
            or (
                " INFO " in ln
                and "/router/v1/node/" in ln
                and "/router/v1/node/inference/" not in ln
            )
        ]
        assert chatter == [], chatter[:3]
    # A lending event line on the owner per lent request.
    events = [ln for ln in owner.lines if "router.lending" in ln and "dispatch lent" in ln]
    assert len(events) == lent_rows


def test_queue_depth_shows_held_and_lent_requests_while_they_wait(
    lending_cluster: Cluster,
) -> None:
    c = lending_cluster
    owner = c.slaves["o"]
    depths: list[dict[str, float]] = []
    stop = threading.Event()

    cluster_view: list[tuple[float, float]] = []

    def scraper() -> None:
        while not stop.is_set():
            text = scrape(owner)
            depths.append(
                {
                    state: value(text, "router_queue_depth", model="big", state=state)
                    for state in ("queued", "held", "lent")
                }
            )
            master = scrape(c.master)
            cluster_view.append(
                (
                    value(master, "router_cluster_queue_pending", node="o", model="big")
                    + value(master, "router_cluster_queue_lent", node="o", model="big"),
                    value(master, "router_cluster_lease_slots", owner_node="o", helper_node="h"),
                )
            )
            stop.wait(0.02)

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        # Two seconds a request on the owner: the queue stays deep for many scrapes.
        answers = _burst(c, 10, max_tokens=50)
    finally:
        stop.set()
        thread.join()
    assert all(r.status_code == 200 for r in answers)
    # Linked models are listed even when empty; during the burst some requests waited.
    assert depths and all(set(d) == {"queued", "held", "lent"} for d in depths)
    assert max(d["queued"] + d["held"] + d["lent"] for d in depths) >= 1
    final = scrape(owner)
    assert value(final, "router_queue_depth", model="big") == 0
    # The master's cluster view saw the owner's queue and the lease it granted.
    assert max(waiting for waiting, _ in cluster_view) >= 1
    assert max(slots for _, slots in cluster_view) >= 1


def test_a_node_started_with_text_logs_writes_text_lines(tmp_path: Path) -> None:
    node = start_node(tmp_path, [text_model("chat")], logging={"format": "text"})
    try:
        with node.client() as client:
            client.get("/v1/models", headers={"X-Request-ID": "rid-models"})
        line = wait_for(lambda: next((ln for ln in node.lines if "rid-models" in ln), None))
        assert not line.startswith("{")
        assert shlex.split(line)  # one plain line
    finally:
        node.cleanup()


# -- docs/ ---------------------------------------------------------------------------------------

METRIC_NAME_RE = re.compile(r"\b((?:router|process)_[a-z_]+)\b")


def exported_sample_names(text: str) -> set[str]:
    """Every sample name the exposition's families can produce, samples seen or not."""
    from prometheus_client.parser import text_string_to_metric_families

    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
        }.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


def test_every_metric_the_dashboard_queries_is_one_the_node_exports(node: RouterNode) -> None:
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    queried = {name for expr in exprs for name in METRIC_NAME_RE.findall(expr)}
    assert len(queried) >= 20, queried
    exported = exported_sample_names(scrape(node))
    assert queried - exported == set()
    # And the sample scrape config points at the path the node serves.
    assert "metrics_path: /metrics" in (REPO / "docs" / "prometheus.yml").read_text()
