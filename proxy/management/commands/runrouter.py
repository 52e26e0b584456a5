"""Run this node: migrate, serve the ASGI app, and run the django-q2 workers.

Scope: one router process (this one: the HTTP server of proxy/edge/server.py on
`server.bind`, the inference proxy, runtimes and their backend children) plus one django-q2
worker cluster as a child process. Backends start lazily. SIGTERM or SIGINT stops accepting
connections, lets requests in flight finish (up to `server.shutdown_grace`), stops every
backend and the workers, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

logger = logging.getLogger("router")

WORKER_STOP_SECS = 5.0
WORKER_RESTART_DELAY_SECS = 1.0
# How long the forwards cut at the end of the grace get to write their error and end.
CUT_SETTLE_SECS = 2.0


def _persist_assignments(assignments: Any) -> None:
    # Public-ID suffixes must survive restarts; the write happens off the event loop.
    from channels.db import database_sync_to_async

    from registry.services import public_ids_save

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        public_ids_save(assignments=dict(assignments))
        return
    task = loop.create_task(database_sync_to_async(public_ids_save)(assignments=dict(assignments)))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


_PENDING: set[asyncio.Task[None]] = set()


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--config", help="Node config file (YAML).")
        parser.add_argument(
            "--no-workers", action="store_true", help="Do not start the django-q2 workers."
        )
        parser.add_argument(
            "--no-migrate",
            action="store_true",
            help="Skip `migrate`: the database is known to carry every migration already.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from django.db import connection

        from routerproject.dbhealth import database_name, is_database_error, one_line

        config = settings.ROUTER
        try:
            connection.ensure_connection()
            if not options["no_migrate"]:
                call_command("migrate", interactive=False, verbosity=0)
            call_command("setup_schedules", stdout=io.StringIO())
        except Exception as exc:
            if not is_database_error(exc):
                raise
            # One line an operator can act on, not a driver's traceback; an orchestrator
            # restarts the node, and the database may be up by then.
            self.stderr.write(f"router not started: {database_name()}: {one_line(exc)}")
            sys.exit(1)
        runner = NodeRunner(config=config, workers=not options["no_workers"])
        code = runner.run()
        if code:
            sys.exit(code)


class NodeRunner:
    def __init__(self, *, config: Any, workers: bool) -> None:
        self.config = config
        self.want_workers = workers
        self.exit_code = 0
        self.workers: asyncio.subprocess.Process | None = None
        self.stopping = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.ticker: Any = None
        self.keys: Any = None
        self.limit_sync: Any = None
        self.rotating: asyncio.Task[None] | None = None
        self.tls: Any = None

    def run(self) -> int:
        from proxy.edge.caps import FrontDoor, raise_fd_limit
        from proxy.edge.tls import ServerTLS
        from routerproject.gctune import tune_gc

        # The loop exists before the node is built (manage.py made uvloop's the policy), and
        # the node is built outside it: building reads the database, which Django allows only
        # off a running loop.
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self._build_node()
        self.tls = ServerTLS.from_config(self.config.server)
        before, after = raise_fd_limit()
        if after != before:
            logger.info("open-file limit raised from %d to %d", before, after)
        self.door = FrontDoor(self.config, fd_limit=after)
        logger.info(
            "connection cap %d (the last %d for health checks and node routes)",
            self.door.max_connections,
            self.door.reserve,
        )
        tune_gc()
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            self.loop.close()
        return self.exit_code

    async def _serve(self) -> None:
        from proxy.edge.server import HttpServer
        from routerproject.asgi import application

        self.finished = asyncio.Event()
        self.server = HttpServer(application, self.door, self.tls)
        server = self.config.server
        try:
            await self.server.listen(server.host, server.port)
        except OSError as exc:
            self.cannot_listen(exc)
            return
        self._install_signals()
        # The loop holds tasks weakly: keep a reference or startup can vanish mid-await.
        self.tasks.add(asyncio.ensure_future(self.startup()))
        await self.finished.wait()

    def _build_node(self) -> None:
        """The node, with its persisted public IDs and disabled models, and its cluster sync."""
        from proxy.node import build_node, catch_up_if_stale, set_node
        from registry.selectors import disabled_models, public_id_assignments
        from registry.sync import ClusterSync

        self.node = build_node(
            self.config,
            assignments=public_id_assignments(),
            on_assignments=_persist_assignments,
            disabled=disabled_models(),
        )
        set_node(self.node)
        node = self.node
        from proxy.edge.benchmark import Benchmarks

        node.benchmarks = Benchmarks(node)

        def snapshot_seen(node_id: str, snapshot: Mapping[str, Any]) -> None:
            catch_up_if_stale(node, node_id, snapshot)

        self.sync = ClusterSync(self.node, on_snapshot=[snapshot_seen])
        node.sync = self.sync

    def cannot_listen(self, exc: OSError) -> None:
        print(
            f"router: cannot listen on {self.config.server.bind}: {exc.strerror or exc}",
            file=sys.stderr,
            flush=True,
        )
        self.exit_code = 1

    def _install_signals(self) -> None:
        loop = self.loop
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: self.tasks.add(loop.create_task(self.shutdown())))
        if self.tls is not None:
            # A renewed certificate: new connections get it, open ones keep theirs.
            loop.add_signal_handler(signal.SIGHUP, self.tls.reload)

    async def startup(self) -> None:
        try:
            await self._startup()
        except Exception as exc:
            logger.exception("router startup failed")
            print(f"router: startup failed: {exc}", file=sys.stderr, flush=True)
            self.exit_code = 1
            await self.shutdown()

    async def _startup(self) -> None:
        node = self.node
        await self._start_background()
        from guardians.services import guardians_publish
        from lending.master import get_master
        from lending.ticker import LendingTicker
        from registry.sync import RegistrationRefused

        node.decisions.start()
        await self._start_keys()
        try:
            await self.sync.start()
        except RegistrationRefused as exc:
            print(f"router: the master refused this node: {exc}", file=sys.stderr, flush=True)
            self.exit_code = 1
            await self.shutdown()
            return
        self.ticker = LendingTicker(
            node,
            also_publish=[lambda: guardians_publish(node)],
            replan=lambda: get_master(node).plan("tick"),
        )
        node.recorder.written.append(self.ticker.rows_written)
        await self.ticker.start()
        if not await self._load_startup_model():
            self.exit_code = 1
            await self.shutdown()
            return
        for err in node.catalog.errors:
            print(f"router: skipped model config {err}", file=sys.stderr, flush=True)
        cfg = self.config
        node.ready = True
        scheme = "https" if self.tls is not None else "http"
        print(
            f"router ready: {scheme}://{cfg.server.bind} node={cfg.cluster.node_id} "
            f"role={cfg.cluster.role} models={len(node.catalog.configs)} pid={os.getpid()}",
            file=sys.stderr,
            flush=True,
        )

    async def _start_keys(self) -> None:
        """The stored-key table before the first registration: a master builds it from its
        database (so the slaves that register get it), a slave takes the one it kept and asks
        its master once (so it does not serve keyless for a sync interval); then the loop
        that keeps it."""
        from registry.keysync import KeySync, keys_restore

        self.keys = KeySync(self.node)
        try:
            if self.node.role == "slave":
                await keys_restore(self.node)
                await self.keys.pull_once()
            else:
                await self.keys.watch_once()
        except Exception:
            # The loop retries; a node without its table yet still starts.
            logger.exception("loading the stored-key table failed")
        self.keys.start()
        from registry.limitsync import LimitSync

        # Per-key limit counts, exchanged with the master (a slave's loop only).
        self.limit_sync = LimitSync(self.node)
        self.limit_sync.start()

    async def _start_background(self) -> None:
        """The analytics recorder, the upstream discovery, the workers and log rotation."""
        node = self.node
        node.recorder.start()
        # What each upstream server says its model reads (images or not) is asked once now,
        # beside the rest of the start, so image requests go to a model that reads them.
        discovery = asyncio.ensure_future(
            node.runtimes.discover_upstreams(list(node.catalog.configs.values()))
        )
        self.tasks.add(discovery)
        discovery.add_done_callback(self.tasks.discard)
        if self.want_workers:
            await self._start_workers()
        from proxy.runtimes.logfiles import keep_rotating

        limits = self.config.logging
        log_dir = Path(self.config.cluster.store_dir) / "logs"
        self.rotating = asyncio.ensure_future(
            keep_rotating(log_dir, limits.backend_log_max_bytes, limits.backend_log_backups)
        )

    async def _load_startup_model(self) -> bool:
        """Load `models.startup_model` unless it is disabled here; False when it failed."""
        from registry import services

        node = self.node
        startup_model = self.config.models.startup_model
        if startup_model and startup_model in node.disabled:
            # Disabled from the Nodes page or the API: a restart must not turn that into a
            # node that cannot start.
            print(
                f"router: startup model {startup_model!r} is disabled on this node; not loaded",
                file=sys.stderr,
                flush=True,
            )
            startup_model = ""
        if startup_model:
            try:
                await services.model_load_local(node=node, model_id=startup_model)
            except Exception as exc:
                print(
                    f"router: startup model {startup_model!r} failed to load: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
                return False
        return True

    async def _start_workers(self) -> None:
        await self._spawn_workers()
        task = asyncio.ensure_future(self._supervise_workers())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _supervise_workers(self) -> None:
        """Restart the django-q2 cluster whenever it exits while the node runs."""
        while True:
            workers = self.workers
            if workers is None:
                return
            code = await workers.wait()
            if self.stopping or self.workers is not workers:
                return
            # Its workers may outlive it: they are in its process group, which goes with it.
            _kill_group(workers.pid, signal.SIGKILL)
            print(
                f"router: the django-q2 workers exited with code {code}; restarting them",
                file=sys.stderr,
                flush=True,
            )
            # A pause between restarts, so a cluster that dies at once does not spin the loop.
            await asyncio.sleep(WORKER_RESTART_DELAY_SECS)
            if self.stopping:
                return
            try:
                await self._spawn_workers()
            except OSError as exc:
                logger.error("cannot restart the django-q2 workers: %s", exc)
                return

    async def _spawn_workers(self) -> None:
        from proxy.runtimes.runtime import _set_pdeathsig

        log_dir = Path(self.config.cluster.store_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.config.source_path is not None:
            env["ROUTER_CONFIG"] = str(self.config.source_path)
        manage = Path(settings.BASE_DIR) / "manage.py"
        with open(log_dir / "workers.log", "ab") as log:  # noqa: ASYNC230  (once, at startup)
            self.workers = await asyncio.create_subprocess_exec(
                sys.executable,
                str(manage),
                "qcluster",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
                preexec_fn=_set_pdeathsig,
            )

    async def shutdown(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        from registry.httpclient import close_session

        self.server.stop_listening()
        node = self.node
        if node.benchmarks is not None:
            await node.benchmarks.stop()
        await self.sync.stop()
        if self.keys is not None:
            await self.keys.stop()
        if self.limit_sync is not None:
            await self.limit_sync.stop()
        if self.ticker is not None:
            await self.ticker.stop()
        # Requests in flight get their answers; past the grace period they are cut off and
        # every waiter still queued is answered with an error by close(). Requests forwarded
        # to other nodes or relayed for them hold no runtime here: they are waited for too.
        drained = asyncio.gather(node.runtimes.wait_idle(), node.requests.wait_idle())
        try:
            await asyncio.wait_for(drained, self.config.server.shutdown_grace)
        except TimeoutError:
            logger.warning(
                "shutdown grace of %gs over: %d request(s) still in flight are cut off",
                self.config.server.shutdown_grace,
                node.requests.count,
            )
            await _cut_forwards(node)
        await node.runtimes.close()
        await node.recorder.stop()
        await node.decisions.stop()
        await self._stop_workers()
        if self.rotating is not None:
            self.rotating.cancel()
        await close_session()
        if node.client is not None:
            await node.client.aclose()
        await self.server.close()
        print("router stopped", file=sys.stderr, flush=True)
        self.finished.set()

    async def _stop_workers(self) -> None:
        workers, self.workers = self.workers, None
        if workers is None:
            return
        if workers.returncode is None:
            _kill_group(workers.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(workers.wait(), WORKER_STOP_SECS)
            except TimeoutError:
                _kill_group(workers.pid, signal.SIGKILL)
                await workers.wait()
        # The cluster's own process can exit before the workers it forked: whatever is left
        # of its process group must not outlive the node.
        _kill_group(workers.pid, signal.SIGKILL)


async def _cut_forwards(node: Any) -> None:
    """End the requests forwarded to other nodes with an error, as a standalone node's streams
    end when its backends stop: closing the sessions under them would cut their connections
    with no word to the client."""
    if node.forwards.cut_all("the router is shutting down (server.shutdown_grace is over)"):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(node.requests.wait_idle(), CUT_SETTLE_SECS)


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
