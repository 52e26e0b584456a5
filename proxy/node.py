"""The router process's node state: catalog, runtimes, cluster registry, analytics recorder.

One instance per router process, created lazily from settings on first use (tests
build apps without the runner), and replaced by `set_node()`. The django-q2 workers never touch it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from access.keys import current_table
from analytics.recorder import LoadEvent, Recorder
from guardians.store import Guardians
from lending.decisions import DecisionLog
from lending.flow import RequestLending
from lending.hold import HoldPolicy
from lending.master import MasterLending
from lending.owner import OwnerLending
from lending.restore import Restorer
from lending.runtime import Lending
from proxy.forwarding.deadlines import Deadlines, tick_for
from proxy.forwarding.generations import Generations
from proxy.forwarding.inflight import Forwards, Requests
from proxy.observe import metrics
from proxy.runtimes.runtime import RuntimeManager
from proxy.serving.sticky import StickyIds
from registry.affinity import AffinityTable
from registry.assets.service import AssetService
from registry.catalog import LocalCatalog
from registry.cluster import MINIMUM_PROTOCOL_VERSION, PROTOCOL_VERSION, ClusterState
from registry.identity import Assignment, IdentityKey
from registry.kcpps import Lane, ModelConfig
from registry.nodeclient import AllowList, NodeClient
from registry.recipes import Recipe, load_recipes
from registry.sync import ClusterSync
from registry.tlsclient import node_ssl_context
from routerproject.config import RouterConfig

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from access.ports import AccessNode
    from analytics.ports import AnalyticsNode
    from guardians.ports import GuardiansNode
    from lending.ports import LendingNode, ServingNode
    from registry.assets.service import AssetNode
    from registry.ports import Calibrations, RegistryNode


@dataclass
class Node:
    config: RouterConfig
    catalog: LocalCatalog
    runtimes: RuntimeManager
    recorder: Recorder
    cluster: ClusterState = field(init=False)
    lending: Lending = field(init=False)
    decisions: DecisionLog = field(init=False)
    owner: OwnerLending = field(init=False)
    restore: Restorer = field(init=False)
    master: MasterLending | None = None
    """The master's side of lending (lending/master.py); None on a slave. Held here, not in a
    registry of its own, so that it goes when the node goes."""
    lending_gate: RequestLending = field(init=False)
    """What the request path asks lending, once per request (lending/flow.py)."""
    client: NodeClient | None = None
    started_at: float = field(default_factory=time.time)
    deadlines: Deadlines = field(default_factory=Deadlines)
    """The deadlines of the requests this node's backends and other nodes hold
    (`backend.request_timeout`)."""
    recipes: dict[str, Recipe] = field(default_factory=dict)
    """Split recipes by public ID (master only)."""
    busy: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """In-flight requests per (node_id, local_id, lane), local and forwarded, for replica choice."""
    guardians: Guardians = field(default_factory=Guardians)
    """Guardian settings in force: the master's database rows, or what the master pushed."""
    disabled: frozenset[str] = frozenset()
    """Local IDs of this node's disabled models, as its `model_states` table holds them."""
    model_state_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serialises enable/disable so the table and `disabled` change in the same order."""
    assets: AssetService = field(init=False)
    """Asset index, portable-config resolution and peer transfers (registry/assets/)."""
    sync: ClusterSync | None = None
    """Registration (slave) and health polls (master), set by runrouter."""
    ready: bool = False
    """Startup is over (first registration or poll round, startup model): /readyz asks it."""
    requests: Requests = field(default_factory=Requests)
    """Requests being answered now, whatever they wait for: shutdown drains them."""
    forwards: Forwards = field(default_factory=Forwards)
    """Requests forwarded to other nodes, by node: cut when their node stops answering."""
    affinity: AffinityTable = field(init=False)
    """Which replica last served each prompt prefix (`cluster.routing_cache_affinity`)."""
    sticky: StickyIds = field(default_factory=StickyIds)
    """Response, job and prompt IDs, and the replica that created each (proxy/serving/sticky.py)."""
    generations: Generations = field(default_factory=Generations)
    """Kobold generations running here that a client may check or abort by `genkey`."""
    benchmarks: Calibrations | None = None
    """This node's calibration runs (proxy/edge/benchmark.py), set by runrouter."""

    @property
    def node_id(self) -> str:
        return self.config.cluster.node_id

    @property
    def role(self) -> str:
        return self.config.cluster.role

    def source(self) -> str:
        return "master" if self.role == "master" else "local"

    def lane_ready(self, cfg: ModelConfig, lane: Lane) -> bool:
        return self.runtimes.runtime_for(cfg, lane).lane_ready(cfg)

    @property
    def cache_affinity(self) -> bool:
        return self.config.cluster.routing_cache_affinity

    def replica_generation(self, node_id: str, local_id: str, lane: Lane) -> int | None:
        if node_id != self.node_id:
            # A remote replica's cache is lost when its node goes down (node_health drops it);
            # its loads are not seen from here.
            return 0
        for runtime, cfg in self.runtimes.loaded():
            if cfg.local_id == local_id and runtime.lane == lane:
                return runtime.generation
        return None

    def prompt_cost(self, node_id: str, local_id: str, lane: Lane) -> tuple[float, float] | None:
        if lane != "text":
            return None
        fit = None
        if node_id == self.node_id:
            costs = self.lending.costs
            fit = costs.models.get((local_id, "llm")) if costs is not None else None
        elif self.role == "master":
            from lending.master import get_master

            table = get_master(self).last_costs
            fit = table.fits.get((node_id, local_id, "llm")) if table is not None else None
        # A fit that saw one prompt size only has no slope to price a saving with.
        if fit is None or fit.uniform_work is not None or not fit.slopes_ms:
            return None
        if fit.slopes_ms[0] <= 0:
            return None
        return fit.base_ms, fit.slopes_ms[0]

    def node_health(self, node_id: str, healthy: bool) -> None:
        """A node stopped answering its polls: what waits on it in silence gets an error now."""
        if not healthy:
            # Its backends' prompt caches died with it, or cannot be reached: forget them.
            self.affinity.drop_node(node_id)
        remote = self.cluster.nodes.get(node_id)
        if healthy or remote is None or not remote.suspect:
            return
        deadline = self.cluster.health_timeout
        reason = remote.error or "it missed its health poll"
        cut = self.forwards.cut_silent(node_id, deadline, reason)
        if cut:
            logger.warning(
                "node %s stopped answering: %d forwarded request(s) silent for %.1fs cut off",
                node_id,
                cut,
                deadline,
            )

    def public_model_ids(self) -> frozenset[str]:
        """Every public model ID the cluster serves, text and image: what a key may name."""
        return frozenset(self.cluster.by_public_id) | frozenset(self.cluster.by_public_image_id)

    async def keys_publish(self) -> dict[str, str]:
        from registry.keysync import keys_publish

        return await keys_publish(self)

    def local_records(self) -> list[dict[str, Any]]:
        return [
            self.assets.annotate(
                cfg.to_record(
                    node_id=self.node_id,
                    node_url=self.config.cluster.public_url,
                    source=self.source(),
                    available=True,
                    loaded=self.runtimes.is_loaded(cfg),
                    disabled=cfg.local_id in self.disabled,
                    reported_vision=self.runtimes.reported_vision.get(cfg.filename, False),
                )
            )
            for cfg in sorted(self.catalog.configs.values(), key=lambda c: c.local_id)
        ]

    def snapshot(self) -> dict[str, Any]:
        """What this node tells a master about itself (register body and node/models answer)."""
        return {
            "node_id": self.node_id,
            "node_url": self.config.cluster.public_url,
            "role": self.role,
            "models": self.local_records(),
            "protocol_version": PROTOCOL_VERSION,
            "minimum_protocol_version": MINIMUM_PROTOCOL_VERSION,
            "build_version": settings.ROUTER_VERSION,
            "settings_fingerprint": self.lending.fingerprint,
            # The stored-key table this node checks: a master re-pushes on a mismatch.
            "api_keys_fingerprint": current_table().fingerprint,
        }

    def runtime_status(self) -> dict[str, Any]:
        """`runtime-status`: whole-node workload, loaded configs, lending queues, idle time, costs.

        One document serves both selector-less STT scheduling and the lending planner, which
        polls every node for exactly these fields and reads the master's own here.
        """
        lending = self.lending
        text = self.runtimes.runtimes["text"].current
        image = self.runtimes.runtimes["image"].current
        doc: dict[str, Any] = {
            "node_id": self.node_id,
            "build_version": settings.ROUTER_VERSION,
            "backend_mode": self.config.backend.mode,
            "active_requests": self.runtimes.active_requests(),
            "queued_requests": self.runtimes.waiting_requests(),
            "active_text_config": text.filename if text else "",
            "active_image_config": image.filename if image else "",
            "text_queue": lending.queue_stats("text"),
            "image_queue": lending.queue_stats("image"),
            "accepting_borrowed_text": lending.accepting_borrowed("text"),
            "accepting_borrowed_image": lending.accepting_borrowed("image"),
            "idle_for_ms": lending.idle_for_ms(),
            "settings_fingerprint": lending.fingerprint,
            "costs": lending.costs.to_wire() if lending.costs is not None else None,
        }
        for runtime in self.runtimes.all():
            cfg = runtime.current
            if cfg is not None and cfg.has_voice:
                doc["active_stt_model_id"] = cfg.local_id
                doc["active_stt_config_filename"] = cfg.filename
                doc["active_stt_backend_mode"] = cfg.backend_mode
                break
        return doc


def _scan(config: RouterConfig) -> LocalCatalog:
    return LocalCatalog.scan(
        Path(config.models.config_dir),
        default_backend_mode=config.backend.mode,
        store_dir=Path(config.cluster.store_dir),
    )


def _load_finished(
    recorder: Recorder, also: list[Callable[[LoadEvent], None]], event: LoadEvent
) -> None:
    recorder.add_load(event)
    metrics.load_finished(event)
    for listener in also:
        listener(event)


def _wire_lending(node: Node, config: RouterConfig) -> None:
    """Lending's parts of the node: its settings, the owner's and helper's sides, the request
    gate and the decision log."""
    node.lending = Lending(
        node_id=config.cluster.node_id,
        file_values=config.lending_file_values(),
        fair_share=config.auth.fair_share,
    )
    node.owner = OwnerLending(node)
    node.lending.hold_policy = lambda lane: HoldPolicy(node, lane)
    node.lending.lease_live = lambda lane, model_id: node.owner.live(lane, model_id) is not None
    node.restore = Restorer(node)
    if config.cluster.role != "slave":
        # A standalone node has one too: its metrics show the cluster families, empty.
        node.master = MasterLending(node)
    node.lending_gate = RequestLending(node)
    node.decisions = DecisionLog(
        node_id=config.cluster.node_id,
        router_version=settings.ROUTER_VERSION,
        clock_ms=lambda: int(time.time() * 1000),
    )


def build_node(
    config: RouterConfig,
    *,
    assignments: dict[IdentityKey, Assignment] | None = None,
    on_assignments: Any = None,
    disabled: Iterable[str] = (),
) -> Node:
    recorder = Recorder(node_id=config.cluster.node_id, enabled=config.analytics.enabled)
    # Filled once lending exists (below): the runtimes are built before it.
    load_listeners: list[Callable[[LoadEvent], None]] = []
    runtimes = RuntimeManager(
        config=config,
        log_dir=Path(config.cluster.store_dir) / "logs",
        on_load=partial(_load_finished, recorder, load_listeners),
    )
    node = Node(
        config=config,
        catalog=_scan(config),
        runtimes=runtimes,
        recorder=recorder,
        deadlines=Deadlines(tick_secs=tick_for(config.backend.request_timeout)),
        disabled=frozenset(disabled),
    )
    node.assets = AssetService(node)
    c = config.cluster
    node.affinity = AffinityTable(
        max_entries=c.routing_affinity_entries, ttl=c.routing_affinity_ttl
    )
    node.cluster = ClusterState(
        role=c.role,
        node_id=c.node_id,
        public_url=c.public_url,
        slave_urls=c.slave_urls if c.role == "master" else [],
        local_records=node.local_records,
        local_configs=lambda: node.catalog.configs,
        assignments=assignments,
        on_assignments=on_assignments,
        health_timeout=c.health_timeout,
    )
    node.cluster.health_listeners.append(node.node_health)
    # An upstream server that reports its model reads images changes this node's records.
    runtimes.on_capabilities = node.cluster.rebuild
    if c.role == "master":
        node.recipes = load_recipes(Path(c.store_dir))
    _wire_lending(node, config)
    lending = node.lending
    load_listeners.append(
        lambda e: lending.load_measured(e.config_filename, e.duration_ms, success=e.success)
    )
    if c.role != "standalone":
        urls = [u for u in (c.public_url, c.master_url, *c.slave_urls) if u]
        node.client = NodeClient(
            token=c.token,
            allow=AllowList(urls),
            control_timeout=c.control_timeout,
            ssl_context=node_ssl_context(c),
        )
    return node


if TYPE_CHECKING:

    def _is_every_port(
        node: Node,
    ) -> tuple[RegistryNode, AnalyticsNode, LendingNode, ServingNode, GuardiansNode, AccessNode]:
        # The layers below see the node only through their ports, and their views read it
        # from routerproject.node_slot with a cast: mypy proves here that Node is each port.
        return node, node, node, node, node, node

    def _is_asset_node(node: Node) -> AssetNode:
        return node


def catch_up_if_stale(node: Node, node_id: str, snapshot: Mapping[str, Any]) -> None:
    """Push the master's links, settings and guardians to a slave whose snapshot shows other
    lending settings than this node runs: it restarted or joined late, and runs defaults until
    told. Told now rather than at the next tick.

    Lending and guardians each own their push; the node, which holds both, runs them together.
    The stored-key table has its own fingerprint and is pushed on its own mismatch.
    """
    from guardians.services import guardians_catch_up
    from lending.propagate import schedule_catch_up
    from registry.keysync import keys_catch_up

    keys_catch_up(node, node_id, snapshot.get("api_keys_fingerprint"))
    if snapshot.get("settings_fingerprint") == node.lending.fingerprint:
        return

    async def guardians(slave_id: str) -> None:
        await guardians_catch_up(node, slave_id)

    schedule_catch_up(node, node_id, also=[guardians])


_node: Node | None = None


def get_node() -> Node:
    global _node
    if _node is None:
        _node = build_node(settings.ROUTER)
    return _node


def set_node(node: Node | None) -> None:
    """Install a node built elsewhere (tests, or runrouter with its persisted state)."""
    global _node
    _node = node
