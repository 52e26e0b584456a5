"""What lending's publishing, ticker and views need of the running node (the proxy layer's).

The node is handed to them as an argument, or read by the views through `running_node()`;
they see it only through this Protocol, so lending never imports the layers above. mypy checks
that the real node satisfies it (see proxy/node.py).
"""

from __future__ import annotations

from typing import Protocol, cast

from lending.decisions import DecisionLog
from lending.runtime import Lending
from registry.cluster import ClusterState
from registry.nodeclient import NodeClient
from routerproject import node_slot
from routerproject.config import RouterConfig


class LendingNode(Protocol):
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

    @property
    def lending(self) -> Lending:
        """Links, settings, queues and costs this node runs with."""
        ...

    @property
    def decisions(self) -> DecisionLog: ...


def running_node() -> LendingNode:
    """The node this router process runs, as the proxy installed it in routerproject.node_slot."""
    return cast(LendingNode, node_slot.node())
