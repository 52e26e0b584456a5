"""Backend runtimes: the processes a node runs, which model each holds, and switching between them.

A node has one text-side and one image-side runtime (plus a whisper runtime in split mode). A
request asks its runtime for a config with `acquire()`. If that config is loaded and nobody is
waiting for another, it goes straight through. Otherwise it joins a FIFO of waiters: the runtime
lets the requests already running on the current model finish, stops that process, starts the
new one, waits for readiness, and then admits every waiter at the head that wanted it. Waiters
for a model being loaded therefore wait for the load instead of failing, and a stream of
requests for the loaded model cannot starve a request for another one.

This state belongs to the router process's event loop only (never the django-q2 workers); it
is rebuilt empty on restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from analytics.recorder import LoadEvent
from proxy.runtimes.backends import Launch, LaunchError, auth_headers, build_launch, runtime_lane
from proxy.runtimes.logfiles import rotate_if_large
from proxy.runtimes.readiness import is_ready, probe_path, reported_vision
from registry.httpclient import get_session
from registry.kcpps import Lane, ModelConfig
from registry.tlsclient import ca_ssl_context
from routerproject.config import RouterConfig
from routerproject.errors import BackendError, RouterError

logger = logging.getLogger(__name__)

READY_POLL_SECS = 0.02
PROBE_TIMEOUT_SECS = 2.0
BACKEND_EXIT_WAIT_SECS = 1.0
LANE_PROBE_EVERY_SECS = 1.0
"""How often a loaded backend's readiness probe is repeated, so routing can skip a hung one."""
STOP_GRACE_SECS = 5.0
LOG_TAIL_BYTES = 2000
PR_SET_PDEATHSIG = 1
# Backends start in the project directory so `python -m proxy.sim` resolves.
REPO_DIR = str(Path(__file__).resolve().parents[2])


LoadListener = Callable[[LoadEvent], None]


def _set_pdeathsig() -> None:
    # If the router dies without cleaning up (SIGKILL), the kernel still stops its backends.
    # Runs in the forked child before exec, where logging could wait forever on a lock another
    # thread held at the fork: a libc without prctl just starts the backend without the guard.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class _Waiter:
    cfg: ModelConfig
    future: asyncio.Future[None]
    reason: str


@dataclass(eq=False)
class SessionHold:
    """A `/v1/realtime` session holding its lane's runtime, as the Nodes page shows it."""

    model: str
    started_at: float
    """Unix time the session took the lane."""
    last_frame: Callable[[], float]
    """The monotonic time of the session's last frame either way."""

    def view(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "since": self.started_at,
            "idle_secs": round(max(0.0, time.monotonic() - self.last_frame()), 1),
        }


class Runtime:
    """One backend slot of the node (text, image or whisper side)."""

    def __init__(
        self,
        lane: Lane,
        *,
        config: RouterConfig,
        log_dir: Path,
        on_load: LoadListener,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lane = lane
        self.on_models: Callable[[ModelConfig, bytes], None] | None = None
        """Told what an upstream server's readiness answer lists (its models' modalities)."""
        self._config = config
        self._log_dir = log_dir
        self._on_load = on_load
        self._clock = clock
        self.current: ModelConfig | None = None
        self.launch: Launch | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.state = "empty"  # empty | loading | ready | failed | stopped
        self.active = 0
        self.loading: ModelConfig | None = None
        self.loading_since = 0.0
        """When the load under way began (the runtime's clock); 0 when none is."""
        self.last_error = ""
        self.last_error_at = 0.0
        """Unix time of `last_error` (0: none): the Nodes page says how long ago a load failed."""
        self.generation = 0
        self.last_done = 0.0
        """When the backend last finished a request (monotonic): where the next one started."""
        self._waiters: deque[_Waiter] = deque()
        self._switch_task: asyncio.Task[None] | None = None
        self._exit_task: asyncio.Task[None] | None = None
        self._closed = False
        self._idle_waiters: list[asyncio.Future[None]] = []
        self.probe_ok = True
        """The last readiness probe of the loaded backend succeeded (reference-cluster §3.3)."""
        self._probe_task: asyncio.Task[None] | None = None
        self.sessions: list[SessionHold] = []
        """The `/v1/realtime` sessions holding a use of the loaded model."""

    # -- admission --------------------------------------------------------------------------

    def _alive(self) -> bool:
        return self.process is None or self.process.returncode is None

    def _serves(self, cfg: ModelConfig) -> bool:
        cur = self.current
        return (
            self.state == "ready"
            and cur is not None
            and cur.filename == cfg.filename
            and cur.config_hash == cfg.config_hash
            and self._alive()
        )

    async def acquire(self, cfg: ModelConfig, *, reason: str = "own") -> Launch:
        """Wait until `cfg` is loaded here and hold one use of it; pair with `release()`."""
        if self._closed:
            raise BackendError("the router is shutting down")
        if not self._waiters and self._serves(cfg):
            self.active += 1
            assert self.launch is not None
            return self.launch
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(cfg, future, reason))
        self._pump()
        try:
            if self.sessions and not future.done():
                await self._wait_past_sessions(future)
            await future
        except asyncio.CancelledError:
            # A client that went away while waiting gives its place back; if the slot had just
            # been granted, the use is returned too so the next waiter can go.
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release()
            else:
                future.cancel()
                self._pump()
            raise
        assert self.launch is not None
        return self.launch

    async def _wait_past_sessions(self, future: asyncio.Future[None]) -> None:
        """Wait for the lane a realtime session holds, but only `cluster.control_timeout`: a
        session may live for hours, and a request must not wait for it without end."""
        limit = self._config.cluster.control_timeout
        done, _ = await asyncio.wait({future}, timeout=limit)
        if done or not self.sessions:
            # Granted, or the sessions ended and the switch is under way: wait it out.
            return
        future.cancel()
        self._pump()
        held = ", ".join(sorted({hold.model for hold in self.sessions}))
        raise RouterError(
            503,
            f"the {self.lane} lane is held by a realtime session of {held}; "
            f"nothing else can load there until it ends",
            type="server_error",
            code="lane_held_by_session",
            retry_after=max(1, round(limit)),
        )

    def lane_ready(self, cfg: ModelConfig) -> bool:
        """Whether a request for `cfg` may be routed here rather than to a remote replica.

        Yes when it would queue behind a load anyway (nothing ready loaded, a switch under
        way, waiters ahead, or another backend family); otherwise the loaded backend's last
        readiness probe decides, so a hung backend stops drawing requests.
        """
        cur = self.current
        if self.state != "ready" or cur is None or self.waiting():
            return True
        if cur.backend_mode != cfg.backend_mode:
            return True
        return self.probe_ok

    async def died(self, launch: Launch) -> bool:
        """Whether the process serving `launch` has exited (waiting briefly for its exit).

        A backend killed under a request resets its connections a moment before the exit is
        seen; a backend that merely closed one connection keeps running and is not "dead".
        """
        process = self.process
        if launch is not self.launch or process is None:
            return False
        try:
            await asyncio.wait_for(process.wait(), BACKEND_EXIT_WAIT_SECS)
        except TimeoutError:
            return False
        return True

    def backend_lost(self, launch: Launch, reason: str) -> None:
        """A request found the backend gone (connection refused): reload it for the next one.

        The process watcher may not have seen the exit yet; without this the runtime would
        hand the dead backend to every request until it does.
        """
        if launch is self.launch and self.state == "ready":
            self.state = "failed"
            self.last_error = f"backend stopped accepting connections: {reason}"
            self.last_error_at = time.time()
            logger.warning("%s backend for %s is gone: %s", self.lane, self.current, reason)
            self._stop_probing()

    def release(self) -> None:
        self.active -= 1
        if self.active <= 0:
            self.active = 0
            self._pump()
            self._notify_idle()

    def is_idle(self) -> bool:
        return (
            self.active == 0 and self.state not in ("loading", "stopping") and self.waiting() == 0
        )

    def _notify_idle(self) -> None:
        if self._idle_waiters and self.is_idle():
            waiters, self._idle_waiters = self._idle_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def wait_idle(self) -> None:
        """Return once nothing runs, loads or waits on this runtime."""
        while not self.is_idle():
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(fut)
            await fut

    def _pump(self) -> None:
        while self._waiters:
            head = self._waiters[0]
            if head.future.done():
                self._waiters.popleft()
                continue
            if self._serves(head.cfg):
                self._waiters.popleft()
                self.active += 1
                head.future.set_result(None)
                continue
            if self.state in ("loading", "stopping") or self.active > 0 or self._closed:
                return
            # Marked loading here, not when the task first runs: another waiter's pump in the
            # same loop iteration must see the switch under way, or it would start a second one.
            self.state = "loading"
            self.loading = head.cfg
            self.loading_since = self._clock()
            self._switch_task = asyncio.ensure_future(self._switch(head.cfg, head.reason))
            return

    def _fail_waiters_for(self, cfg: ModelConfig, error: BackendError) -> None:
        keep: deque[_Waiter] = deque()
        for waiter in self._waiters:
            if waiter.future.done():
                continue
            if waiter.cfg.filename == cfg.filename:
                waiter.future.set_exception(error)
            else:
                keep.append(waiter)
        self._waiters = keep

    # -- loading ----------------------------------------------------------------------------

    async def _switch(self, cfg: ModelConfig, reason: str) -> None:
        self.state = "loading"
        self.loading = cfg
        started = self._clock()
        self.loading_since = started
        error = ""
        started_process = False
        try:
            started_process = await self._launch(cfg)
        except BackendError as exc:
            error = str(exc)
        except Exception as exc:  # the loop must survive any launch failure
            logger.exception("loading %s on the %s runtime failed", cfg.local_id, self.lane)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self.loading = None
        duration_ms = (self._clock() - started) * 1000.0
        if error:
            await self._load_failed(cfg, error, duration_ms)
        else:
            logger.info(
                "loaded %s on the %s runtime in %.0f ms", cfg.local_id, self.lane, duration_ms
            )
        if not started_process and not error:
            # Nothing was loaded (an already-running server): no load cost to learn from.
            self._pump()
            self._notify_idle()
            return
        self._on_load(
            LoadEvent(
                lane=self.lane,
                model_id=cfg.local_id,
                config_filename=cfg.filename,
                duration_ms=duration_ms,
                success=not error,
                reason=reason,
                error=error,
                finished_at=time.time(),
            )
        )
        self._pump()
        self._notify_idle()

    async def _launch(self, cfg: ModelConfig) -> bool:
        """Stop the running model and start `cfg` until it is ready; True when this runtime
        started a process for it (an upstream server is only waited for)."""
        if cfg.unresolved_fields:
            # Checked before the running model is stopped: nothing could start.
            raise BackendError(
                f"model {cfg.local_id!r} has unresolved portable weights: "
                + ", ".join(cfg.unresolved_fields)
            )
        await self._stop_process()
        self.current = None
        port = free_port(self._config.backend.host)
        try:
            launch = build_launch(cfg, self.lane, config=self._config, port=port)
        except LaunchError as exc:
            raise BackendError(str(exc)) from exc
        if cfg.missing_files and launch.argv is not None:
            raise BackendError(
                f"model {cfg.local_id!r} references missing files: " + ", ".join(cfg.missing_files)
            )
        if launch.argv is not None:
            await self._start_process(launch)
        await self._wait_ready(launch, cfg)
        self.launch = launch
        self.current = cfg
        self.generation += 1
        self.state = "ready"
        self.last_error = ""
        self.probe_ok = True
        self._probe_task = asyncio.ensure_future(self._probe_loop(launch))
        return launch.argv is not None

    async def _load_failed(self, cfg: ModelConfig, error: str, duration_ms: float) -> None:
        await self._stop_process()
        self.state = "failed"
        self.current = None
        self.last_error = error
        self.last_error_at = time.time()
        logger.warning("load of %s failed after %.0f ms: %s", cfg.local_id, duration_ms, error)
        self._fail_waiters_for(cfg, BackendError(error))

    async def _start_process(self, launch: Launch) -> None:
        assert launch.argv is not None
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_path()
        limits = self._config.logging
        rotate_if_large(log_path, limits.backend_log_max_bytes, limits.backend_log_backups)
        # A local append-only log: opening it takes microseconds, not worth a thread hop.
        with open(log_path, "ab") as log:  # noqa: ASYNC230
            log.write(
                f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(launch.argv)}\n".encode()
            )
            log.flush()
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *launch.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=_set_pdeathsig,
                    cwd=REPO_DIR,
                )
            except OSError as exc:
                raise BackendError(f"cannot start {launch.argv[0]}: {exc.strerror or exc}") from exc
        self._exit_task = asyncio.ensure_future(self._watch_exit(self.process))

    def _log_path(self) -> Path:
        return self._log_dir / f"{self.lane}-backend.log"

    def _log_tail(self) -> str:
        # Called only after a failed load, when a few milliseconds of file I/O do not matter.
        try:
            with open(self._log_path(), "rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - LOG_TAIL_BYTES))
                tail = log.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(tail[-3:])

    async def _watch_exit(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if process is self.process and self.state == "ready":
            # Nothing restarts it now: the next request that needs it reloads it.
            self.state = "failed"
            self.last_error = f"backend exited with code {code}"
            self.last_error_at = time.time()
            # The config's name and file say which model died; its whole JSON would bury that.
            cur = self.current
            logger.warning(
                "%s backend for %s (%s) exited with code %s",
                self.lane,
                cur.local_id if cur else "?",
                cur.path if cur else "?",
                code,
            )
            self._pump()

    async def _wait_ready(self, launch: Launch, cfg: ModelConfig) -> None:
        deadline = self._clock() + self._config.backend.load_timeout
        session = get_session()
        url = launch.base_url + probe_path(launch.probe)
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECS)
        headers = auth_headers(cfg)
        while True:
            if self.process is not None and self.process.returncode is not None:
                tail = self._log_tail()
                raise BackendError(
                    f"backend for {cfg.local_id!r} exited with code {self.process.returncode}"
                    + (f": {tail}" if tail else "")
                )
            try:
                async with session.get(
                    url, timeout=timeout, headers=headers, ssl=launch.tls
                ) as resp:
                    body = await resp.read()
                    if is_ready(launch.probe, resp.status, body, flag=launch.flag):
                        if self.on_models is not None and launch.probe == "models":
                            self.on_models(cfg, body)
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            if self._clock() >= deadline:
                raise BackendError(
                    f"backend for {cfg.local_id!r} was not ready within "
                    f"{self._config.backend.load_timeout:g}s"
                )
            await asyncio.sleep(READY_POLL_SECS)

    async def _probe_loop(self, launch: Launch) -> None:
        session = get_session()
        url = launch.base_url + probe_path(launch.probe)
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECS)
        while launch is self.launch and self.state == "ready":
            # A timer, not a wait for a condition: the probe repeats for as long as it is loaded.
            await asyncio.sleep(LANE_PROBE_EVERY_SECS)
            try:
                async with session.get(url, timeout=timeout, ssl=launch.tls) as resp:
                    ok = is_ready(launch.probe, resp.status, await resp.read(), flag=launch.flag)
            except (TimeoutError, aiohttp.ClientError, OSError):
                ok = False
            if launch is not self.launch:
                return
            if ok != self.probe_ok:
                logger.warning(
                    "%s backend for %s %s its readiness probe",
                    self.lane,
                    self.current.local_id if self.current else "?",
                    "passes" if ok else "fails",
                )
            self.probe_ok = ok

    def _stop_probing(self) -> None:
        task, self._probe_task = self._probe_task, None
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    async def _stop_process(self) -> None:
        self._stop_probing()
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_SECS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    # -- explicit control -------------------------------------------------------------------

    async def load(self, cfg: ModelConfig, *, reason: str = "explicit") -> None:
        await self.acquire(cfg, reason=reason)
        self.release()

    async def unload(self) -> bool:
        """Stop the backend once its running requests finish. False if nothing was loaded."""
        if self.current is None and self.process is None:
            return False
        # Requests hold the runtime for as long as a generation takes; unloading waits for them
        # rather than cutting answers off.
        await self.wait_idle()
        # Not "ready" while the process stops, so a request arriving now waits for a fresh
        # load instead of being handed a backend that is going away.
        self.state = "stopping"
        await self._stop_process()
        self.current = None
        self.launch = None
        self.state = "empty"
        self._pump()
        return True

    async def close(self) -> None:
        self._closed = True
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(BackendError("the router is shutting down"))
        self._waiters.clear()
        if self._switch_task is not None and not self._switch_task.done():
            self._switch_task.cancel()
            try:
                await self._switch_task
            except asyncio.CancelledError:
                pass  # what the cancel above asked for
            except Exception:
                logger.exception("the %s runtime's model switch failed as it closed", self.lane)
        await self._stop_process()
        self.state = "stopped"

    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())

    def status(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "state": self.state,
            "model_id": self.current.local_id if self.current else None,
            "config_filename": self.current.filename if self.current else None,
            "loading": self.loading.local_id if self.loading else None,
            "family": self.launch.family if self.launch else None,
            "active": self.active,
            "waiting": self.waiting(),
            "generation": self.generation,
            "pid": self.process.pid if self.process else None,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at if self.last_error else None,
            "probe_ok": self.probe_ok,
            "realtime_sessions": [hold.view() for hold in self.sessions],
            **self._loading_status(),
        }

    def _loading_status(self) -> dict[str, Any]:
        """The load under way, for the Nodes page: what, for how long, and who waits on it."""
        cfg = self.loading
        if cfg is None:
            return {"loading_config": None, "loading_elapsed_ms": None, "loading_waiting": 0}
        waiting = sum(
            1 for w in self._waiters if not w.future.done() and w.cfg.filename == cfg.filename
        )
        return {
            "loading_config": cfg.filename,
            "loading_elapsed_ms": max(0.0, (self._clock() - self.loading_since) * 1000.0),
            "loading_waiting": waiting,
        }


class RuntimeManager:
    """Every runtime of this node; the one place that maps (config, lane) to a runtime."""

    def __init__(
        self,
        *,
        config: RouterConfig,
        log_dir: Path,
        on_load: LoadListener,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.runtimes: dict[Lane, Runtime] = {
            lane: Runtime(lane, config=config, log_dir=log_dir, on_load=on_load, clock=clock)
            for lane in ("text", "image", "whisper")
        }
        self._upstreams: dict[str, Runtime] = {}
        self._on_load = on_load
        self._log_dir = log_dir
        self._clock = clock
        self.reported_vision: dict[str, bool] = {}
        """Upstream configs (by file name) whose server says whether the model reads images."""
        self.on_capabilities: Callable[[], None] | None = None
        """Called when what a server reports changes a model's capabilities (rebuild records)."""

    def note_models(self, cfg: ModelConfig, body: bytes) -> None:
        """Learn from an upstream's `/v1/models` whether its model reads images."""
        vision = reported_vision(body, cfg.served_model)
        if vision is None or self.reported_vision.get(cfg.filename) == vision:
            return
        self.reported_vision[cfg.filename] = vision
        logger.info("upstream %s reports vision=%s for %s", cfg.local_id, vision, cfg.served_model)
        if self.on_capabilities is not None:
            self.on_capabilities()

    async def discover_upstreams(self, configs: list[ModelConfig]) -> None:
        """Ask each upstream server once, at start, what its model reads; an upstream that
        does not answer yet is asked again by its first request's readiness check."""
        session = get_session()
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECS)

        async def ask(cfg: ModelConfig) -> None:
            assert cfg.upstream_url is not None
            url = cfg.upstream_url.rstrip("/") + probe_path("models")
            try:
                async with session.get(
                    url,
                    timeout=timeout,
                    headers=auth_headers(cfg),
                    ssl=ca_ssl_context(cfg.upstream_tls_ca_file),
                ) as resp:
                    if 200 <= resp.status < 300:
                        self.note_models(cfg, await resp.read())
            except (TimeoutError, aiohttp.ClientError):
                return

        upstreams = [c for c in configs if c.backend_mode == "upstream" and c.upstream_url]
        await asyncio.gather(*(ask(c) for c in upstreams))

    def runtime_for(self, cfg: ModelConfig, lane: Lane) -> Runtime:
        if cfg.backend_mode == "upstream":
            # An upstream server is already running and serves concurrently: it gets a runtime
            # of its own so it never evicts, or waits behind, the node's local processes.
            runtime = self._upstreams.get(cfg.filename)
            if runtime is None:
                runtime = Runtime(
                    "text",
                    config=self.config,
                    log_dir=self._log_dir,
                    on_load=self._on_load,
                    clock=self._clock,
                )
                runtime.on_models = self.note_models
                self._upstreams[cfg.filename] = runtime
            return runtime
        return self.runtimes[runtime_lane(cfg, lane)]

    def all(self) -> list[Runtime]:
        return [*self.runtimes.values(), *self._upstreams.values()]

    def loaded(self) -> list[tuple[Runtime, ModelConfig]]:
        return [(r, r.current) for r in self.all() if r.current is not None]

    def is_loaded(self, cfg: ModelConfig) -> bool:
        return any(c.filename == cfg.filename for _, c in self.loaded())

    def active_requests(self) -> int:
        return sum(r.active for r in self.all())

    def waiting_requests(self) -> int:
        return sum(r.waiting() for r in self.all())

    async def wait_idle(self) -> None:
        await asyncio.gather(*(r.wait_idle() for r in self.all()))

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.all()), return_exceptions=True)
