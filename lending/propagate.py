"""The master publishes links and lending settings to every slave (guardians push theirs too).

At once after any change, and again on every tick, so a slave that restarted or missed a push
converges within one refresh interval. Slaves then run exactly what the master runs.
A slave is pushed only the links it owns or helps in: that is all it runs them for (which of
its models are enrolled), and the whole set, pushed to each of N slaves, made every publish
cost N times the whole set (a thousand slaves with ten links each: 1.5 GB of JSON a minute).
Delivery failures are logged only when a node's outcome changes, so a dead slave does not
flood the log every tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

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
    return await push_links(node, snapshot)


LINKS_PATH = "/router/v1/node/routing-links"
Links = Mapping[str, Sequence[Mapping[str, Any]]]


def links_by_node(snapshot: Links) -> dict[str, dict[str, list[Mapping[str, Any]]]]:
    """Each node's own links (those naming it as owner or helper), per lane, in set order."""
    out: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for lane, links in snapshot.items():
        for link in links:
            for node_id in dict.fromkeys((link["owner_node_id"], link["helper_node_id"])):
                mine = out.setdefault(node_id, {name: [] for name in snapshot})
                mine[lane].append(link)
    return out


async def push_links(
    node: LendingNode, snapshot: Links, *, only: str | None = None
) -> dict[str, str]:
    """Push every registered slave (or just `only`) its own links; node_id → error."""
    own = links_by_node(snapshot)
    empty: dict[str, list[Mapping[str, Any]]] = {lane: [] for lane in snapshot}
    targets = [n for n in node.cluster.nodes if only is None or n == only]
    results = await asyncio.gather(
        *(push_to_slaves(node, LINKS_PATH, own.get(n, empty), only=n) for n in targets)
    )
    return {node_id: error for result in results for node_id, error in result.items()}


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
    links = await _links_for_catch_up()
    await push_links(node, links, only=node_id)
    await push_to_slaves(
        node, "/router/v1/node/offload/settings", dict(node.lending.values), only=node_id
    )
    for push in also:
        await push(node_id)


_catch_up_tasks: set[asyncio.Task[None]] = set()
_links_reading: asyncio.Future[dict[str, list[dict[str, Any]]]] | None = None


async def _links_for_catch_up() -> dict[str, list[dict[str, Any]]]:
    """The link set from the database, one read shared by the catch-ups that ask while it runs.

    After a master restart every slave registers within seconds; a read of the whole set per
    slave (ten thousand rows each, at a thousand slaves) kept the database thread, and the
    event loop through the GIL, busy for minutes. A read that started before a caller asked
    is as fresh as one of its own would have been a moment earlier, and a change to the links
    is pushed to every slave after it anyway (`links_publish`).
    """
    global _links_reading
    if _links_reading is None or _links_reading.get_loop() is not asyncio.get_running_loop():
        _links_reading = asyncio.ensure_future(database_sync_to_async(links_snapshot)())

        def done(_: object) -> None:
            global _links_reading
            _links_reading = None

        _links_reading.add_done_callback(done)
    return await asyncio.shield(_links_reading)


def schedule_catch_up(node: LendingNode, node_id: str, *, also: Sequence[CatchUp] = ()) -> None:
    task = asyncio.ensure_future(node_catch_up(node, node_id, also=also))
    _catch_up_tasks.add(task)
    task.add_done_callback(_catch_up_tasks.discard)
