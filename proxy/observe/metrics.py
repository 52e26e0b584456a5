"""Prometheus metrics of one router process (`GET /metrics`).

Two kinds of numbers:

- what happens on the request path (requests, latencies, tokens, loads) is counted as it
  happens, in prometheus-client objects of this module's registry. The children of each
  labelled metric are cached by label tuple, and the request path adds to plain cells that a
  collection copies into them (see `counter_cell`), so a request pays a dict lookup and a few
  additions, not prometheus-client's label validation nor a lock per addition;
- everything that is state (queues, loaded models, node health, fits, the decision log's
  backlog and its per-outcome counts) is read from the node when a scrape asks
  (`NodeCollector`), so keeping it costs the request path nothing.

Every count lives in the router process: the django-q2 workers only prune old rows and count
nothing, so one in-process registry is the whole story (no multiprocess directory).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from analytics.recorder import LoadEvent
    from proxy.node import Node
    from proxy.request import Ctx

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
NODE_INFERENCE_PREFIX = "/router/v1/node/inference"

# Seconds. Answers range from a cached embedding to a long image job; overhead is sub-ms.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
LOAD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

# What the request path counts lives in plain lists of numbers ("cells"), one per labelled
# child: a counter's cell is `[value]`, a histogram's `[sum, bucket 0, bucket 1, ...]` (each
# bucket the observations whose first bound at or above them is that bucket's, not cumulative,
# as prometheus-client keeps them). The request path adds to a list item: no call, no lock.
# prometheus-client's own `inc` takes a lock per addition, twelve a request (about 2 % of a
# request's CPU, measured). The cells are copied into the children when a registry is
# collected (`CellSync`, registered here, ahead of the metrics), so an exposition, and
# `get_sample_value`, show exactly what `inc` and `observe` would have. Every count and every
# scrape runs on the router's loop thread, so nothing else writes the children or the cells.
_synced: list[tuple[list[float], tuple[Any, ...]]] = []


def counter_cell(child: Any) -> list[float]:
    """The cell a Counter's child is counted in."""
    value = child._value
    cell = [value.get()]
    _synced.append((cell, (value,)))
    return cell


def histogram_cells(child: Any) -> list[float]:
    """The cells a Histogram's child is observed in: `[sum, bucket 0, ...]` (see `observe`)."""
    values = (child._sum, *child._buckets)
    cells = [value.get() for value in values]
    _synced.append((cells, values))
    return cells


def observe(cells: list[float], bounds: tuple[float, ...], amount: float) -> None:
    """One observation of `amount` in a histogram's cells, `bounds` its upper bounds (+Inf
    last): into the sum, and into the first bucket whose bound is at or above it."""
    cells[0] += amount
    cells[1 + bisect_left(bounds, amount)] += 1


def sync_cells() -> None:
    """Copy every cell into its child."""
    for cells, values in _synced:
        for cell, value in zip(cells, values, strict=True):
            value.set(cell)


class CellSync(Collector):
    """Collected first in `REGISTRY`: brings the children up to their cells, yields nothing."""

    def collect(self) -> Iterator[Metric]:
        sync_cells()
        return iter(())


REGISTRY.register(CellSync())

REQUESTS = Counter(
    "router_requests",
    "Client requests answered, by model asked, path family, status and serving node.",
    ("model", "family", "status", "node"),
    registry=REGISTRY,
)
TTFB = Histogram(
    "router_request_ttfb_seconds",
    "Time from a request's arrival to the first byte of its answer.",
    ("model", "family"),
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
DURATION = Histogram(
    "router_request_duration_seconds",
    "Time from a request's arrival to the last byte of its answer.",
    ("model", "family"),
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
OVERHEAD = Histogram(
    "router_overhead_seconds",
    "The router's own time per request: the whole answer less the time spent waiting on the "
    "model (router queue, load, backend or next node).",
    ("family",),
    buckets=OVERHEAD_BUCKETS,
    registry=REGISTRY,
)
TOKENS = Counter(
    "router_tokens",
    "Tokens the backends of this node reported, by model and direction (in, out).",
    ("model", "direction"),
    registry=REGISTRY,
)
KEY_REQUESTS = Counter(
    "router_key_requests",
    "Requests this node's backends served, by stored API key name (empty: a config key or "
    "none; a request lent here counts under its owner's key) and outcome (ok, error).",
    ("key", "outcome"),
    registry=REGISTRY,
)
KEY_TOKENS = Counter(
    "router_key_tokens",
    "Tokens this node's backends reported, by stored API key name and direction (in, out).",
    ("key", "direction"),
    registry=REGISTRY,
)
KEY_RATE_LIMITED = Counter(
    "router_key_rate_limited",
    "Requests this node refused with 429 for a stored API key's limit, by key name and the "
    "limit that refused it (requests: rpm, tokens: tpm, concurrent: max_concurrent).",
    ("key", "limit"),
    registry=REGISTRY,
)
LOADS = Counter(
    "router_backend_loads",
    "Model loads on this node by lane, model, reason and outcome (ok, failed).",
    ("lane", "model", "reason", "outcome"),
    registry=REGISTRY,
)
LOAD_SECONDS = Histogram(
    "router_backend_load_seconds",
    "How long a model load took (successful loads).",
    ("lane", "model"),
    buckets=LOAD_BUCKETS,
    registry=REGISTRY,
)
LOAD_FAILURES = Counter(
    "router_backend_load_failures",
    "Model loads that failed, by lane and model.",
    ("lane", "model"),
    registry=REGISTRY,
)

FRONTDOOR_REFUSALS = Counter(
    "router_frontdoor_refusals",
    "Requests and connections the front door answered itself, before reading a body, by "
    "status and reason (unauthorized, body_too_large, address_not_allowed, host_not_allowed, "
    "cross_origin, request_timeout, too_many_connections, ...).",
    ("status", "reason"),
    registry=REGISTRY,
)

_FAMILIES: dict[str, str] = {}
_refusal_children: dict[tuple[int, str], Any] = {}
_request_cells: dict[tuple[str, str, str, str], list[float]] = {}
_latency_cells: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
_overhead_cells: dict[str, list[float]] = {}
_token_cells: dict[str, tuple[list[float], list[float]]] = {}
# Key names are made by operators (the key API), so these stay as few as the keys.
_key_cells: dict[str, tuple[list[float], ...]] = {}
# Each histogram's upper bounds as its children keep them (+Inf last).
_LATENCY_BOUNDS = (*LATENCY_BUCKETS, float("inf"))
_OVERHEAD_BOUNDS = (*OVERHEAD_BUCKETS, float("inf"))


def path_family(path: str) -> str:
    """`openai`, `ollama`, `kobold`, `sdapi`, `node` (work from another node) or `other`."""
    family = _FAMILIES.get(path)
    if family is not None:
        return family
    if path.startswith(NODE_INFERENCE_PREFIX):
        family = "node"
    elif path.startswith("/v1/"):
        family = "openai"
    elif path.startswith("/api/v1/"):
        family = "kobold"
    elif path.startswith("/api/"):
        family = "ollama"
    elif path.startswith("/sdapi/"):
        family = "sdapi"
    else:
        family = "other"
    _FAMILIES[path] = family
    return family


def request_finished(ctx: Ctx, node: Node, status: int, now: float) -> None:
    """Count one answered request. `model` is what the client asked for once it named a model
    this cluster serves (else empty: a typo must not mint a time series)."""
    family = path_family(ctx.path)
    model = ctx.model if ctx.served_node else ""
    key = (model, family, str(status), ctx.served_node or node.node_id)
    count = _request_cells.get(key)
    if count is None:
        count = _request_cells[key] = counter_cell(REQUESTS.labels(*key))
    count[0] += 1
    latency = _latency_cells.get((model, family))
    if latency is None:
        latency = _latency_cells[(model, family)] = (
            histogram_cells(TTFB.labels(model, family)),
            histogram_cells(DURATION.labels(model, family)),
        )
    total = now - ctx.t0
    if ctx.first_byte:
        observe(latency[0], _LATENCY_BOUNDS, ctx.first_byte - ctx.t0)
    observe(latency[1], _LATENCY_BOUNDS, total)
    overhead = _overhead_cells.get(family)
    if overhead is None:
        overhead = _overhead_cells[family] = histogram_cells(OVERHEAD.labels(family))
    observe(overhead, _OVERHEAD_BOUNDS, max(0.0, total - ctx.upstream_secs))


def frontdoor_refused(status: int, reason: str) -> None:
    child = _refusal_children.get((status, reason))
    if child is None:
        child = _refusal_children[(status, reason)] = FRONTDOOR_REFUSALS.labels(str(status), reason)
    child.inc()


def tokens_counted(model: str, prompt_tokens: int, output_tokens: int) -> None:
    if not prompt_tokens and not output_tokens:
        return
    cells = _token_cells.get(model)
    if cells is None:
        cells = _token_cells[model] = (
            counter_cell(TOKENS.labels(model, "in")),
            counter_cell(TOKENS.labels(model, "out")),
        )
    cells[0][0] += prompt_tokens
    cells[1][0] += output_tokens


def key_usage_counted(
    key_name: str | None, success: bool, prompt_tokens: int, output_tokens: int
) -> None:
    """Count one served request and its tokens under the key it came with."""
    key = key_name or ""
    cells = _key_cells.get(key)
    if cells is None:
        cells = _key_cells[key] = (
            counter_cell(KEY_REQUESTS.labels(key, "ok")),
            counter_cell(KEY_REQUESTS.labels(key, "error")),
            counter_cell(KEY_TOKENS.labels(key, "in")),
            counter_cell(KEY_TOKENS.labels(key, "out")),
        )
    cells[0 if success else 1][0] += 1
    cells[2][0] += prompt_tokens
    cells[3][0] += output_tokens


def key_rate_limited(key_name: str, limit: str) -> None:
    """Count one 429 of a stored key's limit (keys are few: the table bounds the labels)."""
    KEY_RATE_LIMITED.labels(key_name, limit).inc()


def load_finished(event: LoadEvent) -> None:
    outcome = "ok" if event.success else "failed"
    LOADS.labels(event.lane, event.model_id, event.reason, outcome).inc()
    if event.success:
        LOAD_SECONDS.labels(event.lane, event.model_id).observe(event.duration_ms / 1000.0)
    else:
        LOAD_FAILURES.labels(event.lane, event.model_id).inc()


# -- state, read at scrape time ---------------------------------------------------------------

QUEUE_STATES = ("queued", "held", "lent")
# Decision rows that are lending events an operator counts, by (kind, outcome).
_LENT = ("dispatch", "lent")
_RETURNED = ("dispatch", "returned")
_RELAY_REFUSED = "relay_refused"


def _tally_decisions(
    counts: Mapping[tuple[str, str, str, str], int], rows: CounterMetricFamily
) -> dict[str, dict[tuple[str, ...], int]]:
    """Add each decision-log count to `rows`, and sum them by the families drawn from it
    (leases, probes, lent, returned, refused), keyed by those families' labels."""
    totals: dict[str, dict[tuple[str, ...], int]] = {
        "leases": {},
        "probes": {},
        "lent": {},
        "returned": {},
        "refused": {},
    }

    def add(name: str, key: tuple[str, ...], count: int) -> None:
        table = totals[name]
        table[key] = table.get(key, 0) + count

    for (kind, outcome, reason, lane), count in sorted(counts.items()):
        rows.add_metric((kind, outcome, reason, lane), count)
        if kind == "plan":
            add("leases", (lane, outcome, reason), count)
            if outcome == "probe":
                add("probes", (lane,), count)
        elif (kind, outcome) == _LENT:
            add("lent", (lane,), count)
        elif (kind, outcome) == _RETURNED:
            add("returned", (lane,), count)
        if outcome == _RELAY_REFUSED:
            add("refused", (lane, reason), count)
    return totals


class NodeCollector(Collector):
    """This node's state, and on a master the cluster's, as Prometheus metrics."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        yield from self._info(node)
        yield from self._runtimes(node)
        yield from self._queues(node)
        yield from self._decisions(node)
        yield from self._writers(node)
        yield from self._nodes(node)
        yield from self._fits(node)
        yield from self._affinity(node)
        if node.role != "slave":
            # A standalone node is its own site: the families are there, empty.
            yield from self._cluster(node)

    @staticmethod
    def _info(node: Node) -> Iterator[Metric]:
        from django.conf import settings

        info = GaugeMetricFamily(
            "router_info", "This node: its ID, role and build.", labels=("node", "role", "build")
        )
        info.add_metric((node.node_id, node.role, settings.ROUTER_VERSION), 1)
        yield info
        ready = GaugeMetricFamily("router_ready", "1 once startup is over (see /readyz).")
        ready.add_metric((), 1 if node.ready else 0)
        yield ready
        from routerproject.dbhealth import DATABASE

        database = GaugeMetricFamily(
            "router_database_available",
            "0 from the first failed database access until the next one that works.",
        )
        database.add_metric((), 0 if DATABASE.down else 1)
        yield database

    @staticmethod
    def _runtimes(node: Node) -> Iterator[Metric]:
        loaded = GaugeMetricFamily(
            "router_runtime_loaded_model",
            "1 for the model each runtime of this node holds.",
            labels=("runtime", "model", "config"),
        )
        active = GaugeMetricFamily(
            "router_runtime_active_requests",
            "Requests running on each runtime of this node.",
            labels=("runtime",),
        )
        for runtime in node.runtimes.all():
            cfg = runtime.current
            if cfg is not None:
                loaded.add_metric((runtime.lane, cfg.local_id, cfg.filename), 1)
            active.add_metric((runtime.lane,), runtime.active)
        yield loaded
        yield active

    @staticmethod
    def _queues(node: Node) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "router_queue_depth",
            "Requests in the router queue of each linked model, by lane, model and state "
            "(queued: waiting for a backend slot; held: kept for a faster helper; lent: at a "
            "helper).",
            labels=("lane", "model", "state"),
        )
        lending = node.lending
        counts: dict[tuple[str, str, str], int] = {}
        for lane, models in lending.enrolled.items():
            for model in models:
                for state in QUEUE_STATES:
                    counts[(lane, model, state)] = 0
        for row in lending.held_requests(lending.clock()):
            key = (str(row["lane"]), str(row["model_id"]), str(row["state"]))
            counts[key] = counts.get(key, 0) + 1
        for key, value in sorted(counts.items()):
            depth.add_metric(key, value)
        yield depth
        by_key = GaugeMetricFamily(
            "router_queue_waiting_by_key",
            "Requests waiting in the router queue (queued or held) by lane, model and stored key "
            '(key="" for requests without one); with auth.fair_share every model queues there.',
            labels=("lane", "model", "key"),
        )
        for row in lending.waiting_by_key():
            by_key.add_metric((row["lane"], row["model_id"], row["key"] or ""), row["waiting"])
        yield by_key

    @staticmethod
    def _affinity(node: Node) -> Iterator[Metric]:
        choices = CounterMetricFamily(
            "router_affinity_choices",
            "Replica choices under cluster.routing_cache_affinity, per public model: hit (sent "
            "to the replica holding the prompt prefix), miss (none held it), override (one "
            "held it; its wait or a small saving kept the rotation).",
            labels=("model", "outcome"),
        )
        outcome_of = {"hits": "hit", "misses": "miss", "overrides": "override"}
        for model, counts in node.affinity.stats().items():
            for key, value in counts.items():
                choices.add_metric((model, outcome_of[key]), value)
        yield choices
        entries = GaugeMetricFamily(
            "router_affinity_entries", "Prompt prefixes the affinity table remembers."
        )
        entries.add_metric((), len(node.affinity))
        yield entries

    @staticmethod
    def _decisions(node: Node) -> Iterator[Metric]:
        rows = CounterMetricFamily(
            "router_lending_decisions",
            "Decision-log rows this node recorded, by kind, outcome, reason and lane.",
            labels=("kind", "outcome", "reason", "lane"),
        )
        leases = CounterMetricFamily(
            "router_leases",
            "The master's plan rows by outcome (granted, probe, skipped) and reason.",
            labels=("lane", "outcome", "reason"),
        )
        probes = CounterMetricFamily(
            "router_probes", "One-request probe leases the master granted.", labels=("lane",)
        )
        lent = CounterMetricFamily(
            "router_lent_requests", "Requests this owner lent to a helper.", labels=("lane",)
        )
        returned = CounterMetricFamily(
            "router_lent_returned",
            "Lent requests that came back to this owner (the helper's own work came first, or it "
            "failed).",
            labels=("lane",),
        )
        refused = CounterMetricFamily(
            "router_relay_refused",
            "Lent requests the master could not pass on, by reason.",
            labels=("lane", "reason"),
        )
        totals = _tally_decisions(node.decisions.counts, rows)
        for family, name in (
            (leases, "leases"),
            (probes, "probes"),
            (lent, "lent"),
            (returned, "returned"),
            (refused, "refused"),
        ):
            for key, count in totals[name].items():
                family.add_metric(key, count)
        yield from (rows, leases, probes, lent, returned, refused)

    @staticmethod
    def _writers(node: Node) -> Iterator[Metric]:
        backlog = GaugeMetricFamily(
            "router_log_writer_backlog",
            "Rows buffered in memory for the database (decisions, analytics).",
            labels=("log",),
        )
        dropped = CounterMetricFamily(
            "router_log_writer_dropped",
            "Rows the buffered writers dropped (buffer full while the database failed, or "
            "malformed).",
            labels=("log",),
        )
        backlog.add_metric(("decisions",), node.decisions.pending())
        dropped.add_metric(("decisions",), node.decisions.dropped)
        backlog.add_metric(("analytics",), node.recorder.pending())
        dropped.add_metric(("analytics",), node.recorder.dropped)
        yield backlog
        yield dropped

    @staticmethod
    def _nodes(node: Node) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "router_node_up",
            "1 when a node answers its polls (this node is always up to itself; a master lists "
            "every registered node).",
            labels=("node",),
        )
        age = GaugeMetricFamily(
            "router_node_last_poll_age_seconds",
            "Seconds since a node's last successful poll or registration (a slave: since its "
            "last registration with the master).",
            labels=("node",),
        )
        now = time.time()
        up.add_metric((node.node_id,), 1)
        if node.role == "slave":
            registered = node.sync.registered_at if node.sync is not None else None
            up.add_metric(("master",), 1 if registered is not None else 0)
            if registered is not None:
                age.add_metric(("master",), max(0.0, now - registered))
        for remote in sorted(node.cluster.nodes.values(), key=lambda n: n.node_id):
            up.add_metric((remote.node_id,), 1 if remote.healthy else 0)
            age.add_metric((remote.node_id,), max(0.0, now - remote.updated_at))
        yield up
        yield age

    @staticmethod
    def _fits(node: Node) -> Iterator[Metric]:
        base = GaugeMetricFamily(
            "router_cost_fit_base_ms",
            "Fitted fixed cost of one request, per node, model and lane.",
            labels=("node", "model", "lane"),
        )
        slope = GaugeMetricFamily(
            "router_cost_fit_slope_ms",
            "Fitted cost per unit of work term `term` (text: 0 prompt tokens, 1 output tokens; "
            "image: 0 pixel-steps).",
            labels=("node", "model", "lane", "term"),
        )
        samples = GaugeMetricFamily(
            "router_cost_fit_samples",
            "Samples behind each fit.",
            labels=("node", "model", "lane"),
        )
        fits: dict[tuple[str, str, str], Any] = {}
        costs = node.lending.costs
        if costs is not None:
            for (model_id, section), fit in costs.models.items():
                fits[(node.node_id, model_id, section)] = fit
        if node.role == "master":
            from lending.master import get_master

            table = get_master(node).last_costs
            if table is not None:
                for key, fit in table.fits.items():
                    fits.setdefault(key, fit)
        for (node_id, model_id, section), fit in sorted(fits.items()):
            lane = "text" if section == "llm" else section
            labels = (node_id, model_id, lane)
            base.add_metric(labels, fit.base_ms)
            samples.add_metric(labels, fit.samples)
            for term, value in enumerate(fit.slopes_ms):
                slope.add_metric((*labels, str(term)), value)
        yield base
        yield slope
        yield samples

    @staticmethod
    def _cluster(node: Node) -> Iterator[Metric]:
        """The master's view of lending across the cluster, as its last plan saw it."""
        from lending.master import get_master

        master = get_master(node)
        pending = GaugeMetricFamily(
            "router_cluster_queue_pending",
            "Requests waiting in each node's router queue (queued or held), per linked model, "
            "as the master's last plan saw them.",
            labels=("node", "lane", "model"),
        )
        lent = GaugeMetricFamily(
            "router_cluster_queue_lent",
            "Requests each owner had out with helpers at the master's last plan.",
            labels=("node", "lane", "model"),
        )
        for node_id, status in sorted(master.last_statuses.items()):
            for lane in ("text", "image"):
                for row in status.get(f"{lane}_queue") or []:
                    if not isinstance(row, dict):
                        continue
                    labels = (node_id, lane, str(row.get("model_id", "")))
                    pending.add_metric(labels, float(row.get("pending_count", 0) or 0))
                    lent.add_metric(labels, float(row.get("lent_count", 0) or 0))
        leases = GaugeMetricFamily(
            "router_cluster_lease_slots",
            "Live leases in the master's book: slots an owner may keep lent to a helper.",
            labels=("lane", "owner_node", "owner_model", "helper_node", "helper_model", "probe"),
        )
        now = time.monotonic()
        for (lane, _, _), (lease, expires) in sorted(master.book.items(), key=lambda i: i[0]):
            if expires <= now:
                continue
            leases.add_metric(
                (
                    lane,
                    lease.owner_node_id,
                    lease.owner_model_id,
                    lease.helper_node_id,
                    lease.helper_model_id,
                    "true" if lease.probe else "false",
                ),
                lease.helper_slots,
            )
        rounds = CounterMetricFamily(
            "router_cluster_plan_rounds",
            "Poll rounds the master planned leases in (events that arrive during one share the "
            "next).",
        )
        rounds.add_metric((), master.rounds)
        compute = CounterMetricFamily(
            "router_cluster_plan_compute_seconds",
            "Time the master spent planning those rounds after their polls were answered.",
        )
        compute.add_metric((), master.plan_compute_secs)
        yield from (pending, lent, leases, rounds, compute)


def exposition(node: Node) -> bytes:
    """The text a scrape gets: the counted metrics, then the node's state."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(NodeCollector(node))
    return generate_latest(REGISTRY) + generate_latest(scrape)
