"""The lending tick: refit this node's costs; on a master, republish links and settings.

Runs every `scheduling_refresh_interval` on the router's event loop (the costs it computes are
published in this process's runtime status, so it cannot live in a django-q2 worker). A
change of the interval resets the timer at once.

What the tick runs for the layers above lending (the guardians' push, the master's replan,
which is built on the whole node) is handed in by the node container, not imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from channels.db import database_sync_to_async

from analytics.costs import fit_key, fit_threshold, node_costs_compute
from analytics.recorder import RequestSample
from lending.ports import LendingNode
from lending.propagate import links_publish, settings_publish
from lending.services import decisions_prune
from routerproject.dbhealth import DATABASE, is_database_error

logger = logging.getLogger(__name__)

PRUNE_EVERY_SECS = 3600.0


TickStep = Callable[[], Awaitable[object]]


class LendingTicker:
    def __init__(
        self,
        node: LendingNode,
        *,
        also_publish: Sequence[TickStep] = (),
        replan: TickStep | None = None,
    ) -> None:
        """`also_publish` runs after lending's own pushes on a master or standalone node (the
        guardians'); `replan` is the master's plan of every lease, run last on a master (a
        ticker given none never replans)."""
        self.node = node
        self.also_publish = tuple(also_publish)
        self.replan = replan
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._interval = node.lending.settings.refresh_interval_secs
        self._pruned_at: float | None = None
        # Rows written since the last refit, per fit a model lacks; and the fits a refit was
        # already asked for since the last tick (one early refit each, so a model whose rows
        # cannot be fitted is not refitted on every row).
        self._fresh: Counter[tuple[str, str]] = Counter()
        self._asked: set[tuple[str, str]] = set()
        self._early: asyncio.Task[None] | None = None
        node.lending.listeners.append(self._settings_changed)

    def _settings_changed(self) -> None:
        interval = self.node.lending.settings.refresh_interval_secs
        if interval != self._interval:
            self._interval = interval
            self._wake.set()

    async def refit(self) -> None:
        settings = self.node.lending.settings
        self._fresh.clear()
        costs = await database_sync_to_async(node_costs_compute)(
            now=datetime.now(UTC),
            window_secs=settings.sample_window_secs,
            min_samples=settings.min_samples,
        )
        self.node.lending.costs = costs

    def rows_written(self, samples: Sequence[RequestSample]) -> None:
        """Refit at once when a model without a fit has just reached the threshold.

        A new pair of nodes has no fit until `scheduling_min_samples` requests have run; the
        tick refits once a minute by default, so a burst would go unpriced (and unlent) for up
        to a minute after the rows were there. The recorder calls this after each flush.
        """
        costs = self.node.lending.costs
        if costs is None:
            return  # the first tick has not fitted yet: it will see these rows
        need = fit_threshold(self.node.lending.settings.min_samples)
        due = False
        for sample in samples:
            key = fit_key(sample)
            if key is None or key in costs.models or key in self._asked:
                continue
            self._fresh[key] += 1
            if costs.samples.get(key, 0) + self._fresh[key] >= need:
                self._asked.add(key)
                due = True
        if due and (self._early is None or self._early.done()):
            self._early = asyncio.ensure_future(self._refit_early())

    async def _refit_early(self) -> None:
        try:
            await self.refit()
        except Exception as exc:
            if not is_database_error(exc):
                logger.exception("early refit failed")
            else:
                DATABASE.failed("early refit", exc)

    async def tick(self) -> None:
        started = time.monotonic()
        self._asked.clear()
        try:
            if self.node.role != "slave":
                await settings_publish(self.node)
                await links_publish(self.node)
                for publish in self.also_publish:
                    await publish()
            await self.refit()
            if self.node.role == "slave":
                await self.prune_if_due(time.monotonic(), int(time.time() * 1000))
            if self.node.role == "master" and self.replan is not None:
                # The fallback for lost events: every lease is replanned on the tick.
                await self.replan()
        except Exception as exc:
            if not is_database_error(exc):
                logger.exception("lending tick failed")
            else:
                # An outage: one line when it starts, not a traceback every tick.
                DATABASE.failed("lending tick", exc)
        else:
            DATABASE.succeeded()
        logger.debug("lending tick took %.1f ms", (time.monotonic() - started) * 1000)

    async def prune_if_due(self, now: float, now_ms: int) -> int:
        """A slave prunes its decision log here, with the retention its master pushed.

        Only this process knows the pushed value; the django-q2 worker would use the slave's
        own config file (lending/tasks.py leaves slaves to this).
        """
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY_SECS:
            return 0
        if self.node.lending.settings_source != "master":
            return 0  # not yet told the master's retention: deleting now could lose rows
        self._pruned_at = now
        retention_ms = int(self.node.lending.settings.decisions_retention_secs * 1000)
        deleted: int = await database_sync_to_async(decisions_prune)(
            now_ms=now_ms, retention_ms=retention_ms
        )
        if deleted:
            logger.info("decision log prune: %d rows deleted", deleted)
        return deleted

    async def start(self) -> None:
        await self.tick()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
                continue  # the interval changed: start a fresh period
            await self.tick()

    async def stop(self) -> None:
        if self._early is not None:
            self._early.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._early
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
