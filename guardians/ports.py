"""What guardian routing, publishing and views need of the running node (the proxy layer's).

The node is handed to them as an argument, or read by the views through `running_node()`;
they see it only through this Protocol, so guardians never imports the proxy. mypy checks that
the real node satisfies it (see proxy/node.py).
"""

from __future__ import annotations

from typing import Protocol, cast

from guardians.store import Guardians
from lending.ports import LendingNode
from registry.ports import RoutingNode
from routerproject import node_slot


class GuardiansNode(LendingNode, RoutingNode, Protocol):
    """Replica choice for the guardian, plus what pushing to slaves needs."""

    guardians: Guardians
    """Guardian settings in force; publishing replaces them."""


def running_node() -> GuardiansNode:
    """The node this router process runs, as the proxy installed it in routerproject.node_slot."""
    return cast(GuardiansNode, node_slot.node())
