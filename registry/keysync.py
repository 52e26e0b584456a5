"""Every node knows the stored keys: the master publishes its table, slaves follow it.

The master (or a standalone node) builds its table from the database at start and after every
change, and pushes it (hashes and scopes, never a secret) to every registered slave at once,
and to a slave whose snapshot shows another key fingerprint (it restarted, or missed a push).

A push can fail while the slave still reaches the master (a one-way network fault, a slave
busy past the push timeout, a master that has the slave under a stale URL). So that a slave
that can reach its master never accepts a revoked key for long, the slave also asks the master
for the table's fingerprint every `KEYS_PULL_INTERVAL_SECS`, sending its own, and takes the
table the master answers when they differ: while the master answers, a revocation reaches the
slave within that interval plus one call, whatever became of the push. When the master does
not answer, the slave keeps the table it has: the keys it knew keep working (availability over
a revocation nobody can tell it about).

Lives in the registry (not in `access`) because it calls other nodes: access, below, stays
free of the cluster's machinery.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from urllib.parse import quote

import orjson
from channels.db import database_sync_to_async

from access.keys import KeyTable, current_table, install_table
from access.selectors import api_keys_table, api_keys_version
from registry.nodeclient import NodeCallError
from registry.outcomelog import PeriodicCall
from registry.ports import ClusterMember
from registry.slavepush import push_to_slaves

logger = logging.getLogger(__name__)

KEYS_PATH = "/router/v1/node/api-keys"
# Pull: at most this long between a revocation on the master and the slave knowing, while the
# master answers (plus the call itself). The call is a fingerprint when nothing changed.
KEYS_PULL_INTERVAL_SECS = 1.0
KEYS_CALL_TIMEOUT_SECS = 2.0


async def keys_publish(node: ClusterMember) -> dict[str, str]:
    """Rebuild this node's table from the database and push it to every slave (master);
    node_id → error for slaves that did not take it. A slave publishes nothing."""
    if node.role == "slave":
        return {}
    table = await database_sync_to_async(api_keys_table)()
    install_table(table)
    return await keys_push(node, table)


async def keys_push(
    node: ClusterMember, table: KeyTable, *, only: str | None = None
) -> dict[str, str]:
    """POST the table to every registered slave (or just `only`); node_id → error."""
    return await push_to_slaves(
        node,
        KEYS_PATH,
        table.to_wire(),
        only=only,
        timeout=KEYS_CALL_TIMEOUT_SECS,
        what="the key table",
    )


def keys_catch_up(
    node: ClusterMember, node_id: str, fingerprint: object
) -> asyncio.Task[object] | None:
    """Push the table to a slave whose snapshot shows another fingerprint than this node's."""
    table = current_table()
    if node.role != "master" or fingerprint == table.fingerprint:
        return None
    task: asyncio.Task[object] = asyncio.ensure_future(keys_push(node, table, only=node_id))
    _catch_ups.add(task)
    task.add_done_callback(_catch_ups.discard)
    return task


_catch_ups: set[asyncio.Task[object]] = set()


def keys_answer(fingerprint: str | None) -> dict[str, object]:
    """The master's answer to a slave's pull: the fingerprint alone when the slave's matches,
    else the whole table."""
    table = current_table()
    if fingerprint == table.fingerprint:
        return {"fingerprint": table.fingerprint}
    return table.to_wire()


KEYS_FILENAME = "api-keys.json"
"""In a slave's store: the last table its master sent (hashes, never secrets)."""


def keys_file(node: ClusterMember) -> Path:
    return Path(node.config.cluster.store_dir) / KEYS_FILENAME


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_bytes(data)
    partial.replace(path)


async def keys_receive(node: ClusterMember, doc: object) -> KeyTable:
    """Install the table a master pushed or answered (ValueError when it is malformed), and
    keep it in the slave's store for its next start.

    Built off the event loop: ten thousand keys take tens of milliseconds to index, which the
    requests in flight need not wait for.
    """
    table = await asyncio.to_thread(KeyTable.from_wire, doc)
    if table.fingerprint != current_table().fingerprint:
        install_table(table)
        logger.info(
            "key table from the master: %d key(s), fingerprint %s", len(table), table.fingerprint
        )
        data = orjson.dumps(table.to_wire())
        try:
            await asyncio.to_thread(_write_atomically, keys_file(node), data)
        except OSError as exc:
            logger.warning("could not keep the key table in %s: %s", keys_file(node), exc)
    return table


async def keys_restore(node: ClusterMember) -> bool:
    """A slave starts with the table its master last sent, so a restart while the master is
    unreachable neither opens the node to everyone nor locks its key holders out. True when a
    kept table was installed."""
    path = keys_file(node)
    try:
        data = await asyncio.to_thread(path.read_bytes)
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("could not read the kept key table %s: %s", path, exc)
        return False
    try:
        table = await asyncio.to_thread(KeyTable.from_wire, orjson.loads(data))
    except (ValueError, orjson.JSONDecodeError) as exc:
        logger.warning("the kept key table %s is unreadable (%s): ignored", path, exc)
        return False
    install_table(table)
    return True


class KeySync(PeriodicCall):
    """This process's key loop: on a slave the pull (module docstring); on a master or a
    standalone node a watch of the table's rows, so a change made outside the site API (the
    Django admin, `manage.py create_api_key` in another process) is published within
    `interval` too."""

    def __init__(self, node: ClusterMember, *, interval: float = KEYS_PULL_INTERVAL_SECS) -> None:
        super().__init__(logger, "key table sync", interval)
        self.node = node
        self._version: object = None

    async def pull_once(self) -> bool:
        """Ask the master once; True when the table here is the master's now."""
        node = self.node
        client = node.client
        if client is None or node.role != "slave":
            return False
        mine = current_table().fingerprint
        try:
            status, doc = await client.call_json(
                "GET",
                node.config.cluster.master_url,
                f"{KEYS_PATH}?fingerprint={quote(mine)}",
                timeout=KEYS_CALL_TIMEOUT_SECS,
            )
            if status != 200 or not isinstance(doc, dict):
                raise NodeCallError("status", f"master answered {status}", status=status)
            if "keys" in doc:
                await keys_receive(node, doc)
        except (NodeCallError, ValueError) as exc:
            self._note(str(exc))
            return False
        self._note("")
        return True

    async def watch_once(self) -> bool:
        """Republish when the rows changed since the last look and the table in force is not
        theirs yet; True when it published."""
        version = await database_sync_to_async(api_keys_version)()
        if version == self._version:
            return False
        self._version = version
        table = await database_sync_to_async(api_keys_table)()
        if table.fingerprint == current_table().fingerprint:
            # The site API published this change itself already.
            return False
        install_table(table)
        await keys_push(self.node, table)
        return True

    async def tick(self) -> bool:
        # A database outage on the master raises: the table in force stays, and so do we.
        return await (self.pull_once() if self.node.role == "slave" else self.watch_once())
