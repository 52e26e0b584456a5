"""The running node, handed down to the layers below the proxy.

The node container (`proxy.node.Node`) wires every app together, so it sits in the top layer
and no lower layer may import it. Django views and services of those layers still act on the
node the router process runs: the proxy installs a provider here when Django starts
(`proxy.apps`), and each layer reads it through its own `ports` module, typed with a Protocol
of exactly what that layer uses.

A provider rather than the node itself: the node is built lazily on first use (tests build
apps without a server to start it) and tests replace it, so the slot asks the proxy each time.
"""

from __future__ import annotations

from collections.abc import Callable

_provider: Callable[[], object] | None = None


def install(provider: Callable[[], object]) -> None:
    """Make `provider` the source of the running node (the proxy app does this at startup)."""
    global _provider
    _provider = provider


def node() -> object:
    """The running node; each layer's `ports.running_node()` gives it that layer's type."""
    if _provider is None:
        raise RuntimeError("no node provider is installed: the proxy app installs it at startup")
    return _provider()
