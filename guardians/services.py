"""Publishing guardian settings: the master routes with its database rows and pushes them on.

Like links and lending settings: at once after a change, on every lending tick, and to a slave
that (re)registers with other settings, so a slave routes image requests as its master would.
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from guardians.ports import GuardiansNode
from guardians.store import guardians_load
from lending.propagate import push_to_slaves

GUARDIANS_PATH = "/router/v1/node/guardians"


async def guardians_publish(node: GuardiansNode) -> dict[str, str]:
    """Load the guardian settings from the database, route with them here, push them."""
    if node.role == "slave":
        return {}
    node.guardians = await database_sync_to_async(guardians_load)()
    return await push_to_slaves(node, GUARDIANS_PATH, node.guardians.as_dict())


async def guardians_catch_up(node: GuardiansNode, node_id: str) -> None:
    """Bring one slave that just (re)registered up to the master's guardians."""
    if node.role != "master":
        return
    await push_to_slaves(node, GUARDIANS_PATH, node.guardians.as_dict(), only=node_id)
