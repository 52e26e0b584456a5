"""Start real router nodes (`manage.py runrouter` subprocesses) for integration tests.

Each node gets its own store directory, config file, simulated model configs and database:
SQLite in its store by default, or a fresh PostgreSQL database when the suite runs with a
PostgreSQL DATABASE_URL. Readiness is the node's own "router ready" log line, never a sleep.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import queue
import random
import shutil
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests import forkserver

REPO = Path(__file__).resolve().parent.parent
READY_MARK = "router ready:"
START_TIMEOUT_SECS = 60.0
MAX_POLL_PAUSE_SECS = 0.2
# Ports Chromium refuses to open (net::ERR_UNSAFE_PORT) within the slices below: a WebUI test
# whose node drew one could not load its page.
BROWSER_UNSAFE_PORTS = frozenset({10080})
DB_FILENAME = "router.sqlite3"


def _port_slice() -> range:
    """This process's own ports: below the kernel's ephemeral range, one slice per xdist worker.

    A port the kernel hands out for `bind(0)` comes from the ephemeral range, which every
    outgoing connection of every test draws from too; between the test choosing it and its
    node binding it, another worker's client may take it ("Address already in use"). Ports
    below that range are never handed out on their own, and the slices keep workers apart.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    first, slices = 10000, 32
    size = (low - first) // slices
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % slices if worker.isdigit() else 0
    return range(first + index * size, first + (index + 1) * size) if size >= 64 else range(0)


_PORTS = _port_slice()
_next_port = itertools.count(random.randrange(max(len(_PORTS), 1)))


def free_port() -> int:
    """A port no socket holds now, from this process's slice (or any the kernel picks)."""
    for _ in range(len(_PORTS)):
        port = _PORTS[next(_next_port) % len(_PORTS)]
        if port in BROWSER_UNSAFE_PORTS:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def sim_weights(**costs: Any) -> dict[str, Any]:
    """Costs for a simulated model; defaults are small so tests stay fast."""
    base = {"load_ms": 50, "base_ms": 5, "prompt_ms_per_token": 0, "output_ms_per_token": 1}
    base.update(costs)
    return base


@dataclass
class ModelSpec:
    """A simulated model config: `kcpps` keys plus the sim weights for each weights field."""

    name: str
    kcpps: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)


def text_model(name: str, **costs: Any) -> ModelSpec:
    return ModelSpec(
        name,
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(**costs)},
    )


class _PgDatabase:
    """A throwaway PostgreSQL database for one node, when the suite runs on PostgreSQL.

    It is a copy of `template` when one is given: a database nobody is connected to.
    """

    def __init__(self, admin_url: str, template: str | None = None) -> None:
        import psycopg

        self.admin_url = admin_url
        self.name = f"router_it_{uuid.uuid4().hex[:12]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"{copy}')
        scheme, rest = admin_url.split("://", 1)
        base = rest.rsplit("/", 1)[0]
        self.url = f"{scheme}://{base}/{self.name}"

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def _migrate(store: Path, database_url: str | None) -> None:
    """`manage.py migrate` on a database of its own (the store's SQLite file by default)."""
    config = store / "config.yaml"
    config.write_text(
        yaml.safe_dump({"cluster": {"store_dir": str(store)}, "models": {"config_dir": str(store)}})
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
    env["ROUTER_CONFIG"] = str(config)
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "migrate", "--verbosity", "0"],
        cwd=str(REPO),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if done.returncode:
        raise RuntimeError("migrate failed for the database template:\n" + done.stdout)


class _Templates:
    """Databases with every migration applied, made once per test run, one per back end.

    Applying the migrations to an empty database is about a fifth of a node's start. A new
    node gets a copy instead, and starts with `--no-migrate`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sqlite: Path | None = None
        self._pg: dict[str, str] = {}

    def sqlite(self) -> Path:
        with self._lock:
            if self._sqlite is None:
                root = Path(tempfile.mkdtemp(prefix="router-db-template-"))
                atexit.register(shutil.rmtree, root, ignore_errors=True)
                _migrate(root, None)
                path = root / DB_FILENAME
                # Out of WAL mode, the whole database is in this one file, ready to copy;
                # each node turns WAL back on when it opens its copy.
                lite = sqlite3.connect(path)
                try:
                    lite.execute("PRAGMA journal_mode=DELETE")
                finally:
                    lite.close()
                self._sqlite = path
            return self._sqlite

    def pg(self, admin_url: str) -> str:
        """The template's name; `migrate` has exited, so nobody is connected to it."""
        with self._lock:
            if admin_url not in self._pg:
                db = _PgDatabase(admin_url)
                atexit.register(db.drop)
                root = Path(tempfile.mkdtemp(prefix="router-db-template-"))
                atexit.register(shutil.rmtree, root, ignore_errors=True)
                _migrate(root, db.url)
                self._pg[admin_url] = db.name
            return self._pg[admin_url]


TEMPLATES = _Templates()


@dataclass
class RouterNode:
    proc: subprocess.Popen[str] | forkserver.Forked
    port: int
    store: Path
    config_path: Path
    lines: list[str]
    db: _PgDatabase | None = None
    keep_db: bool = False
    ready: queue.Queue[bool] = field(default_factory=queue.Queue)
    """Gets True when the node logs its ready line, False when its output ends first."""
    scheme: str = "http"
    tls: ssl.SSLContext | None = None
    """What a test's client verifies an https node with (and shows it): the node's own
    `cluster.tls_ca_file` and client certificate."""

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        if self.tls is not None:
            kwargs.setdefault("verify", self.tls)
        return httpx.Client(base_url=self.base_url, timeout=kwargs.pop("timeout", 60.0), **kwargs)

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self) -> None:
        """Wait for the ready line; a node that exits or never gets there is cleaned up."""
        try:
            ok = self.ready.get(timeout=START_TIMEOUT_SECS)
        except queue.Empty:
            ok = False
        if not ok:
            self.cleanup()
            raise RuntimeError("router did not become ready:\n" + self.output())

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of `sql` (with `%s` placeholders) from this node's own database.

        For what only a node's database holds, such as a slave's analytics rows, which no
        site route serves.
        """
        if self.db is not None:
            import psycopg

            with psycopg.connect(self.db.url) as pg:
                return list(pg.execute(sql, params).fetchall())
        lite = sqlite3.connect(self.store / DB_FILENAME, timeout=10)
        try:
            return lite.execute(sql.replace("%s", "?"), params).fetchall()
        finally:
            lite.close()

    def cleanup(self, *, drop_db: bool = True) -> None:
        if self.proc.poll() is None:
            self.kill()
        if self.db is not None and drop_db:
            with contextlib.suppress(Exception):
                self.db.drop()


def write_models(config_dir: Path, weights_dir: Path, models: list[ModelSpec]) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    weights_dir.mkdir(parents=True, exist_ok=True)
    for spec in models:
        raw = {"backend_mode": "sim", **spec.kcpps}
        for key, costs in spec.weights.items():
            wpath = weights_dir / f"{spec.name}-{key}.sim.json"
            wpath.write_text(json.dumps(costs))
            raw[key] = str(wpath)
        (config_dir / f"{spec.name}.kcpps").write_text(json.dumps(raw))


def node_config(store: Path, port: int, **sections: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "server": {"bind": f"127.0.0.1:{port}"},
        "cluster": {
            "store_dir": str(store),
            # A silent node is asked again soon, so tests that wait for it to answer again do
            # not wait out the production pace. The status poll keeps its 500ms: shorter, a
            # node busy on a loaded test machine would look silent.
            "lending_reprobe_interval": "100ms",
            "lending_reprobe_timeout": "2s",
            "lending_stall_check_interval": "250ms",
        },
        "models": {"config_dir": str(store / "kcpps")},
        "backend": {"mode": "sim", "load_timeout": "30s"},
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    return config


def start_node(
    root: Path,
    models: list[ModelSpec],
    /,
    *,
    workers: bool = False,
    extra_env: dict[str, str] | None = None,
    wait: bool = True,
    port: int | None = None,
    db: _PgDatabase | None = None,
    keep_db: bool = False,
    **sections: Any,
) -> RouterNode:
    """Start one node; `port`/`db` reuse an earlier node's address and database (a restart).

    `models` is positional-only so that a `models=` config section can be given too.
    """
    store = root / "store"
    store.mkdir(parents=True, exist_ok=True)
    write_models(store / "kcpps", root / "weights", models)
    port = port or free_port()
    config = node_config(store, port, **sections)
    config["cluster"].setdefault("node_id", "node-a")
    config_path = root / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = dict(os.environ)
    env.pop("ROUTER_CONFIG", None)
    suite_db = os.environ.get("DATABASE_URL", "")
    if suite_db.startswith(("postgres://", "postgresql://")):
        db = db or _PgDatabase(suite_db, TEMPLATES.pg(suite_db))
        env["DATABASE_URL"] = db.url
    else:
        env.pop("DATABASE_URL", None)
    env.update(extra_env or {})
    database = store / DB_FILENAME
    own_db = db is not None or "DATABASE_URL" in env or "database" in sections
    if not own_db and not database.exists():
        shutil.copyfile(TEMPLATES.sqlite(), database)
    argv = [sys.executable, str(REPO / "manage.py"), "runrouter", "--config", str(config_path)]
    if not workers:
        argv.append("--no-workers")
    if not ("database" in sections or "DATABASE_URL" in (extra_env or {})):
        # A copy of a migrated template, or a restart on one: nothing is left to apply.
        argv.append("--no-migrate")
    node = spawn_node(argv, env, port, store, config_path, db=db, keep_db=keep_db)
    if config["server"].get("tls_cert_file"):
        node.scheme, node.tls = "https", _client_tls(config["cluster"])
    if wait:
        node.wait_ready()
    return node


def spawn_node(
    argv: list[str],
    env: dict[str, str],
    port: int,
    store: Path,
    config_path: Path,
    *,
    db: _PgDatabase | None = None,
    keep_db: bool = False,
) -> RouterNode:
    """Run a node's command line (from the repository) and follow its output for the ready line."""
    proc = forkserver.popen(argv, env, str(REPO))
    node = RouterNode(proc, port, store, config_path, [], db, keep_db)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            node.lines.append(line.rstrip("\n"))
            if READY_MARK in line:
                node.ready.put(True)
        node.ready.put(False)

    threading.Thread(target=pump, daemon=True).start()
    return node


def _client_tls(cluster: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=cluster.get("tls_ca_file"))
    if cluster.get("tls_client_cert_file"):
        context.load_cert_chain(cluster["tls_client_cert_file"], cluster["tls_client_key_file"])
    return context


def wait_for(predicate: Any, *, timeout: float = 20.0, interval: float = 0.02) -> Any:
    """Poll a condition (not a fixed sleep): returns its first truthy value or fails.

    The pause between polls starts at `interval` and grows by half each time up to 0.2 s: a
    condition met at once is seen at once, and a long wait (a node's poll round, a fit) does not
    spend the two cores the whole suite shares on asking a node fifty times a second.
    """
    deadline = time.monotonic() + timeout
    pause = interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
        pause = min(pause * 1.5, max(interval, MAX_POLL_PAUSE_SECS))


@contextlib.contextmanager
def running_node(root: Path, models: list[ModelSpec], **kwargs: Any) -> Iterator[RouterNode]:
    node = start_node(root, models, **kwargs)
    try:
        yield node
    finally:
        node.cleanup()


CLUSTER_TOKEN = "test-cluster-token-0123456789"


@dataclass
class Cluster:
    master: RouterNode
    slaves: dict[str, RouterNode]
    root: Path
    specs: dict[str, tuple[int, list[ModelSpec], dict[str, Any]]] = field(default_factory=dict)

    def nodes(self) -> list[RouterNode]:
        return [self.master, *self.slaves.values()]

    def cleanup(self) -> None:
        for node in self.nodes():
            node.cleanup()

    def start_slave(self, name: str) -> RouterNode:
        """Start a slave that `start_cluster` was told to defer, on the port the master knows."""
        assert name not in self.slaves, f"{name} is running already"
        port, models, sections = self.specs[name]
        node = start_node(self.root / name, models, port=port, **sections)
        self.slaves[name] = node
        return node

    def restart_slave(self, name: str, **kwargs: Any) -> RouterNode:
        old = self.slaves[name]
        old.cleanup(drop_db=False)
        port, models, sections = self.specs[name]
        node = start_node(
            self.root / name, models, port=port, db=old.db, keep_db=True, **sections, **kwargs
        )
        self.slaves[name] = node
        return node

    def restart_master(self) -> RouterNode:
        old = self.master
        old.stop()
        old.cleanup(drop_db=False)
        port, models, sections = self.specs["master"]
        self.master = start_node(self.root / "master", models, port=port, db=old.db, **sections)
        return self.master

    def wait_healthy(self, *names: str, timeout: float = 30.0) -> None:
        def healthy() -> bool:
            with self.master.client() as c:
                state = c.get("/router/v1/site/nodes/state").json()
            nodes = {n["node_id"]: n for n in state.get("cluster", {}).get("nodes", [])}
            return all(nodes.get(n, {}).get("healthy") for n in names)

        wait_for(healthy, timeout=timeout)


def clashing_names(slaves: dict[str, list[ModelSpec]]) -> bool:
    """Whether two slaves hold models of one name that are not replicas of each other.

    Such models get public IDs in the order their slaves register (`x`, `x-2`...), which
    tests name; slaves without such a clash register in any order to the same IDs.
    """
    seen: dict[str, ModelSpec] = {}
    return any(
        seen.setdefault(spec.name, spec) != spec for models in slaves.values() for spec in models
    )


def start_cluster(
    root: Path,
    master_models: list[ModelSpec],
    slaves: dict[str, list[ModelSpec]],
    *,
    health_interval: str = "1s",
    slave_tokens: dict[str, str] | None = None,
    extra_slave_urls: list[str] | None = None,
    master_sections: dict[str, dict[str, Any]] | None = None,
    per_slave_sections: dict[str, dict[str, dict[str, Any]]] | None = None,
    deferred: tuple[str, ...] = (),
    scheme: str = "http",
) -> Cluster:
    """A master and its slaves on loopback ports; returns once every slave is healthy.

    Slaves named in `deferred` get their port and place in the master's `slave_urls` but are
    not started: a test writes their files first and then calls `Cluster.start_slave`, instead
    of paying for a start and a restart.

    The master starts first, so that each slave registers as it comes up. The slaves start
    together, since most of a node's start is its own imports and migrations, unless they
    clash on a model name: then one after the other, in order, for the same public IDs on
    every run. `scheme="https"` names every node by https URLs (the sections must then give
    the TLS files).
    """
    master_port = free_port()
    ports = {name: free_port() for name in slaves}
    master_url = f"{scheme}://127.0.0.1:{master_port}"
    slave_urls = [f"{scheme}://127.0.0.1:{p}" for p in ports.values()] + list(
        extra_slave_urls or []
    )
    sections: dict[str, Any] = {
        "cluster": {
            "role": "master",
            "node_id": "master",
            "token": CLUSTER_TOKEN,
            "public_url": master_url,
            "slave_urls": slave_urls,
            "health_interval": health_interval,
            "sync_interval": health_interval,
        }
    }
    for key, values in (master_sections or {}).items():
        sections.setdefault(key, {}).update(values)
    master = start_node(root / "master", master_models, port=master_port, **sections)
    cluster = Cluster(master, {}, root)
    cluster.specs["master"] = (master_port, master_models, sections)
    together = not clashing_names(slaves)
    try:
        for name, models in slaves.items():
            token = (slave_tokens or {}).get(name, CLUSTER_TOKEN)
            slave_sections: dict[str, Any] = {
                "cluster": {
                    "role": "slave",
                    "node_id": name,
                    "token": token,
                    "public_url": f"{scheme}://127.0.0.1:{ports[name]}",
                    "master_url": master_url,
                    "sync_interval": health_interval,
                }
            }
            for key, values in (per_slave_sections or {}).get(name, {}).items():
                slave_sections.setdefault(key, {}).update(values)
            cluster.specs[name] = (ports[name], models, slave_sections)
            if name in deferred:
                continue
            cluster.slaves[name] = start_node(
                root / name, models, port=ports[name], wait=not together, **slave_sections
            )
        if together:
            for node in cluster.slaves.values():
                node.wait_ready()
        healthy = [
            n for n in cluster.slaves if (slave_tokens or {}).get(n, CLUSTER_TOKEN) == CLUSTER_TOKEN
        ]
        cluster.wait_healthy(*healthy)
    except BaseException:
        cluster.cleanup()
        raise
    return cluster


@dataclass
class UpstreamServer:
    """A simulated backend started on its own, for configs that point at a running server."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(self.url + "/sim/stats", timeout=10).json()
        return stats

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_upstream(root: Path, name: str, *args: str, **costs: Any) -> UpstreamServer:
    """`python -m proxy.sim` on a free port with `args` (an alias, an API key…), once ready."""
    root.mkdir(parents=True, exist_ok=True)
    weights = root / f"{name}.sim.json"
    weights.write_text(json.dumps(sim_weights(load_ms=0, **costs)))
    port = free_port()
    argv = [sys.executable, "-m", "proxy.sim", "-m", str(weights), "--port", str(port), *args]
    proc = subprocess.Popen(argv, cwd=str(REPO), stdout=subprocess.DEVNULL)
    server = UpstreamServer(proc, port)

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"upstream {name} exited with code {proc.returncode}")
        try:
            return httpx.get(server.url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(healthy, timeout=START_TIMEOUT_SECS, interval=0.05)
    except BaseException:
        server.stop()
        raise
    return server
