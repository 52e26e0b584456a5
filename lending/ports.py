"""What lending needs of the running node (the proxy layer's) and of the requests it serves.

The node is handed to lending as an argument, or read by the views through `running_node()`;
lending sees it, and the proxy's requests and runtimes, only through these Protocols, so it
never imports the layers above. mypy checks that the real node satisfies them (see
proxy/node.py) and that the proxy's requests do (see proxy/forwarding/local.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from lending.decisions import DecisionLog
from lending.runtime import Lending
from registry.catalog import LocalCatalog
from registry.kcpps import Lane, ModelConfig
from registry.ports import ClusterMember
from routerproject import node_slot

if TYPE_CHECKING:
    from lending.master import MasterLending
    from lending.owner import OwnerLending
    from lending.restore import Restorer


class LendingNode(ClusterMember, Protocol):
    @property
    def lending(self) -> Lending:
        """Links, settings, queues and costs this node runs with."""
        ...

    @property
    def decisions(self) -> DecisionLog: ...

    @property
    def catalog(self) -> LocalCatalog:
        """The node's model configs: the timeline counts its backend slots from them."""
        ...


class LendingRuntime(Protocol):
    """One backend slot of the node: what borrowed work displaces and restore loads back."""

    @property
    def current(self) -> ModelConfig | None: ...

    @property
    def loading(self) -> ModelConfig | None: ...

    async def load(self, cfg: ModelConfig, *, reason: str) -> None: ...


class LendingRuntimes(Protocol):
    def runtime_for(self, cfg: ModelConfig, lane: Lane) -> LendingRuntime: ...

    def is_loaded(self, cfg: ModelConfig) -> bool: ...

    def active_requests(self) -> int: ...

    def waiting_requests(self) -> int: ...


class ServingNode(LendingNode, Protocol):
    """The node as lending's request path, owner, master, hold and restore use it."""

    @property
    def owner(self) -> OwnerLending: ...

    @property
    def restore(self) -> Restorer: ...

    @property
    def master(self) -> MasterLending | None:
        """The master's side of lending, built with the node; None on a slave, which plans
        nothing."""
        ...

    @property
    def runtimes(self) -> LendingRuntimes: ...

    @property
    def disabled(self) -> frozenset[str]:
        """Local IDs of this node's disabled models: restore never loads one back."""
        ...

    def runtime_status(self) -> dict[str, Any]:
        """This node's `runtime-status`: the master plans with its own beside the others'."""
        ...


class RequestCtx(Protocol):
    """One client request in flight, as lending's request path reads it."""

    @property
    def borrowed(self) -> bool:
        """Lent here by another node (the node protocol says so, never a client header)."""
        ...

    @property
    def offload_load(self) -> bool:
        """The link lets serving this borrowed request load the helper model."""
        ...

    @property
    def offload_restore(self) -> bool:
        """The link asks for the displaced model to be loaded back after borrowed work."""
        ...

    @property
    def started(self) -> bool:
        """The client has the start of an answer: a failed relay can no longer go back."""
        ...

    @property
    def request_id(self) -> str:
        """Its X-Request-Id: decision rows about it carry it, and so do relays to a helper."""
        ...

    @property
    def key_name(self) -> str | None:
        """The stored key it came with: a relay to a helper carries it for the usage row."""
        ...

    @property
    def scope(self) -> dict[str, Any]:
        """The ASGI scope: the front door's `Caller` (access/identity.py) is in it."""
        ...

    def header(self, name: bytes) -> bytes | None:
        """A request header's value (lower-case name), or None."""
        ...


class ImageSize(Protocol):
    @property
    def units(self) -> int: ...


class RequestJob(Protocol):
    """One request bound for a backend: what lending reads, and the one mark it sets."""

    # A relay answers through a copy addressed to the helper's model (dataclasses.replace).
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    lent: bool
    """Answered by a helper: the owner's own fits must not learn from it."""

    @property
    def cfg(self) -> ModelConfig: ...

    @property
    def lane(self) -> Lane: ...

    @property
    def model_id(self) -> str: ...

    @property
    def backend_path(self) -> str: ...

    @property
    def body(self) -> bytes: ...

    @property
    def content_type(self) -> bytes: ...

    @property
    def lendable(self) -> bool: ...

    @property
    def cached_prompt_bytes(self) -> int:
        """Leading prompt bytes this node's backend holds in its prompt cache."""
        ...

    @property
    def stream(self) -> bool: ...

    @property
    def image(self) -> ImageSize | None: ...

    @property
    def max_tokens(self) -> int | None: ...

    @property
    def has_image(self) -> bool:
        """Carries an image: never lent to a helper without vision."""
        ...

    @property
    def guardian_restore(self) -> bool:
        """Run as a guardian of a text-only model here, which is loaded back after."""
        ...


def running_node() -> LendingNode:
    """The node this router process runs, as the proxy installed it in routerproject.node_slot."""
    return cast(LendingNode, node_slot.node())
