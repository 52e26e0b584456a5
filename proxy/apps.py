from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

from routerproject import node_slot

if TYPE_CHECKING:
    from proxy.node import Node


def _running_node() -> Node:
    # Imported on first call: django-q2 workers and management commands never touch the node
    # and need not load the proxy's modules.
    from proxy.node import get_node

    return get_node()


class ProxyConfig(AppConfig):
    name = "proxy"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The lower layers' views reach the node only through this slot (see node_slot).
        node_slot.install(_running_node)
