"""Helpers for bench/lending.py: request bodies, timed traffic, cluster polling, decision rows.

Everything here talks to real router processes started by ``tests.harness`` on loopback;
every wait is bounded and polls a condition instead of sleeping for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from tests.harness import CLUSTER_TOKEN, Cluster, RouterNode

AUTH_HEADERS = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
JSON_HEADERS = {"Content-Type": "application/json"}
HTTP_TIMEOUT_SECS = 60.0
# A hung helper keeps lent requests until the owner cuts them off (30 s and more), so a run
# must be allowed well past that before a request counts as lost.
RUN_TIMEOUT_SECS = 150.0
DECISIONS_LIMIT = 5000
# The decision log reaches the database within about a second; rows are re-read until two
# reads a little apart agree, so a count is never taken from a half-flushed log.
DECISIONS_SETTLE_SECS = 1.2
DECISIONS_SETTLE_TIMEOUT_SECS = 15.0
ADMITTED_TIMEOUT_SECS = 10.0
ADMITTED_POLL_SECS = 0.01
# Requests sent this soon after a run starts get a connection opened before it starts.
WARM_HORIZON_MS = 1000.0
ENROLL_TIMEOUT_SECS = 20.0
LOAD_TIMEOUT_SECS = 60.0

TEXT_PATH = "/v1/chat/completions"
IMAGE_PATH = "/v1/images/generations"
TEXT = "text"
IMAGE = "image"
LINK_PATHS = {TEXT: "/router/v1/site/text-routing-groups", IMAGE: "/router/v1/site/routing-groups"}


def percentile(values: Iterable[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(0, math.ceil(pct / 100.0 * len(ordered)) - 1)
    return ordered[rank]


def wait_until(
    predicate: Callable[[], Any], *, timeout_secs: float, what: str, interval: float = 0.1
) -> Any:
    """Poll ``predicate`` until it returns something truthy; RuntimeError naming ``what``."""
    deadline = time.monotonic() + timeout_secs
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_secs:.0f}s waiting for {what}")
        time.sleep(interval)


# -- request bodies ------------------------------------------------------------------------------


def _dump(doc: Mapping[str, Any]) -> bytes:
    # One encoding for every request: the fits price only work within 10 % of what they saw,
    # so warm-up and measured bodies must be byte for byte the same size.
    return json.dumps(doc, separators=(",", ":")).encode()


def text_body(
    model: str,
    max_tokens: int,
    *,
    size: int | None = None,
    stream: bool = False,
    system: str | None = None,
    content: str = "hi",
) -> bytes:
    """A chat request; ``size`` pads the user content so the body is exactly that many bytes.

    The simulated backend counts ``ceil(body bytes / 4)`` prompt tokens, so a fixed size keeps
    streams, plain requests and every model name of equal length at one price.
    """
    messages: list[dict[str, str]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": content})
    doc: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if stream:
        doc["stream"] = True
    raw = _dump(doc)
    if size is None:
        return raw
    if len(raw) > size:
        raise ValueError(f"a body for {model} needs {len(raw)} bytes, more than {size}")
    messages[-1]["content"] = content + "x" * (size - len(raw))
    raw = _dump(doc)
    assert len(raw) == size
    return raw


def image_body(model: str, *, width: int, height: int, steps: int) -> bytes:
    return _dump(
        {"model": model, "prompt": "a lighthouse", "size": f"{width}x{height}", "steps": steps}
    )


@dataclass(frozen=True)
class Job:
    """One request of a traffic pattern, sent ``at_ms`` after the pattern starts."""

    body: bytes
    path: str = TEXT_PATH
    stream: bool = False
    at_ms: float = 0.0


@dataclass(frozen=True)
class Answer:
    status: int
    model: str
    sent_ms: float
    done_ms: float
    error: str = ""
    request_id: str = ""

    @property
    def latency_ms(self) -> float:
        return self.done_ms - self.sent_ms


@dataclass
class Run:
    """The answers of one traffic pattern, times in ms after its first send."""

    started_wall_ms: int
    answers: list[Answer]
    # What the side coroutine of the run (own traffic, a fault, a tracer) returned.
    side: Any = None
    # Of the jobs sent first (``run_jobs(first=)``), how many the owner ran itself.
    owner_ran: int = 0

    @property
    def makespan_ms(self) -> float:
        return max((a.done_ms for a in self.answers), default=0.0)

    @property
    def ok(self) -> bool:
        return all(a.status == 200 for a in self.answers)

    @property
    def latencies_ms(self) -> list[float]:
        return [a.latency_ms for a in self.answers]

    def problems(self, model: str, answers: Sequence[Answer] | None = None) -> list[str]:
        """Why these answers (all by default) are not each one 200 under ``model`` (any
        model when empty); an empty list when they are."""
        chosen = self.answers if answers is None else answers
        failed = sorted({f"{a.status} {a.error}".strip() for a in chosen if a.status != 200})
        wrong = sorted({a.model for a in chosen if a.status == 200 and model and a.model != model})
        return failed + ([f"answered as {wrong}"] if wrong else [])


def _answer_model(raw: bytes, stream: bool) -> str:
    if not stream:
        doc = json.loads(raw)
        return str(doc.get("model", "")) if isinstance(doc, dict) else ""
    text = raw.decode("utf-8", "replace")
    if "data: [DONE]" not in text:
        return ""
    for line in text.splitlines():
        if line.startswith("data: {"):
            doc = json.loads(line[len("data: ") :])
            return str(doc.get("model", ""))
    return ""


async def _send(session: aiohttp.ClientSession, base: str, job: Job, t0: float) -> Answer:
    sent = (time.perf_counter() - t0) * 1000.0
    try:
        async with session.post(base + job.path, data=job.body, headers=JSON_HEADERS) as resp:
            raw = await resp.read()
            status = resp.status
            request_id = resp.headers.get("X-Request-Id", "")
        model = ""
        if status == 200:
            # Images answer without a model field: an empty name matches any.
            model = "" if job.path == IMAGE_PATH else _answer_model(raw, job.stream)
        error = "" if status == 200 else raw[:200].decode("utf-8", "replace")
    except (aiohttp.ClientError, TimeoutError) as exc:
        status, model, error = -1, "", f"{type(exc).__name__}: {exc}"
        request_id = ""
    done = (time.perf_counter() - t0) * 1000.0
    return Answer(status, model, sent, done, error, request_id)


async def _placed(session: aiohttp.ClientSession, base: str, count: int) -> int:
    """Until ``count`` requests are placed, each in the node's runtimes or lent to a helper
    (the owner may send one that arrives while it runs to a faster helper); how many of them
    the node runs itself (bounded)."""
    deadline = time.monotonic() + ADMITTED_TIMEOUT_SECS
    url = base + "/router/v1/node/runtime-status"
    while time.monotonic() < deadline:
        async with session.get(url, headers=AUTH_HEADERS) as resp:
            doc = await resp.json()
        active = int(doc.get("active_requests", 0))
        lent = sum(
            int(q.get("lent_count", 0))
            for lane in ("text_queue", "image_queue")
            for q in doc.get(lane, []) or []
        )
        if active + lent >= count:
            return min(active, count)
        await asyncio.sleep(ADMITTED_POLL_SECS)
    raise RuntimeError(f"{count} requests were not placed within {ADMITTED_TIMEOUT_SECS:.0f}s")


Side = Callable[[float, asyncio.Event], Awaitable[Any]]


async def _warm_connections(
    session: aiohttp.ClientSession,
    node: RouterNode,
    jobs: Sequence[Job],
    also: Sequence[tuple[RouterNode, Job]],
) -> None:
    """Open, before the clock starts, one connection per request sent within the first
    second: a fresh client spends tens of ms (a loaded machine: 70) setting up its first
    connections, which would count against the router in every makespan though the optimum
    has no such cost. Later requests would find such a connection closed as idle."""
    counts: dict[str, int] = {}
    for target, job in [(node, job) for job in jobs] + list(also):
        if job.at_ms <= WARM_HORIZON_MS:
            counts[target.base_url] = counts.get(target.base_url, 0) + 1

    async def ping(base: str) -> None:
        async with session.get(base + "/ping") as resp:
            await resp.read()

    await asyncio.gather(*(ping(base) for base, n in counts.items() for _ in range(n)))


async def run_jobs(
    node: RouterNode,
    jobs: Sequence[Job],
    *,
    first: int = 0,
    also: Sequence[tuple[RouterNode, Job]] = (),
    during: Side | None = None,
) -> Run:
    """Send ``jobs`` to ``node``, each at its ``at_ms``; every answer, timed from the first send.

    ``first`` > 0 sends that many jobs, waits until the node runs them, then the rest: which
    jobs the owner pinned in its backend is then known, as the optimum assumes. ``also`` are
    jobs for other nodes, sent with the rest; their answers follow in order. ``during`` runs
    beside the traffic (given the perf_counter origin and an event set once every answer is
    in) for side traffic, tracing or fault injection; its result is ``Run.side``.
    """
    timeout = aiohttp.ClientTimeout(total=RUN_TIMEOUT_SECS)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await _warm_connections(session, node, jobs, also)
        started_wall_ms = int(time.time() * 1000)
        t0 = time.perf_counter()
        done = asyncio.Event()
        side = asyncio.ensure_future(during(t0, done)) if during is not None else None

        async def timed(target: RouterNode, job: Job) -> Answer:
            delay = job.at_ms / 1000.0 - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival pattern itself, not a wait for state
            return await _send(session, target.base_url, job, t0)

        head = [asyncio.ensure_future(timed(node, job)) for job in jobs[:first]]
        owner_ran = await _placed(session, node.base_url, first) if first else 0
        tail = [asyncio.ensure_future(timed(node, job)) for job in jobs[first:]]
        others = [asyncio.ensure_future(timed(target, job)) for target, job in also]
        answers = list(await asyncio.gather(*head, *tail, *others))
        done.set()
        side_result = await side if side is not None else None
    return Run(started_wall_ms, answers, side_result, owner_ran)


def run_sync(node: RouterNode, jobs: Sequence[Job], *, first: int = 0) -> Run:
    return asyncio.run(run_jobs(node, jobs, first=first))


# -- node state ----------------------------------------------------------------------------------


def runtime_status(node: RouterNode) -> dict[str, Any]:
    """The node's own runtime status (what the master's planner polls)."""
    resp = httpx.get(
        node.base_url + "/router/v1/node/runtime-status",
        headers=AUTH_HEADERS,
        timeout=HTTP_TIMEOUT_SECS,
    )
    resp.raise_for_status()
    doc: dict[str, Any] = resp.json()
    return doc


def fit_row(status: Mapping[str, Any], model_id: str, section: str) -> dict[str, Any] | None:
    """A model's published duration fit (section "llm" or "image"), or None when unpriced."""
    costs = status.get("costs") or {}
    for row in costs.get("models", []):
        if row.get("model_id") == model_id and row.get("section") == section:
            found: dict[str, Any] = row
            return found
    return None


def token_samples(status: Mapping[str, Any], model_id: str) -> int:
    """Samples behind a text model's token profile: every text sample the node has fitted."""
    costs = status.get("costs") or {}
    for row in costs.get("tokens", []):
        if row.get("model_id") == model_id:
            return int(row.get("samples", 0))
    return 0


def load_priced(status: Mapping[str, Any], config_filename: str) -> bool:
    return published_load_ms(status, config_filename) is not None


def published_load_ms(status: Mapping[str, Any], config_filename: str) -> float | None:
    """The mean load time a node publishes for one of its configs (what the planner prices)."""
    costs = status.get("costs") or {}
    for row in costs.get("loads", []):
        if row.get("config_filename") == config_filename:
            return float(row.get("load_ms", 0.0))
    return None


def fit_brief(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A fit as the report shows it: base, slopes, samples, and whether it is uniform."""
    if row is None:
        return None
    return {
        "base_ms": round(float(row.get("base_ms", 0.0)), 1),
        "slopes_ms": [round(float(s), 3) for s in row.get("slopes_ms", [])],
        "samples": row.get("samples"),
        "uniform": "uniform_work" in row,
    }


# -- processes -----------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (backends run in sessions of their own, so the
    router's process group does not reach them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_tree(pid: int, sig: signal.Signals) -> list[int]:
    """Send ``sig`` to a process and all its descendants; the pids signalled.

    A stop goes to the parent first, so it cannot notice a child stopping and react; a
    continue goes to the children first, so the parent wakes to running children.
    """
    tree = [pid, *descendants(pid)]
    order = tree if sig == signal.SIGSTOP else list(reversed(tree))
    for target in order:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)
    return order


# -- cluster operations --------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A helper side of a link."""

    node: str
    model: str
    load_if_unloaded: bool = True
    restore_after_borrow: bool = False


@dataclass
class ClusterOps:
    """Management calls on one benchmark cluster (through its master)."""

    cluster: Cluster
    links: dict[tuple[str, str, str], list[Target]] = field(default_factory=dict)

    @property
    def master(self) -> RouterNode:
        return self.cluster.master

    def node(self, name: str) -> RouterNode:
        return self.cluster.slaves[name]

    def _client(self) -> httpx.Client:
        return self.master.client(timeout=HTTP_TIMEOUT_SECS)

    def load(self, model: str) -> float:
        """Load ``model`` on the node that holds it; the load's duration in ms."""
        with self.master.client(timeout=LOAD_TIMEOUT_SECS) as client:
            resp = client.post("/router/v1/load", json={"model": model})
        if resp.status_code != 200:
            raise RuntimeError(f"load {model}: {resp.status_code} {resp.text}")
        return float(resp.json().get("duration_ms", 0.0))

    def ensure_loaded(self, node: str, model: str, lane: str = TEXT) -> bool:
        """Load ``model`` unless it is what ``node`` already runs on that lane; loaded now?"""
        key = "active_text_config" if lane == TEXT else "active_image_config"
        if runtime_status(self.node(node)).get(key) == f"{model}.kcpps":
            return False
        self.load(model)
        return True

    def ask(self, node: str, body: bytes, path: str = TEXT_PATH) -> float:
        """One direct request to a slave; its latency in ms."""
        t0 = time.perf_counter()
        with self.node(node).client(timeout=HTTP_TIMEOUT_SECS) as client:
            resp = client.post(path, content=body, headers=JSON_HEADERS)
        if resp.status_code != 200:
            raise RuntimeError(f"{path} on {node}: {resp.status_code} {resp.text}")
        return (time.perf_counter() - t0) * 1000.0

    def link(self, lane: str, owner: str, model: str, targets: Sequence[Target]) -> None:
        """Replace every link of ``owner``/``model`` with links to ``targets``."""
        body = {
            "anchor": {"node_id": owner, "model_id": model},
            "lends_to": [
                {
                    "node_id": t.node,
                    "model_id": t.model,
                    "load_if_unloaded": t.load_if_unloaded,
                    "restore_after_borrow": t.restore_after_borrow,
                }
                for t in targets
            ],
            "acknowledge_different_weights": True,
        }
        with self._client() as client:
            resp = client.post(LINK_PATHS[lane], json=body)
        if resp.status_code != 200 or "node_errors" in resp.json():
            raise RuntimeError(f"link {owner}/{model}: {resp.status_code} {resp.text}")
        self.links[(lane, owner, model)] = list(targets)
        self._wait_enrolled(lane, [(owner, model), *((t.node, t.model) for t in targets)], True)

    def unlink(self, lane: str, owner: str, model: str) -> None:
        targets = self.links.pop((lane, owner, model), [])
        with self._client() as client:
            resp = client.delete(LINK_PATHS[lane], params={"node_id": owner, "model_id": model})
        if resp.status_code != 200 or "node_errors" in resp.json():
            raise RuntimeError(f"unlink {owner}/{model}: {resp.status_code} {resp.text}")
        # A helper that another owner still lends to stays enrolled.
        still = {
            (t.node, t.model)
            for (other_lane, _, _), others in self.links.items()
            if other_lane == lane
            for t in others
        }
        still |= {(o, m) for (other_lane, o, m) in self.links if other_lane == lane}
        gone = [(owner, model), *((t.node, t.model) for t in targets)]
        self._wait_enrolled(lane, [key for key in gone if key not in still], False)

    def unlink_all(self) -> None:
        for lane, owner, model in list(self.links):
            self.unlink(lane, owner, model)

    def _wait_enrolled(self, lane: str, models: Sequence[tuple[str, str]], enrolled: bool) -> None:
        # A node lists a queue entry for each of its enrolled models once the links reach it;
        # a helper that is not enrolled yet would not put its own requests first.
        def check() -> bool:
            for node, model in models:
                queue = runtime_status(self.node(node)).get(f"{lane}_queue") or []
                if any(q.get("model_id") == model for q in queue) != enrolled:
                    return False
            return True

        wait_until(check, timeout_secs=ENROLL_TIMEOUT_SECS, what=f"enrollment = {enrolled}")

    def effective_settings(self) -> dict[str, Any]:
        with self._client() as client:
            resp = client.get("/router/v1/site/offload/settings")
        if resp.status_code != 200:
            raise RuntimeError(f"offload settings: {resp.status_code} {resp.text[:300]}")
        doc: dict[str, Any] = resp.json()
        return doc

    def setting(self, key: str) -> str:
        doc = self.effective_settings()
        for entry in doc.get("entries", []):
            if entry.get("key") == key:
                return str(entry["effective"])
        raise RuntimeError(f"no {key} in the settings: {str(doc)[:300]}")

    def decisions(self, since_ms: int) -> list[dict[str, Any]]:
        with self._client() as client:
            doc = client.get(
                "/router/v1/site/offload/decisions",
                params={"limit": str(DECISIONS_LIMIT), "since_ms": str(since_ms)},
            ).json()
        rows: list[dict[str, Any]] = doc.get("records", [])
        if "node_errors" in doc:
            # A killed or stopped node cannot answer; the others' rows still count.
            rows = [
                *rows,
                {"kind": "bench", "outcome": "node_errors", "errors": doc["node_errors"]},
            ]
        return rows

    def settled_decisions(self, since_ms: int) -> list[dict[str, Any]]:
        """Decision rows since ``since_ms`` once two reads a little apart agree."""
        deadline = time.monotonic() + DECISIONS_SETTLE_TIMEOUT_SECS
        rows = self.decisions(since_ms)
        while True:
            time.sleep(DECISIONS_SETTLE_SECS)
            again = self.decisions(since_ms)
            if len(again) == len(rows) or time.monotonic() > deadline:
                return again
            rows = again


# -- decision rows -------------------------------------------------------------------------------


def lent_rows(
    rows: Iterable[Mapping[str, Any]], owners: Collection[str]
) -> list[Mapping[str, Any]]:
    return [r for r in rows if r.get("outcome") == "lent" and r.get("node_id") in owners]


def summarize_decisions(
    rows: list[dict[str, Any]], owner: str | Collection[str], lane: str | None = None
) -> dict[str, Any]:
    """Counts and prices from one run's decision rows (plan rows on the master)."""
    owners = {owner} if isinstance(owner, str) else set(owner)
    if lane is not None:
        rows = [r for r in rows if r.get("lane") in (lane, None, "")]
    plans = [r for r in rows if r.get("kind") == "plan"]
    lent = lent_rows(rows, owners)
    granted = [r for r in plans if r.get("outcome") == "granted"]
    outcomes: dict[str, int] = {}
    for row in plans:
        key = f"{row.get('outcome')}/{row.get('reason') or '-'}"
        outcomes[key] = outcomes.get(key, 0) + 1
    other: dict[str, int] = {}
    for row in rows:
        if row.get("kind") == "plan" or row.get("outcome") == "lent":
            continue
        key = f"{row.get('kind')}:{row.get('outcome')}/{row.get('reason') or '-'}"
        other[key] = other.get(key, 0) + 1
    first_priced = next(
        (r for r in reversed(plans) if r.get("keep_ms") and r.get("service_ms")), None
    )
    return {
        "lent": len(lent),
        "max_lent_out": max((int(r.get("lent_out", 0)) for r in lent), default=0),
        "granted_slots": sorted({int(r.get("slots", 0)) for r in granted}),
        "plan_outcomes": outcomes,
        "other_outcomes": other,
        "returned": sum(1 for r in rows if r.get("outcome") == "returned"),
        "relay_refused": sum(1 for r in rows if r.get("outcome") == "relay_refused"),
        "first_priced_plan": _price_fields(first_priced),
    }


TIMELINE_LIMIT = 80


def dispatch_timeline(
    rows: Iterable[Mapping[str, Any]], start_wall_ms: int, nodes: Collection[str]
) -> list[str]:
    """The owners' dispatch rows in time order, one short line each: when (ms after the
    run started), where, what, and the counts that explain it."""
    picked = sorted(
        (r for r in rows if r.get("kind") == "dispatch" and r.get("node_id") in nodes),
        key=lambda r: (int(r.get("recorded_at", 0)), int(r.get("id", 0))),
    )
    lines = []
    for r in picked[:TIMELINE_LIMIT]:
        line = f"{int(r.get('recorded_at', 0)) - start_wall_ms:>6} {r.get('node_id')} "
        line += str(r.get("outcome"))
        for key in ("reason", "slots", "lent_out", "wait_ms", "keep_ms"):
            value = r.get(key)
            if value:
                line += f" {key}={round(value) if isinstance(value, float) else value}"
        lines.append(line)
    return lines


_SHORT = {
    "granted": "G",
    "probe": "P",
    "skipped": "S",
    "kept": "K",
}


def compact_decisions(summary: Mapping[str, Any]) -> str:
    """One table cell: plan outcomes by count, then the owner/helper rows worth seeing."""
    plans = sorted(summary.get("plan_outcomes", {}).items(), key=lambda kv: -kv[1])
    parts = []
    for key, count in plans:
        outcome, _, reason = key.partition("/")
        label = _SHORT.get(outcome, outcome) + ("" if reason == "-" else f":{reason}")
        parts.append(f"{label}x{count}")
    # Owner, helper and relay rows by outcome (reasons are in the JSON detail).
    by_name: dict[str, int] = {}
    for key, count in summary.get("other_outcomes", {}).items():
        name = key.split("/", 1)[0].split(":", 1)[1]
        if name not in ("lease_updated", "lease_cleared"):
            by_name[name] = by_name.get(name, 0) + count
    parts += [f"{name}x{count}" for name, count in sorted(by_name.items())]
    slots = summary.get("granted_slots") or []
    if slots:
        parts.append(f"slots{slots}")
    return " ".join(parts) or "no rows"


def _price_fields(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    keys = (
        "outcome",
        "reason",
        "pending_count",
        "backlog_count",
        "keep_ms",
        "switch_ms",
        "restore_ms",
        "service_ms",
        "owner_job_ms",
        "service_source",
        "helper_idle_ms",
        "slots",
    )
    return {key: _round(row.get(key, 0)) for key in keys}


def _round(value: Any) -> Any:
    return round(value, 1) if isinstance(value, float) else value


# -- per-request states on an owner -------------------------------------------------------------


# A request no longer listed: admitted to the owner's backend, or answered.
GONE = "gone"


@dataclass
class EntryTrace:
    """States one held request was seen in, keyed by its arrival time on the owner."""

    lane: str
    states: list[str] = field(default_factory=list)

    def see(self, state: str) -> None:
        if not self.states or self.states[-1] != state:
            self.states.append(state)

    @property
    def held_then_lent(self) -> bool:
        return "held" in self.states and "lent" in self.states[self.states.index("held") :]

    @property
    def held_then_owner(self) -> bool:
        """Held, then gone from the list without being lent: the owner's backend took it."""
        if "held" not in self.states:
            return False
        after = self.states[self.states.index("held") :]
        return "lent" not in after and after[-1] == GONE


async def trace_entries(
    node: RouterNode, stop: asyncio.Event, *, interval_secs: float = 0.02
) -> dict[tuple[str, float], EntryTrace]:
    """Poll the owner's held requests until ``stop`` is set: each request's state sequence.

    The decision log says a request was held but not which one was lent afterwards; the
    owner's own list does, since a request keeps its arrival time while held and lent.
    """
    traces: dict[tuple[str, float], EntryTrace] = {}
    url = node.base_url + "/router/v1/node/offload/summary"
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_SECS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            async with session.get(url, headers=AUTH_HEADERS) as resp:
                doc = await resp.json()
            listed: set[tuple[str, float]] = set()
            for row in doc.get("held_requests", []):
                key = (str(row.get("lane")), float(row.get("arrived_at", 0.0)))
                listed.add(key)
                traces.setdefault(key, EntryTrace(key[0])).see(str(row.get("state")))
            for key, trace in traces.items():
                if key not in listed:
                    trace.see(GONE)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_secs)
    return traces


async def until_lent(
    owner: RouterNode,
    done: asyncio.Event,
    *,
    t0: float,
    after_ms: float,
    timeout_secs: float,
    interval_secs: float = 0.02,
) -> bool:
    """Until, ``after_ms`` or more into the traffic (perf_counter origin ``t0``), the owner
    lists a request lent to a helper (True); False once the traffic is over or the bound
    has passed."""
    url = owner.base_url + "/router/v1/node/offload/summary"
    deadline = time.monotonic() + timeout_secs
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_SECS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not done.is_set() and time.monotonic() < deadline:
            if (time.perf_counter() - t0) * 1000.0 >= after_ms:
                async with session.get(url, headers=AUTH_HEADERS) as resp:
                    doc = await resp.json()
                if any(row.get("state") == "lent" for row in doc.get("held_requests", [])):
                    return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), interval_secs)
    return False
