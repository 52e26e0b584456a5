"""The metrics module's rules, without a server: path families, the label of an unknown
model, the decision log's counts and how the collector folds them into lending counters."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from lending.decisions import DecisionLog
from proxy.observe import metrics
from proxy.request import Ctx


@pytest.mark.parametrize(
    ("path", "family"),
    [
        ("/v1/chat/completions", "openai"),
        ("/v1/images/generations", "openai"),
        ("/api/chat", "ollama"),
        ("/api/tags", "ollama"),
        ("/api/v1/generate", "kobold"),
        ("/sdapi/v1/txt2img", "sdapi"),
        ("/router/v1/node/inference/v1/chat/completions", "node"),
        ("/ping", "other"),
    ],
)
def test_path_families(path: str, family: str) -> None:
    assert metrics.path_family(path) == family
    assert metrics.path_family(path) == family  # cached answer is the same


def _ctx(path: str, **fields: Any) -> Ctx:
    async def nothing(*_: Any) -> Any:
        return None

    ctx = Ctx({"headers": []}, nothing, nothing, path, "POST")
    for name, value in fields.items():
        setattr(ctx, name, value)
    return ctx


def _count(**labels: str) -> float:
    got = metrics.REGISTRY.get_sample_value("router_requests_total", labels)
    return got or 0.0


def test_a_request_is_counted_under_the_model_only_once_it_was_served() -> None:
    node: Any = SimpleNamespace(node_id="n1")
    served = _ctx("/v1/chat/completions", model="m-unit", served_node="n2")
    typo = _ctx("/v1/chat/completions", model="m-typo-unit")
    labels = {"model": "m-unit", "family": "openai", "status": "200", "node": "n2"}
    blank = {"model": "", "family": "openai", "status": "404", "node": "n1"}
    before, before_blank = _count(**labels), _count(**blank)
    metrics.request_finished(served, node, 200, served.t0 + 0.5)
    metrics.request_finished(typo, node, 404, typo.t0 + 0.01)
    assert _count(**labels) == before + 1
    assert _count(**blank) == before_blank + 1
    assert b"m-typo-unit" not in generate_latest(metrics.REGISTRY)


def test_overhead_is_the_total_less_the_time_waiting_on_the_model() -> None:
    node: Any = SimpleNamespace(node_id="n1")
    ctx = _ctx("/api/v1/generate", model="k", served_node="n1", upstream_secs=0.2)
    name = "router_overhead_seconds"
    le = {"family": "kobold", "le": "0.001"}
    before = metrics.REGISTRY.get_sample_value(f"{name}_bucket", le) or 0.0
    before_sum = metrics.REGISTRY.get_sample_value(f"{name}_sum", {"family": "kobold"}) or 0.0
    metrics.request_finished(ctx, node, 200, ctx.t0 + 0.2005)
    # 0.5 ms of the router's own work: inside the 1 ms bucket.
    assert metrics.REGISTRY.get_sample_value(f"{name}_bucket", le) == before + 1
    after_sum = metrics.REGISTRY.get_sample_value(f"{name}_sum", {"family": "kobold"})
    assert after_sum == pytest.approx(before_sum + 0.0005)


def test_the_decision_log_counts_rows_by_kind_outcome_reason_and_lane() -> None:
    log = DecisionLog(node_id="o", router_version="1", clock_ms=lambda: 1)
    log.record(kind="dispatch", outcome="lent", lane="text")
    log.record(kind="dispatch", outcome="lent", lane="text", reason="refilled")
    log.record(kind="dispatch", outcome="lent", lane="text")
    log.record(kind="plan", outcome="skipped", reason="cost_rejected", lane="text")
    assert log.counts[("dispatch", "lent", "", "text")] == 2
    assert log.counts[("dispatch", "lent", "refilled", "text")] == 1
    assert log.counts[("plan", "skipped", "cost_rejected", "text")] == 1


def _collect(log: DecisionLog) -> CollectorRegistry:
    node: Any = SimpleNamespace(decisions=log)
    registry = CollectorRegistry(auto_describe=False)

    class Only(metrics.NodeCollector):
        def collect(self) -> Any:
            return self._decisions(node)

    registry.register(Only(node))
    return registry


def test_the_collector_folds_decision_rows_into_lending_counters() -> None:
    log = DecisionLog(node_id="m", router_version="1", clock_ms=lambda: 1)
    for _ in range(3):
        log.record(kind="dispatch", outcome="lent", lane="text")
    log.record(kind="dispatch", outcome="lent", lane="image")
    log.record(kind="dispatch", outcome="returned", lane="text")
    log.record(kind="dispatch", outcome="relay_refused", reason="helper_stalled", lane="text")
    log.record(kind="plan", outcome="probe", lane="text")
    log.record(kind="plan", outcome="granted", lane="text")
    log.record(kind="plan", outcome="skipped", reason="helper_claimed", lane="text")
    log.record(kind="helper", outcome="borrowed_returned", lane="text")
    registry = _collect(log)

    def get(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert get("router_lent_requests_total", lane="text") == 3
    assert get("router_lent_requests_total", lane="image") == 1
    assert get("router_lent_returned_total", lane="text") == 1
    assert get("router_relay_refused_total", lane="text", reason="helper_stalled") == 1
    assert get("router_probes_total", lane="text") == 1
    assert get("router_leases_total", lane="text", outcome="granted", reason="") == 1
    assert get("router_leases_total", lane="text", outcome="skipped", reason="helper_claimed") == 1
    assert (
        get(
            "router_lending_decisions_total",
            kind="helper",
            outcome="borrowed_returned",
            reason="",
            lane="text",
        )
        == 1
    )


def test_affinity_choices_are_counted_per_model_and_outcome() -> None:
    from registry.affinity import AffinityTable, Fingerprint, ReplicaKey

    table = AffinityTable(max_entries=10, ttl=60.0)
    table.remember("chat", "text", [Fingerprint(b"d" * 16, 400)], ReplicaKey("a", "m"), 1)
    for outcome in ("hits", "hits", "misses", "overrides"):
        table.count("chat", outcome)
    node: Any = SimpleNamespace(affinity=table)
    registry = CollectorRegistry(auto_describe=False)

    class Only(metrics.NodeCollector):
        def collect(self) -> Any:
            return self._affinity(node)

    registry.register(Only(node))

    def get(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert get("router_affinity_choices_total", model="chat", outcome="hit") == 2
    assert get("router_affinity_choices_total", model="chat", outcome="miss") == 1
    assert get("router_affinity_choices_total", model="chat", outcome="override") == 1
    assert get("router_affinity_entries") == 1


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, sample.labels, sample.value)
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    ]


def test_the_request_paths_counting_adds_what_prometheus_client_would() -> None:
    bounds = metrics.OVERHEAD_BUCKETS
    # Below, at, between and past the bounds: each must land in the bucket `observe` picks.
    amounts = [0.0, bounds[0] / 2, *bounds, *(b * 1.5 for b in bounds), 7.0, 0.0005]
    plain, fast = CollectorRegistry(), CollectorRegistry()
    fast.register(metrics.CellSync())
    histograms = [
        Histogram("h_seconds", "h", ("family",), buckets=bounds, registry=registry)
        for registry in (plain, fast)
    ]
    counters = [Counter("c", "c", ("model",), registry=registry) for registry in (plain, fast)]
    plain_h, plain_c = histograms[0].labels("openai"), counters[0].labels("m")
    plain_c.inc(2)
    # A cell starts from what its child already holds.
    counters[1].labels("m").inc(2)
    cells = metrics.histogram_cells(histograms[1].labels("openai"))
    cell = metrics.counter_cell(counters[1].labels("m"))
    for amount in amounts:
        plain_h.observe(amount)
        metrics.observe(cells, (*bounds, float("inf")), amount)
    for tokens in (1, 0, 250, 3):
        plain_c.inc(tokens)
        cell[0] += tokens
    assert _samples(fast) == _samples(plain)
    # Collected again with nothing new: the same.
    assert _samples(fast) == _samples(plain)


def test_each_exposition_shows_what_was_counted_up_to_it() -> None:
    node: Any = SimpleNamespace(node_id="n1")
    ctx = _ctx("/v1/chat/completions", model="m-cells", served_node="n1")
    labels = {"model": "m-cells", "family": "openai", "status": "200", "node": "n1"}
    line = 'router_requests_total{{family="openai",model="m-cells",node="n1",status="200"}} {}'
    before = _count(**labels)
    metrics.request_finished(ctx, node, 200, ctx.t0 + 0.002)
    assert line.format(before + 1) in generate_latest(metrics.REGISTRY).decode()
    metrics.request_finished(ctx, node, 200, ctx.t0 + 0.002)
    metrics.request_finished(ctx, node, 200, ctx.t0 + 0.002)
    assert line.format(before + 3) in generate_latest(metrics.REGISTRY).decode()
    fast = {"model": "m-cells", "family": "openai", "le": "0.005"}
    bucket = metrics.REGISTRY.get_sample_value("router_request_duration_seconds_bucket", fast)
    assert bucket == before + 3
