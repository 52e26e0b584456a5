"""The chaos soak's faults, one at a time, at random, from their own thread.

A slave fault is one of: a SIGKILL of its router's process group (its backends, in sessions of
their own, are ended by the restart), a freeze of the whole machine (router and backends
SIGSTOPped for longer than the master's `health_timeout`: the node is lost while frozen), or a
hiccup of its router alone (SIGSTOPped for less than `health_timeout`: a slow node, not a lost
one, which must keep its lent work). `losses` says which node was lost when, so the count can
tell work rerun after a node was lost from work that ran twice for no reason.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import threading
import time

import httpx

from bench.lending_support import signal_tree
from tests.harness import CLUSTER_TOKEN, Cluster, RouterNode, start_node

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


class Faults:
    """Injects one fault at a time; `master_kills` are the times the master was SIGKILLed."""

    def __init__(
        self,
        cluster: Cluster,
        rng: random.Random,
        stop: threading.Event,
        *,
        lending: bool,
        health_timeout: float,
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.stop = stop
        self.lending = lending
        self.health_timeout = health_timeout
        self.losses: list[tuple[str, float, float]] = []
        """(node, from, to) in epoch seconds: a slave killed until restarted, or frozen past
        the master's health_timeout; a node's backend killed (from = to)."""
        self.done: collections.Counter[str] = collections.Counter()
        self.log: list[str] = []
        self.master_kills: list[float] = []
        self.events: list[tuple[float, float, str]] = []
        """(start, end, what) of every fault made, in `time.monotonic()` seconds."""

    def run(self) -> None:
        # Weighted: a master restart takes the longest, and clients can only be refused then.
        actions = [self.kill_slave] * 2 + [self.freeze_slave] * 2 + [self.hiccup_slave] * 2
        actions += [self.kill_backend] * 3
        actions += [self.restart_master, self.kill_master]
        while not self.stop.wait(self.rng.uniform(1.0, 4.0)):
            action = self.rng.choice(actions)
            began = time.monotonic()
            try:
                action()
                self.done[action.__name__] += 1
                self.events.append((began, time.monotonic(), action.__name__))
            except Exception as exc:  # a fault that could not be made is reported, not fatal
                self.log.append(f"{action.__name__} failed: {exc!r}")

    def _slave(self) -> str:
        """A slave to fault; in lending mode one that holds borrowed work when one does."""
        names = sorted(self.cluster.slaves)
        if self.lending:
            busy = [n for n in names if _borrowed(self.cluster.slaves[n]) > 0]
            if busy:
                self.done["fault on a helper holding lent work"] += 1
                return self.rng.choice(busy)
        return self.rng.choice(names)

    def kill_slave(self) -> None:
        name = self._slave()
        began = time.time()
        try:
            os.killpg(self.cluster.slaves[name].proc.pid, signal.SIGKILL)
            self.stop.wait(self.rng.uniform(1.0, 3.0))
            self.cluster.restart_slave(name)
        finally:
            self.losses.append((name, began, time.time()))

    def freeze_slave(self) -> None:
        """The machine stops: its router and its backends, longer than health_timeout."""
        name = self._slave()
        began = time.time()
        stopped = signal_tree(self.cluster.slaves[name].proc.pid, signal.SIGSTOP)
        try:
            self.stop.wait(self.rng.uniform(2.0, 6.0))
        finally:
            # Backends first, so the router wakes to running backends.
            for pid in reversed(stopped):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            ended = time.time()
            if ended - began > self.health_timeout:
                self.losses.append((name, began, ended))

    def hiccup_slave(self) -> None:
        """Its router alone pauses, for less than health_timeout: slow, not gone."""
        node = self.cluster.slaves[self._slave()]
        os.killpg(node.proc.pid, signal.SIGSTOP)
        try:
            self.stop.wait(self.rng.uniform(0.3, 0.9) * self.health_timeout)
        finally:
            os.killpg(node.proc.pid, signal.SIGCONT)

    def kill_backend(self) -> None:
        node = self.rng.choice(self.cluster.nodes())
        state = httpx.get(node.base_url + "/router/v1/node/state", headers=AUTH, timeout=5).json()
        pids = [b["pid"] for b in state["backends"] if b.get("pid")]
        if pids:
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            # A backend that finished a request the instant it was killed logged the completion,
            # but its answer died with it: the request runs again elsewhere.
            killed_at = time.time()
            self.losses.append((self._name(node), killed_at, killed_at))

    def _name(self, node: RouterNode) -> str:
        """The node's folder name, as the completion logs name it."""
        c = self.cluster
        return next((name for name, n in c.slaves.items() if n is node), "master")

    def restart_master(self) -> None:
        """SIGTERM: the master drains what it holds before it exits."""
        old = self.cluster.master
        old.stop(timeout=60)
        self._start_master(old)

    def kill_master(self) -> None:
        """SIGKILL: every client connection to the master breaks where it is."""
        old = self.cluster.master
        self.master_kills.append(time.monotonic())
        os.killpg(old.proc.pid, signal.SIGKILL)
        old.proc.wait(10)
        self.stop.wait(self.rng.uniform(0.5, 2.0))
        self._start_master(old)

    def _start_master(self, old: RouterNode) -> None:
        c = self.cluster
        old.cleanup(drop_db=False)
        port, models, sections = c.specs["master"]
        c.master = start_node(c.root / "master", models, port=port, db=old.db, **sections)

    def thaw_all(self) -> None:
        for node in self.cluster.nodes():
            signal_tree(node.proc.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGCONT)


def _borrowed(node: RouterNode) -> int:
    """Borrowed requests the node runs or holds (the master's stall-check query), 0 if silent."""
    try:
        r = httpx.get(node.base_url + "/router/v1/node/offload/borrowed", headers=AUTH, timeout=1)
        return int(r.json()["borrowed"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return 0
