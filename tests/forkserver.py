"""Start test nodes by forking a process that has already imported their libraries.

A node's start costs about 2.3 s of CPU on this kind of machine, 1.8 s of it importing Django,
DRF, uvicorn, aiohttp, httpx, pandas and numpy; the suite starts a few hundred nodes
on two cores, so those imports alone were a third of its CPU time. This module runs one small
server per test process (`python -m tests.forkserver`) that imports those libraries once (none
of them reads the router's settings at import) and, on request, forks a child that becomes
`manage.py runrouter` exactly as `python manage.py ...` would run it: its own session, the
requested environment, working directory, `sys.argv` and standard output, `manage.py` run as
`__main__`, the interpreter's normal exit. The child is a real process; only the interpreter
start and the third-party imports are shared.

The server is the child's parent, so it reaps it and sends its exit status back; `Forked`
offers what the tests use of `subprocess.Popen` (pid, poll, wait, send_signal, terminate,
kill, returncode, stdout). A request whose environment changes how the interpreter itself
starts (a `PYTHON*` variable) is started with `subprocess.Popen` instead, as is everything
when ROUTER_TEST_FORK=0.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# Imported once by the server; each is importable without Django settings.
PRELOAD = (
    "django.db.models",
    "django.urls",
    "django.http",
    "django.core.management",
    "django.contrib.postgres.fields",
    "rest_framework.compat",
    "rest_framework.fields",
    "drf_spectacular.utils",
    "channels",
    "httptools",
    "uvicorn.config",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.websockets_sansio_impl",
    "websockets",
    "aiohttp",
    "httpx",
    "numpy",
    "pandas",
    "yaml",
    "psycopg",
    "uvloop",
    "django_q",
    "dj_database_url",
    # What a node imports after `django.setup()` that needs no settings at import: the app
    # configs, the request handlers and middleware, DRF's views machinery, the template tags,
    # the migration loader. Another third of a node's start. (Not the modules that define
    # models: those need the app registry.)
    "django.core.handlers.asgi",
    "django.core.cache.backends.locmem",
    "django.core.management.commands.migrate",
    "django.db.models.sql.compiler",
    "django.middleware.common",
    "django.middleware.clickjacking",
    "django.middleware.security",
    "django.views.csrf",
    "django.views.debug",
    "django.views.defaults",
    "django.template.defaulttags",
    "django.template.loader_tags",
    "django.templatetags.cache",
    "django.templatetags.i18n",
    "django.templatetags.l10n",
    "django.templatetags.tz",
    "django.contrib.admin.apps",
    "django.contrib.admin.templatetags.admin_list",
    "django.contrib.admin.templatetags.admin_modify",
    "django.contrib.admin.templatetags.log",
    "django.contrib.admindocs.views",
    "django.contrib.auth.apps",
    "django.contrib.auth.hashers",
    "django.contrib.auth.password_validation",
    "django.contrib.auth.tokens",
    "django.contrib.contenttypes.apps",
    "django.contrib.messages.apps",
    "django.contrib.messages.middleware",
    "django.contrib.sessions.apps",
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.middleware",
    "django.contrib.sites.shortcuts",
    "django.contrib.staticfiles.apps",
    "django.contrib.staticfiles.handlers",
    "rest_framework.apps",
    "rest_framework.checks",
    "rest_framework.metadata",
    "rest_framework.mixins",
    "rest_framework.negotiation",
    "rest_framework.permissions",
    "rest_framework.request",
    "rest_framework.response",
    "adrf.permissions",
    "adrf.requests",
    "drf_spectacular.apps",
    "drf_spectacular.checks",
    "drf_spectacular_sidecar.apps",
    "channels.apps",
    "channels.db",
    "channels.routing",
    "django_q.queues",
    "django_q.humanhash",
    "axes.apps",
    "axes.handlers",
    "prometheus_client",
    "prometheus_client.openmetrics",
    "pythonjsonlogger.core",
    "httpx_aiohttp",
    "orjson",
    "picklefield.constants",
    "sqlite3",
    "statistics",
    # The router's own config schema: settings.py imports it to read the config file, so it
    # cannot depend on settings, and it reads the environment only when a config is loaded.
    "routerproject.config",
)
_HEADER = struct.Struct("!I")


def _send(sock: socket.socket, doc: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(doc).encode()
    socket.send_fds(sock, [_HEADER.pack(len(data)) + data], list(fds))


def _recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One message and the descriptors that came with it; None at the end of the stream."""
    head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 4)
    if not head:
        return None
    while len(head) < _HEADER.size:
        head += sock.recv(_HEADER.size - len(head))
    (size,) = _HEADER.unpack(head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    doc: dict[str, Any] = json.loads(body)
    return doc, fds


# --- the server (its own process) -------------------------------------------------------------


def _become(
    request: Mapping[str, Any], out: int, control: socket.socket, wake: tuple[int, int]
) -> None:
    """In the forked child: turn into `python <argv[1:]>` and run it to the interpreter's exit."""
    os.setsid()
    control.close()
    signal.set_wakeup_fd(-1)
    for fd in wake:
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv: list[str] = request["argv"][1:]
    sys.argv = list(argv)
    sys.path[0] = str(Path(argv[0]).resolve().parent)
    # Whatever leaves run_path (SystemExit included) ends this interpreter as it would a
    # `python manage.py` process: nothing on the way out catches it.
    runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(control, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(fd: int) -> None:
    """Answer fork requests on the control socket `fd` until the test process goes away."""
    # Without a settings module a preloaded module that reads settings at import fails here,
    # instead of configuring them from the test process's environment for every child.
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    for name in PRELOAD:
        __import__(name)
    # What the preload built lives as long as every child: frozen, a child's collections
    # (the node's own gc.collect at start, its generation-2 passes) never walk it again.
    gc.collect()
    gc.freeze()
    control = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    # A handler (not SIG_DFL) so that SIGCHLD writes to the wake-up pipe.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 512)
            _reap(control)
        if control.fileno() not in ready:
            continue
        message = _recv(control)
        if message is None:
            return
        request, fds = message
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become(request, fds[0], control, (wake_r, wake_w))
        for fd_ in fds:
            os.close(fd_)
        _send(control, {"pid": pid})


# --- the test process's side ------------------------------------------------------------------


class Forked:
    """The `subprocess.Popen` surface the tests use, for a child of the fork server."""

    def __init__(self, server: _Server, pid: int, args: list[str], stdout: IO[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._server.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Server:
    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        env = dict(os.environ)
        # Without this numpy's OpenBLAS starts a thread at import, and the server must fork
        # with none. The nodes' fits are a few hundred numbers: one thread is what they use.
        env["OPENBLAS_NUM_THREADS"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", str(theirs.fileno())],
            cwd=str(Path(__file__).resolve().parent.parent),
            env=env,
            pass_fds=[theirs.fileno()],
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self.env = env
        self.sock = mine
        self.lock = threading.Lock()
        self.pids: queue.Queue[int] = queue.Queue()
        self.exits: dict[int, int] = {}
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True, name="forkserver").start()

    def _read(self) -> None:
        while True:
            try:
                message = _recv(self.sock)
            except OSError:
                message = None
            if message is None:
                self.pids.put(-1)
                return
            doc, _ = message
            if "pid" in doc:
                self.pids.put(doc["pid"])
            else:
                with self.changed:
                    self.exits[doc["exit"]] = doc["code"]
                    self.changed.notify_all()

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self.changed:
            self.changed.wait_for(lambda: pid in self.exits, timeout)
            return self.exits.get(pid)

    def spawn(self, argv: list[str], env: Mapping[str, str], cwd: str) -> Forked:
        read, write = os.pipe()
        try:
            with self.lock:
                _send(self.sock, {"argv": argv, "env": dict(env), "cwd": cwd}, [write])
                pid = self.pids.get(timeout=30)
        finally:
            os.close(write)
        if pid < 0:
            os.close(read)
            raise RuntimeError("the fork server has gone")
        return Forked(self, pid, argv, open(read, encoding="utf-8", errors="replace"))


_server: _Server | None = None
_server_lock = threading.Lock()


def _interpreter_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


def popen(argv: list[str], env: Mapping[str, str], cwd: str) -> Forked | subprocess.Popen[str]:
    """Run `argv` (`python manage.py ...`) forked from the server, or as a plain subprocess when
    forking could not give the same process (another interpreter, other PYTHON* settings)."""
    global _server
    plain = (
        os.environ.get("ROUTER_TEST_FORK", "1") == "0"
        or argv[0] != sys.executable
        or not argv[1].endswith("manage.py")
    )
    with _server_lock:
        if not plain and _server is None:
            _server = _Server()
        if _server is not None and _interpreter_env(env) != _interpreter_env(_server.env):
            plain = True
    if plain or _server is None:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    return _server.spawn(argv, env, cwd)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
