"""Reloading the model that borrowed work displaced ("restore after borrow").

Per runtime: a borrowed request whose link asks for restore and that finds a different config
loaded records that config as the restore target — only the first displacement of a run, so a
chain of borrowed requests restores what was loaded before the run started, not a model in
between. Every borrowed request (re)starts a one-shot timer of `offload_restore_delay`. The
node's own request on that runtime cancels the pending restore instead of competing with it.
When the timer fires with no borrowed work in flight and none of the node's own work running,
the target is loaded (as the node's own work: it resets idle); otherwise it checks again every
delay until the node is quiet. Without the flag nothing is restored.

A guardian answering image requests for a text-only model of this node displaces that model
the same way and always restores it (guardian models, see guardians/routing.py); a guardian
request is the node's own work, so it keeps the node from counting as quiet while it runs.

It also counts borrowed work per runtime, from the moment a borrowed request is admitted to the
runtime until it finishes or is handed back: the Nodes page marks those runtimes, and a
generation-checked unload waits for that count to drain (registry/services.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from registry.kcpps import ModelConfig

if TYPE_CHECKING:
    from lending.ports import LendingRuntime, RequestJob, ServingNode

logger = logging.getLogger(__name__)
events = logging.getLogger("router.lending")


class Restorer:
    def __init__(self, node: ServingNode) -> None:
        self.node = node
        self.targets: dict[int, ModelConfig] = {}
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.borrowed_in_flight = 0
        self.borrowed_by_runtime: dict[int, int] = {}
        # The runtime key of each borrowed job between started and finished. The request
        # path (RequestLending.done) calls borrowed_finished for a job handed back before it
        # was started too; only a job that was counted may uncount, or one runtime's return
        # would hide another's work.
        self._borrowed_jobs: dict[int, int] = {}
        self._drained: dict[int, list[asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def _runtime(self, job: RequestJob) -> LendingRuntime:
        return self.node.runtimes.runtime_for(job.cfg, job.lane)

    def borrowed_started(self, job: RequestJob, restore: bool) -> None:
        self.borrowed_in_flight += 1
        runtime = self._runtime(job)
        key = id(runtime)
        self._borrowed_jobs[id(job)] = key
        self.borrowed_by_runtime[key] = self.borrowed_by_runtime.get(key, 0) + 1
        self._cancel_timer(key)
        current = runtime.current
        displaced = current is not None and current.filename != job.cfg.filename
        if restore and displaced and key not in self.targets:
            assert current is not None
            self.targets[key] = current

    def borrowed_finished(self, job: RequestJob) -> None:
        key = self._borrowed_jobs.pop(id(job), None)
        if key is not None:
            self.borrowed_in_flight = max(0, self.borrowed_in_flight - 1)
            left = self.borrowed_by_runtime.get(key, 0) - 1
            if left > 0:
                self.borrowed_by_runtime[key] = left
            else:
                self.borrowed_by_runtime.pop(key, None)
                for waiter in self._drained.pop(key, []):
                    if not waiter.done():
                        waiter.set_result(None)
        runtime = self._runtime(job)
        if id(runtime) in self.targets:
            self._arm(runtime)

    def borrowed_on(self, runtime: LendingRuntime) -> int:
        """Borrowed requests admitted to `runtime` that are waiting for it or running on it."""
        return self.borrowed_by_runtime.get(id(runtime), 0)

    async def borrowed_drained(self, runtime: LendingRuntime) -> None:
        """Return once no borrowed request is admitted to `runtime`."""
        key = id(runtime)
        while self.borrowed_by_runtime.get(key, 0) > 0:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drained.setdefault(key, []).append(waiter)
            await waiter

    def guardian_started(self, job: RequestJob) -> None:
        runtime = self._runtime(job)
        key = id(runtime)
        self._cancel_timer(key)
        # A load in progress counts: the text-only model may still be loading for the request
        # before this one, and it is the model to bring back.
        current = runtime.current or runtime.loading
        if current is not None and current.filename != job.cfg.filename and key not in self.targets:
            self.targets[key] = current

    def guardian_finished(self, job: RequestJob) -> None:
        runtime = self._runtime(job)
        if id(runtime) in self.targets:
            self._arm(runtime)

    def own_started(self, job: RequestJob) -> None:
        runtime = self._runtime(job)
        key = id(runtime)
        if key in self.targets:
            self.targets.pop(key)
            self._cancel_timer(key)

    def _cancel_timer(self, key: int) -> None:
        timer = self.timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _arm(self, runtime: LendingRuntime) -> None:
        key = id(runtime)
        self._cancel_timer(key)
        delay = self.node.lending.settings.restore_delay_secs
        loop = asyncio.get_running_loop()
        self.timers[key] = loop.call_later(delay, self._fire, runtime)

    def _fire(self, runtime: LendingRuntime) -> None:
        key = id(runtime)
        self.timers.pop(key, None)
        target = self.targets.get(key)
        if target is None:
            return
        lending = self.node.lending
        quiet = (
            self.borrowed_in_flight == 0
            and not lending.own_work_running()
            and self.node.runtimes.active_requests() == 0
            and self.node.runtimes.waiting_requests() == 0
        )
        if not quiet:
            self._arm(runtime)
            return
        self.targets.pop(key, None)
        if runtime.current is not None and runtime.current.filename == target.filename:
            return
        if target.local_id in self.node.disabled:
            return  # disabled since it was displaced: nobody may use it, so keep it unloaded
        task = asyncio.ensure_future(self._restore(runtime, target))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restore(self, runtime: LendingRuntime, target: ModelConfig) -> None:
        lending = self.node.lending
        lending.own_begin()
        try:
            await runtime.load(target, reason="restore")
            events.info(
                "lending restore %s after borrowed or guardian work",
                target.local_id,
                extra={"event": "lending", "decision_kind": "restore", "model_id": target.local_id},
            )
        except Exception as exc:
            logger.warning("restoring %s failed: %s", target.local_id, exc)
        finally:
            lending.own_end()

    def close(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        for task in self._tasks:
            task.cancel()
