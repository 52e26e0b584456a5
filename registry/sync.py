"""Registration and health: the slave's push loop and the master's poll loop.

Both run as tasks on the router process's event loop rather than as django-q2 jobs: their
results are routing state that lives in this process (a poll that fails must make the node's
models unavailable for the very next request), and django-q2's scheduler only wakes every 30
seconds, too coarse for second-scale health intervals. Each loop is a plain timer; a poll or
registration that fails is logged and retried on the next tick, without backoff, as operators
of the reference expect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from registry.cluster import (
    MINIMUM_PROTOCOL_VERSION,
    SnapshotRejected,
)
from registry.nodeclient import NodeCallError
from registry.ports import RegistryNode

logger = logging.getLogger(__name__)


class RegistrationRefused(Exception):
    """The master refused this node for good (duplicate node or incompatible protocol)."""


def _terminal(status: int, body: Any) -> str | None:
    if status != 409 or not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict) and err.get("type") == "cluster_error":
        code = err.get("code")
        if code in ("duplicate_node", "incompatible_protocol"):
            return f"{code}: {err.get('message', '')}"
    return None


SnapshotHook = Callable[[str, Mapping[str, Any]], None]
"""Called with a slave's node_id and the snapshot a poll took in from it."""


class ClusterSync:
    """Owns the periodic cluster tasks of one router process.

    `on_snapshot` is how the layers above hear of a slave's fresh snapshot (lending and
    guardians push their settings to a slave that runs other ones): the node container hands
    the hooks in, so the registry needs to know nothing about what they push.
    """

    def __init__(self, node: RegistryNode, *, on_snapshot: Sequence[SnapshotHook] = ()) -> None:
        self.node = node
        self.on_snapshot = tuple(on_snapshot)
        self.tasks: set[asyncio.Task[None]] = set()
        self.last_poll_errors: dict[str, str] = {}
        self.registered_at: float | None = None
        """When the master last took this slave's registration (time.time); None until then
        and after a registration fails: what /readyz asks of a slave."""
        self._repolling: set[str] = set()

    # -- slave ------------------------------------------------------------------------------

    async def register_once(self) -> None:
        """Push this node's snapshot to the master; RegistrationRefused if refused for good."""
        node = self.node
        assert node.client is not None
        status, body = await node.client.call_json(
            "POST", node.config.cluster.master_url, "/router/v1/node/register", json=node.snapshot()
        )
        self.registered_at = None
        terminal = _terminal(status, body)
        if terminal:
            raise RegistrationRefused(terminal)
        if not 200 <= status < 300:
            raise NodeCallError("status", f"master answered {status}: {body}", status=status)
        version = body.get("protocol_version", 0) if isinstance(body, dict) else 0
        if not isinstance(version, int) or version < MINIMUM_PROTOCOL_VERSION:
            raise RegistrationRefused(f"incompatible_protocol: master speaks protocol {version!r}")
        self.registered_at = time.time()
        logger.debug("registered with the master")

    async def _slave_loop(self) -> None:
        interval = self.node.config.cluster.sync_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await self.register_once()
            except RegistrationRefused as exc:
                logger.error("the master refused this node: %s; registration stops", exc)
                return
            except (NodeCallError, OSError) as exc:
                logger.warning("registration with the master failed: %s", exc)

    # -- master -----------------------------------------------------------------------------

    async def poll_all(self) -> None:
        """Poll every configured slave concurrently; apply each answer as it arrives.

        Each poll has its own deadline (`cluster.health_timeout`), so one frozen node delays
        neither the other nodes' health nor the round by more than that deadline. A node that
        misses it is suspect: skipped for routing until a poll of it succeeds again.
        """
        urls = self.node.cluster.slave_urls
        if urls:
            limit = asyncio.Semaphore(self.node.config.cluster.sync_concurrency)
            await asyncio.gather(*(self._poll_one(url, limit) for url in urls))
        self.node.cluster.view_ready = True

    async def _poll_one(self, url: str, limit: asyncio.Semaphore | None = None) -> None:
        node = self.node
        assert node.client is not None
        deadline = node.config.cluster.health_timeout
        async with limit or contextlib.nullcontext():
            sent_at = time.monotonic()
            try:
                doc = await node.client.call_ok(
                    "GET", url, "/router/v1/node/models", timeout=deadline
                )
            except NodeCallError as exc:
                # No answer in time, or no connection at all: the node is not there to answer
                # (frozen, killed, unreachable); any other failure is an answer, just a bad one.
                self._failed(url, str(exc), suspect=exc.kind in ("timeout", "transport"))
                return
        self._apply(url, doc, sent_at)

    def _failed(self, url: str, error: str, *, suspect: bool) -> None:
        if self.last_poll_errors.get(url) != error:
            logger.warning("poll of %s failed: %s", url, error)
        self.last_poll_errors[url] = error
        self.node.cluster.mark_unhealthy(url, error, suspect=suspect)

    def _apply(self, url: str, doc: Any, sent_at: float) -> None:
        node = self.node
        self.last_poll_errors.pop(url, None)
        held = node.cluster.node_for_url(url)
        if held is not None and held.accepted_at > sent_at:
            # A snapshot taken in while this poll was out (an enable or disable answered by
            # the node, a push registration) may be newer: never roll it back.
            return
        try:
            remote = node.cluster.apply_poll(url, doc)
        except SnapshotRejected as exc:
            logger.warning("snapshot from %s refused: %s", url, exc.message)
            return
        if isinstance(doc, dict):
            for hook in self.on_snapshot:
                hook(remote.node_id, doc)

    def repoll_soon(self, url: str) -> None:
        """Poll one node now (it was marked suspect between rounds), once at a time per node."""
        if url in self._repolling or url not in self.node.cluster.slave_urls:
            return
        self._repolling.add(url)

        async def run() -> None:
            try:
                await self._poll_one(url)
            finally:
                self._repolling.discard(url)

        self._spawn(run())

    async def _master_loop(self) -> None:
        interval = self.node.config.cluster.health_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await self.poll_all()
            except Exception:
                logger.exception("health poll round failed")

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """First registration or poll round, then the periodic loop. Raises RegistrationRefused."""
        role = self.node.role
        if role == "slave":
            try:
                await self.register_once()
            except (NodeCallError, OSError) as exc:
                logger.warning("first registration with the master failed: %s", exc)
            self._spawn(self._slave_loop())
        elif role == "master":
            self.node.cluster.suspect_listeners.append(self.repoll_soon)
            try:
                await self.poll_all()
            finally:
                # Even a round that failed as a whole is over: requests must not wait on it.
                self.node.cluster.view_ready = True
            self._spawn(self._master_loop())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            self.node.cluster.suspect_listeners.remove(self.repoll_soon)
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass  # what the cancel above asked for
            except Exception:
                logger.exception("a cluster sync task failed as it stopped")
