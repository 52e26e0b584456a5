"""What analytics views need of the running node (the proxy layer's): its recorder, and for the
cluster's usage who it is and how it reaches the other nodes.

Read through `running_node()`, typed with this Protocol, so analytics never imports the layers
above. mypy checks that the real node satisfies it (see proxy/node.py).
"""

from __future__ import annotations

from typing import Protocol, cast

from analytics.recorder import Recorder
from registry.ports import ClusterMember
from routerproject import node_slot


class AnalyticsNode(ClusterMember, Protocol):
    @property
    def recorder(self) -> Recorder: ...


def running_node() -> AnalyticsNode:
    """The node this router process runs, as the proxy installed it in routerproject.node_slot."""
    return cast(AnalyticsNode, node_slot.node())
