"""What the key views need of the running node, which lives in the proxy layer above access.

The views read the node through `running_node()` and see it only through this Protocol, so
access never imports the layers that know the cluster's models or push to slaves. mypy checks
that the real node satisfies it (see proxy/node.py).
"""

from __future__ import annotations

from typing import Protocol, cast

from routerproject import node_slot


class AccessNode(Protocol):
    def public_model_ids(self) -> frozenset[str]:
        """Every public model ID (text and image) the cluster serves: what `models` may name."""
        ...

    async def keys_publish(self) -> dict[str, str]:
        """Rebuild this node's key table from the database and push it to every slave;
        node_id → error for the slaves that did not take it."""
        ...


def running_node() -> AccessNode:
    """The node this router process runs, as the proxy installed it in routerproject.node_slot."""
    return cast(AccessNode, node_slot.node())
