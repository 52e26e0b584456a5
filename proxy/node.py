"""The router process's node state: catalog, runtimes and the analytics recorder.

One instance per router process, created lazily from settings on first use (Daphne has no
startup hook), and replaced by `reset_for_tests()`. The django-q2 workers never touch it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from analytics.recorder import Recorder
from proxy.runtimes import RuntimeManager
from registry.catalog import LocalCatalog
from routerproject.config import RouterConfig


@dataclass
class Node:
    config: RouterConfig
    catalog: LocalCatalog
    runtimes: RuntimeManager
    recorder: Recorder
    started_at: float = field(default_factory=time.time)

    @property
    def node_id(self) -> str:
        return self.config.cluster.node_id

    def rescan(self) -> None:
        self.catalog = _scan(self.config)


def _scan(config: RouterConfig) -> LocalCatalog:
    return LocalCatalog.scan(
        Path(config.models.config_dir),
        default_backend_mode=config.backend.mode,
        store_dir=Path(config.cluster.store_dir),
    )


def build_node(config: RouterConfig) -> Node:
    recorder = Recorder(node_id=config.cluster.node_id, enabled=config.analytics.enabled)
    runtimes = RuntimeManager(
        config=config,
        log_dir=Path(config.cluster.store_dir) / "logs",
        on_load=recorder.add_load,
    )
    return Node(config=config, catalog=_scan(config), runtimes=runtimes, recorder=recorder)


_node: Node | None = None


def get_node() -> Node:
    global _node
    if _node is None:
        _node = build_node(settings.ROUTER)
    return _node


def set_node(node: Node | None) -> None:
    """Install a node built elsewhere (tests, or runrouter with its own config)."""
    global _node
    _node = node


def reset_for_tests() -> None:
    set_node(None)
