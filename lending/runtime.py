"""Lending state of one router process: links in force, enrollment, router queues, settings, costs.

Lives on the router's event loop only (never the django-q2 workers) and is rebuilt on start:
links and settings from the database on a master (or from the master's pushes on a slave),
costs from this node's own analytics, queues empty.

A model that is owner or helper in any link of a lane is *enrolled*: its requests on that lane
go through the lane's router queue, which admits at most `scheduling_backend_depth` of them to
the backend at once and holds the rest. A model with no link never touches any of this, unless
`auth.fair_share` is on: then every model's requests wait in their lane's queue, admitted across
keys by weighted fair share (lending/fairshare.py), each up to its backend's `parallel`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from analytics.costs import NodeCosts
from lending.keys import LENDING_KEYS, canonical_value, fingerprint
from lending.queue import Entry, LaneQueue, State
from lending.settings_store import EffectiveSettings

logger = logging.getLogger(__name__)

LENDING_LANES = ("image", "text")

# Borrowed requests inside a helper's backend at once. The spec's "up to the depth" is a
# ceiling: with one inside, the next waits in the router queue, where the helper's own work
# can still take it back instead of waiting behind it.
BORROWED_BACKEND_DEPTH = 1


def _defaults() -> dict[str, str]:
    return {key.name: key.default for key in LENDING_KEYS}


class Lending:
    def __init__(
        self,
        *,
        node_id: str,
        file_values: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
        fair_share: bool = False,
    ) -> None:
        self.node_id = node_id
        self.fair_share = fair_share
        self.clock = clock
        self.file_values = dict(file_values)
        self.values: dict[str, str] = {**_defaults(), **self.file_values}
        self.settings = EffectiveSettings.from_values(self.values)
        self.fingerprint = fingerprint(self.values)
        self.settings_source = "local"
        self.links: dict[str, list[dict[str, Any]]] = {lane: [] for lane in LENDING_LANES}
        self.enrolled: dict[str, frozenset[str]] = {lane: frozenset() for lane in LENDING_LANES}
        self.owners: dict[str, frozenset[str]] = {lane: frozenset() for lane in LENDING_LANES}
        self.queues: dict[str, LaneQueue] = {}
        self.policies: dict[str, Any] = {}
        self.borrowed_waiting: dict[str, set[asyncio.Future[None]]] = {}
        """Per lane: admitted borrowed requests still waiting for the runtime or a load."""
        self.costs: NodeCosts | None = None
        # The last successful load time per config file, measured in this process.
        self.measured_loads_ms: dict[str, float] = {}
        self.own_idle_since = clock()
        self.own_active = 0
        self.last_completion_ms: dict[tuple[str, str], float] = {}
        self.listeners: list[Callable[[], None]] = []
        self.hold_policy: Callable[[str], Any] | None = None
        """Builds the lane's hold policy (lending/hold.py); set by the node."""
        self.lease_live: Callable[[str, str], bool] | None = None
        """Whether (lane, model) lends under a live lease now; set by the node."""

    # -- links ----------------------------------------------------------------------------

    def set_links(self, snapshot: Mapping[str, Iterable[Mapping[str, Any]]]) -> None:
        """Install a link set; enrollment of this node's models follows at once."""
        for lane in LENDING_LANES:
            links = [dict(link) for link in snapshot.get(lane, [])]
            self.links[lane] = links
            owners = {ln["owner_model_id"] for ln in links if ln["owner_node_id"] == self.node_id}
            helpers = {
                ln["helper_model_id"] for ln in links if ln["helper_node_id"] == self.node_id
            }
            self.owners[lane] = frozenset(owners)
            self.enrolled[lane] = frozenset(owners | helpers)
        for callback in self.listeners:
            callback()

    def is_enrolled(self, lane: str, model_id: str) -> bool:
        enrolled = self.enrolled.get(lane)
        return enrolled is not None and model_id in enrolled

    def is_queued(self, lane: str, model_id: str) -> bool:
        """Whether the model's requests wait in its lane's router queue (linked, or fair share)."""
        return self.fair_share or self.is_enrolled(lane, model_id)

    def is_owner(self, lane: str, model_id: str) -> bool:
        return model_id in self.owners.get(lane, frozenset())

    # -- settings -------------------------------------------------------------------------

    def apply_settings(self, values: Mapping[str, str], *, source: str) -> None:
        """Run exactly these values (a master's push, or this master's own resolution)."""
        merged = _defaults()
        for key, raw in values.items():
            if key not in merged:
                continue  # a newer master may know keys this build does not
            merged[key] = canonical_value(key, str(raw))
        old_depth = self.settings.backend_depth
        self.values = merged
        self.settings = EffectiveSettings.from_values(merged)
        self.fingerprint = fingerprint(merged)
        self.settings_source = source
        for queue in self.queues.values():
            if self.settings.backend_depth != old_depth:
                _wake(queue.set_depth(self.settings.backend_depth))
            # e.g. hold-for-faster-helper switched off: held requests go at once.
            _wake(queue.reevaluate())
        for callback in self.listeners:
            callback()

    # -- queues ---------------------------------------------------------------------------

    def queue(self, lane: str) -> LaneQueue:
        queue = self.queues.get(lane)
        if queue is None:
            policy = self.hold_policy(lane) if self.hold_policy is not None else None
            live = self.lease_live

            def unlendable_first(model_id: str) -> bool:
                return live is not None and live(lane, model_id)

            queue = LaneQueue(
                lane,
                depth=self.settings.backend_depth,
                clock=self.clock,
                hold=policy,
                on_held=policy.on_held if policy is not None else None,
                unlendable_first=unlendable_first,
                borrowed_depth=BORROWED_BACKEND_DEPTH,
                fair=self.fair_share,
            )
            self.queues[lane] = queue
            self.policies[lane] = policy
        return queue

    async def admit(
        self,
        lane: str,
        entry: Entry,
        *,
        requeued: bool = False,
        on_enqueued: Callable[[], None] | None = None,
    ) -> Any:
        """Queue `entry` (unless it is already back in the queue) and wait for its turn.

        Returns None when the lane admits it to the backend; otherwise whatever ended the wait
        instead: the Lease it was lent under (owner side) or RETURNED (a borrowed entry handed
        back because the helper's own work arrived).
        """
        queue = self.queue(lane)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        entry.payload = future
        if not requeued:
            _wake(queue.enqueue(entry))
            if on_enqueued is not None:
                on_enqueued()
        if entry.state is State.ADMITTED:
            return None
        try:
            return await future
        except asyncio.CancelledError:
            # The client went away while waiting (or just as it was admitted): its place, or its
            # slot, goes to the next entry at once.
            if entry.state is not State.LENT:
                _wake(queue.cancel(entry))
            raise

    def release(self, lane: str, entry: Entry) -> None:
        queue = self.queues.get(lane)
        if queue is None:
            return
        policy = self.policies.get(lane)
        if policy is not None:
            policy.forget(entry)
        if entry.state is State.ADMITTED:
            if not entry.borrowed:
                self.last_completion_ms[(lane, entry.model_id)] = self.clock() * 1000.0
            _wake(queue.complete(entry))
        elif entry.state is not State.DONE:
            _wake(queue.cancel(entry))

    def held_requests(self, now: float) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for queue in self.queues.values():
            rows.extend(queue.snapshot(now))
        return rows

    def held_now(self) -> list[dict[str, Any]]:
        return self.held_requests(self.clock())

    def waiting_by_key(self) -> list[dict[str, Any]]:
        """Requests waiting in the router queues (queued or held) per lane, model and key."""
        counts: dict[tuple[str, str, str], int] = {}
        for lane, queue in self.queues.items():
            for entry in queue.pending():
                at = (lane, entry.model_id, entry.tenant)
                counts[at] = counts.get(at, 0) + 1
        return [
            {"lane": lane, "model_id": model, "key": key or None, "waiting": n}
            for (lane, model, key), n in sorted(counts.items())
        ]

    def load_measured(self, config_filename: str, duration_ms: float, *, success: bool) -> None:
        """A load of this node just finished: its time stands in until the costs know it."""
        if success and duration_ms > 0 and config_filename:
            self.measured_loads_ms[config_filename] = duration_ms

    def expected_load_ms(self, config_filename: str) -> float | None:
        """The mean load time of the refitted costs; before they include a config's first
        load (up to a refresh interval, and the analytics flush, later), that load's time.
        Used to be the costs only: a load started soon after the first measured one showed
        no expected time."""
        costs = self.costs
        fitted = None if costs is None else costs.loads.get(config_filename)
        return fitted if fitted is not None else self.measured_loads_ms.get(config_filename)

    def queue_stats(self, lane: str) -> list[dict[str, Any]]:
        """Per enrolled model of this node: pending and backlog counts and work, context."""
        if not self.enrolled.get(lane):
            return []
        queue = self.queue(lane)
        out = []
        for model_id in sorted(self.enrolled.get(lane, frozenset())):
            stats = queue.stats(model_id)
            sized_count, sized_work, sized_context = queue.sized_pending(model_id)
            out.append(
                {
                    "model_id": model_id,
                    "pending_count": stats.pending_count,
                    "pending_work": list(stats.pending_work),
                    "pending_context": stats.pending_context,
                    "backlog_count": stats.backlog_count,
                    "backlog_work": list(stats.backlog_work),
                    "lent_count": stats.lent_count,
                    "lendable_count": stats.lendable_count,
                    "sized_count": sized_count,
                    "sized_work": list(sized_work),
                    "sized_context": sized_context,
                    # What the owner's prompt cache saves of the work above: its own price
                    # leaves it out, a helper's keeps it.
                    "sized_cached": list(queue.sized_cached(model_id)),
                    "backlog_cached": list(stats.backlog_cached),
                }
            )
        return out

    def own_work_running(self) -> bool:
        return self.own_active > 0 or any(queue.own_work() for queue in self.queues.values())

    # -- own-work idle time ------------------------------------------------------------------
    # Idle means idle from the node's own work: its own requests and loads it does for itself.
    # Borrowed work does not count, so a helper that just finished lent work is probed again
    # without waiting out the idle time a second time.

    def own_begin(self) -> None:
        self.own_active += 1

    def own_end(self) -> None:
        self.own_active = max(0, self.own_active - 1)
        if self.own_active == 0:
            self.own_idle_since = self.clock()

    def idle_for_ms(self) -> int:
        if self.own_work_running():
            return 0
        return int((self.clock() - self.own_idle_since) * 1000)

    def accepting_borrowed(self, lane: str) -> bool:
        """Borrowed work is taken only while the node has none of its own."""
        queue = self.queues.get(lane)
        if queue is not None and queue.own_work():
            return False
        return self.own_active == 0

    def live_leases(self) -> list[dict[str, Any]]:
        """Leases in force (the master's lease book); empty until the planner grants any."""
        return []

    def summary(self) -> dict[str, Any]:
        return {
            "settings_fingerprint": self.fingerprint,
            "settings_source": self.settings_source,
            "held_requests": self.held_requests(self.clock()),
        }


RETURNED = "returned"
"""Resolves a borrowed entry's wait when the helper hands it back to its owner."""


def _wake(entries: Iterable[Entry]) -> None:
    for entry in entries:
        future = entry.payload
        if isinstance(future, asyncio.Future) and not future.done():
            future.set_result(None)
