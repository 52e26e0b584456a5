"""What registry code needs of the running node, which lives in the proxy layer above it.

The node (`proxy.node.Node`) is handed to registry code as an argument, or read by the views
through `running_node()`; registry sees it only through these Protocols, so it never imports
the layers above. mypy checks that the real node satisfies them (see proxy/node.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from registry.affinity import AffinityTable
from registry.catalog import LocalCatalog
from registry.cluster import ClusterState
from registry.kcpps import Lane, ModelConfig
from registry.nodeclient import NodeClient
from registry.recipes import Recipe
from routerproject import node_slot
from routerproject.config import RouterConfig


class RoutingNode(Protocol):
    """What replica choice reads (registry/routing.py)."""

    @property
    def cluster(self) -> ClusterState: ...

    @property
    def busy(self) -> Mapping[tuple[str, str, str], int]:
        """In-flight requests per (node_id, local_id, lane)."""
        ...

    @property
    def recipes(self) -> Mapping[str, Recipe]: ...

    def lane_ready(self, cfg: ModelConfig, lane: Lane) -> bool:
        """Whether a local replica's lane can take a request (reference-cluster §3.3)."""
        ...

    @property
    def affinity(self) -> AffinityTable:
        """Which replica last served each prompt prefix (registry/affinity.py)."""
        ...

    @property
    def cache_affinity(self) -> bool:
        """`cluster.routing_cache_affinity`: replica choice consults the affinity table."""
        ...

    def replica_generation(self, node_id: str, local_id: str, lane: Lane) -> int | None:
        """The load generation of a replica's model (a reload or switch changes it); None when
        the model is not loaded there (a local replica) and so holds no cache."""
        ...

    def prompt_cost(self, node_id: str, local_id: str, lane: Lane) -> tuple[float, float] | None:
        """`(base_ms, ms_per_prompt_token)` of a replica from the cost fits; None when unfitted."""
        ...


class LaunchView(Protocol):
    @property
    def base_url(self) -> str: ...


class RuntimeView(Protocol):
    """One backend slot of the node, as loads, unloads and the node state use it."""

    @property
    def lane(self) -> Lane: ...

    @property
    def current(self) -> ModelConfig | None: ...

    @property
    def generation(self) -> int: ...

    @property
    def active(self) -> int: ...

    @property
    def launch(self) -> LaunchView | None: ...

    def status(self) -> dict[str, Any]: ...

    def is_idle(self) -> bool: ...

    async def wait_idle(self) -> None: ...

    async def load(self, cfg: ModelConfig) -> None: ...

    async def unload(self) -> bool: ...


class RuntimesView(Protocol):
    @property
    def runtimes(self) -> Mapping[Lane, RuntimeView]:
        """The node's own runtimes by lane (upstream servers have runtimes of their own)."""
        ...

    def runtime_for(self, cfg: ModelConfig, lane: Lane) -> RuntimeView: ...

    def all(self) -> Sequence[RuntimeView]: ...

    def loaded(self) -> Sequence[tuple[RuntimeView, ModelConfig]]: ...


class BorrowedWork(Protocol):
    """The node's count of work other nodes lent it, per runtime (lending keeps it).

    The runtime is typed Any: lending's ledger takes the node's own runtime type, which this
    layer cannot name, and registry only ever passes back a runtime the node gave it.
    """

    def borrowed_on(self, runtime: Any) -> int: ...

    async def borrowed_drained(self, runtime: Any) -> None: ...


class OwnWork(Protocol):
    """Brackets work the node does for itself, so it takes no borrowed work meanwhile; and
    what lending knows that the node's state shows (held requests, measured load times)."""

    def own_begin(self) -> None: ...

    def own_end(self) -> None: ...

    def held_now(self) -> list[dict[str, Any]]:
        """Requests the router holds or has lent, as `site/nodes/state` lists them."""
        ...

    def waiting_by_key(self) -> list[dict[str, Any]]:
        """Requests waiting in the router queues per lane, model and key (`site/nodes/state`)."""
        ...

    def expected_load_ms(self, config_filename: str) -> float | None:
        """This node's mean time to load a config, from its own loads; None if never measured."""
        ...


class Calibrations(Protocol):
    """The node's model calibrations (`manage.py benchmark_models`, proxy/edge/benchmark.py)."""

    def start(self, models: Sequence[str] | None) -> dict[str, Any]:
        """Start calibrating `models` (None: every enabled text or image model); the status."""
        ...

    def status(self) -> dict[str, Any]: ...

    async def stop(self) -> None:
        """Shutdown: send no more calibration requests."""
        ...


class PendingRows(Protocol):
    def pending(self) -> int: ...


class ClusterMember(Protocol):
    """Who the node is in its cluster and how it reaches the others: every layer reads these."""

    @property
    def node_id(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def config(self) -> RouterConfig: ...

    @property
    def client(self) -> NodeClient | None: ...

    @property
    def cluster(self) -> ClusterState: ...


class RegistryNode(RoutingNode, ClusterMember, Protocol):
    """The running node as registry services, inventory, sync and views use it."""

    disabled: frozenset[str]
    """Local IDs of this node's disabled models; enabling or disabling replaces it."""

    @property
    def catalog(self) -> LocalCatalog: ...

    @property
    def runtimes(self) -> RuntimesView: ...

    @property
    def restore(self) -> BorrowedWork: ...

    @property
    def lending(self) -> OwnWork: ...

    @property
    def recorder(self) -> PendingRows: ...

    @property
    def model_state_lock(self) -> asyncio.Lock: ...

    @property
    def benchmarks(self) -> Calibrations | None: ...

    def source(self) -> str: ...

    def local_records(self) -> list[dict[str, Any]]: ...

    def snapshot(self) -> dict[str, Any]: ...


def running_node() -> RegistryNode:
    """The node this router process runs, as the proxy installed it in routerproject.node_slot."""
    return cast(RegistryNode, node_slot.node())
