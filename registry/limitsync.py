"""Per-key limits across the cluster: slaves report their counts, the master answers the rest.

Every `LIMITS_SYNC_INTERVAL_SECS` a slave POSTs its own counts per key (`Limiter.report`:
requests and tokens in the window, requests in flight) to the master; the master keeps each
node's last report (`Ledger`) and answers with the sum of every other node's, its own
included, which the slave adds to its live counts. The master adds the slaves' sum to its own
at each report it takes. One exchange carries both directions, so an admission on one node is
seen on every other within two intervals plus the calls (README, "Limits": the slack).

Why this and not a central counter: a request is never held for a call to the master, a node
that loses the master keeps counting on its own, and the master already talks to every node.
Why not piggybacked on registration: that runs every `cluster.sync_interval` (seconds), far
too coarse for a limit of a minute; the exchange is a few hundred bytes and runs only while
the key table has a limited key.

Lives in the registry (not in `access`) because it calls other nodes.
"""

from __future__ import annotations

import logging
from typing import Any

from access.keys import KeyTable, current_table
from access.limits import (
    add_counts,
    counts_from_wire,
    counts_to_wire,
    current_ledger,
    current_limiter,
)
from registry.nodeclient import NodeCallError
from registry.outcomelog import PeriodicCall
from registry.ports import ClusterMember

logger = logging.getLogger(__name__)

LIMITS_PATH = "/router/v1/node/limits"
LIMITS_SYNC_INTERVAL_SECS = 0.25
LIMITS_CALL_TIMEOUT_SECS = 1.0


def has_limits(table: KeyTable) -> bool:
    """Whether any key of the table has a limit (else there is nothing to exchange)."""
    return any(
        r.rpm is not None or r.tpm is not None or r.max_concurrent is not None
        for r in table.records
    )


def limits_answer(node_id: str, doc: Any) -> dict[str, Any]:
    """The master takes a node's report and answers with everyone else's sum; ValueError
    when the report is malformed."""
    if not isinstance(doc, dict):
        raise ValueError("the report must be a JSON object")
    counts = counts_from_wire(doc.get("keys", {}))
    limiter, ledger = current_limiter(), current_ledger()
    limiter.follow(current_table())
    ledger.take(node_id, counts)
    limiter.take_remote(ledger.totals())
    return {"keys": counts_to_wire(add_counts(ledger.totals(excluding=node_id), limiter.report()))}


def limits_view(node_id: str) -> dict[str, Any]:
    """`GET /router/v1/node/limits`: per key, this node's counts and the cluster's as seen here,
    each `[requests, tokens, in_flight]`."""
    limiter = current_limiter()
    limiter.follow(current_table())
    keys = {
        name: {part: list(counts) for part, counts in parts.items()}
        for name, parts in limiter.view().items()
    }
    return {"node_id": node_id, "keys": keys}


class LimitSync(PeriodicCall):
    """A slave's exchange loop (a master answers; a standalone node counts alone)."""

    def __init__(self, node: ClusterMember, *, interval: float = LIMITS_SYNC_INTERVAL_SECS) -> None:
        super().__init__(logger, "exchange of key limit counts with the master", interval)
        self.node = node
        self._table: KeyTable | None = None
        self._limited = False

    async def exchange_once(self) -> bool:
        """Report once and take the answer; True when the master answered."""
        node, client = self.node, self.node.client
        if client is None or node.role != "slave":
            return False
        table = current_table()
        if table is not self._table:
            self._table, self._limited = table, has_limits(table)
        if not self._limited:
            return False
        limiter = current_limiter()
        limiter.follow(table)
        report = {"node_id": node.node_id, "keys": counts_to_wire(limiter.report())}
        try:
            status, doc = await client.call_json(
                "POST",
                node.config.cluster.master_url,
                LIMITS_PATH,
                json=report,
                timeout=LIMITS_CALL_TIMEOUT_SECS,
            )
            if status != 200 or not isinstance(doc, dict):
                raise NodeCallError("status", f"master answered {status}", status=status)
            limiter.take_remote(counts_from_wire(doc.get("keys", {})))
        except (NodeCallError, ValueError) as exc:
            self._note(str(exc))
            return False
        self._note("")
        return True

    async def tick(self) -> bool:
        return await self.exchange_once()

    def start(self) -> None:
        # Only a slave reports; a master answers, a standalone node counts alone.
        if self.node.role == "slave":
            super().start()
