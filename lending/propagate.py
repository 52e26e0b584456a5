"""The master publishes links and lending settings to every slave (guardians push theirs too).

At once after any change, and again on every tick, so a slave that restarted or missed a push
converges within one refresh interval. Slaves then run exactly what the master runs.
Delivery failures are logged only when a node's outcome changes, so a dead slave does not
flood the log every tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from channels.db import database_sync_to_async

from lending.links import links_snapshot
from lending.ports import LendingNode
from lending.settings_store import overrides_load, settings_effective, settings_resolve
from registry.slavepush import push_to_slaves

logger = logging.getLogger(__name__)


def _effective_values(node: LendingNode) -> dict[str, str]:
    entries = settings_resolve(
        file_values=node.config.lending_file_values(), overrides=overrides_load()
    )
    return settings_effective(entries)


async def links_publish(node: LendingNode) -> dict[str, str]:
    """Load the link set from the database, run it here, and push it to every slave."""
    if node.role == "slave":
        return {}
    snapshot = await database_sync_to_async(links_snapshot)()
    node.lending.set_links(snapshot)
    return await push_to_slaves(node, "/router/v1/node/routing-links", snapshot)


async def settings_publish(node: LendingNode) -> dict[str, str]:
    """Resolve the effective settings (database → config file → default), run them, push them."""
    if node.role == "slave":
        return {}
    values = await database_sync_to_async(_effective_values)(node)
    node.lending.apply_settings(values, source="local")
    return await push_to_slaves(node, "/router/v1/node/offload/settings", values)


CatchUp = Callable[[str], Awaitable[object]]
"""Brings one slave (by node_id) up to what the master runs: how a layer above lending adds its
own push (the guardians) to a catch-up, bound to the node by the node container."""


async def node_catch_up(node: LendingNode, node_id: str, *, also: Sequence[CatchUp] = ()) -> None:
    """Bring one slave that just (re)registered up to the master's links and settings, then
    run the pushes of the layers above (`also`) for it, in that order."""
    if node.role != "master":
        return
    links = await database_sync_to_async(links_snapshot)()
    await push_to_slaves(node, "/router/v1/node/routing-links", links, only=node_id)
    await push_to_slaves(
        node, "/router/v1/node/offload/settings", dict(node.lending.values), only=node_id
    )
    for push in also:
        await push(node_id)


_catch_up_tasks: set[asyncio.Task[None]] = set()


def schedule_catch_up(node: LendingNode, node_id: str, *, also: Sequence[CatchUp] = ()) -> None:
    task = asyncio.ensure_future(node_catch_up(node, node_id, also=also))
    _catch_up_tasks.add(task)
    task.add_done_callback(_catch_up_tasks.discard)
