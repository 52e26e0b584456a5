"""Lending over time, for the Lending tab's timeline: did lending pay?

Each node answers from its own database, in equal buckets the master chose so every node's
series line up:

* the node: how much of each bucket its backends' slots spent on its own requests and on
  borrowed ones, and how many of its requests it lent (its `lent` decision rows). A request's
  backend time is the `duration_ms` that ends at its `finished_at` (the backend's own time;
  time in the router queue or waiting for a load is not in it), and a lane never counts more
  than its slots at once, so own + borrowed + idle is exactly `slots` times the bucket;
* each owner it knows of: the deepest hold the master planned with in the bucket (`plan` rows'
  held count, on the master) and how many requests it lent (`lent` rows, on the owner).

The master merges the answers (`merge_timelines`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from routerproject.errors import RouterError

MAX_BUCKETS = 240
MIN_STEP_MS = 1000


def timeline_window(
    query: Mapping[str, str], *, now_ms: int, default_minutes: int = 15, buckets: int = 60
) -> tuple[int, int, int]:
    """`(since_ms, until_ms, step_ms)` from `minutes` (1 to 1440) or an explicit window.

    A node asked by its master gets `since_ms`, `until_ms` and `step_ms` and uses them as
    they are, so every node's buckets line up.
    """
    if "step_ms" in query:
        values = {}
        for name in ("since_ms", "until_ms", "step_ms"):
            raw = query.get(name, "")
            if not raw.isdigit():
                raise RouterError(400, f"{name} must be a whole number", param=name)
            values[name] = int(raw)
        since, until, step = values["since_ms"], values["until_ms"], values["step_ms"]
        if step < MIN_STEP_MS or until <= since or (until - since) / step > MAX_BUCKETS:
            raise RouterError(
                400,
                f"step_ms must be at least {MIN_STEP_MS} and the window at most "
                f"{MAX_BUCKETS} steps, with until_ms after since_ms",
                param="step_ms",
            )
        return since, until, step
    raw = query.get("minutes", "").strip() or str(default_minutes)
    if not raw.isdigit() or not 1 <= int(raw) <= 1440:
        raise RouterError(400, "minutes must be a whole number from 1 to 1440", param="minutes")
    span = int(raw) * 60_000
    step = max(MIN_STEP_MS, span // buckets)
    # Buckets end on a whole step, so two refreshes a second apart show the same buckets.
    until = (now_ms // step + 1) * step
    return until - step * math.ceil(span / step), until, step


def _spread(
    series: list[float], since: int, step: int, start_ms: float, end_ms: float, rate: float = 1.0
) -> None:
    """Add the part of [start_ms, end_ms] inside each bucket, times `rate`, to that bucket."""
    n = len(series)
    first = max(0, int((start_ms - since) // step))
    last = min(n - 1, int((end_ms - since) // step))
    for i in range(first, last + 1):
        lo, hi = since + i * step, since + (i + 1) * step
        overlap = min(hi, end_ms) - max(lo, start_ms)
        if overlap > 0:
            series[i] += overlap * rate


def _bucket(since: int, step: int, n: int, at_ms: int) -> int | None:
    i = (at_ms - since) // step
    return int(i) if 0 <= i < n else None


def lane_slots(configs: Iterable[Any]) -> dict[str, int]:
    """Each lane's backend slots on a node with these model configs: the text lane (chat,
    embeddings and speech) runs as many requests at once as its widest config's `parallel`;
    sd-server and whisper-server run one."""
    slots: dict[str, int] = {}
    for cfg in configs:
        if cfg.has_llm or cfg.has_embeddings or cfg.has_tts:
            slots["text"] = max(slots.get("text", 1), cfg.parallel or 1)
        if cfg.has_image:
            slots["image"] = 1
        if cfg.has_voice:
            slots["whisper"] = 1
    return slots


def timeline_local(
    *,
    node_id: str,
    since_ms: int,
    until_ms: int,
    step_ms: int,
    slots: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """This node's series for the window (its own database only). `slots` is each lane's
    backend slots (a lane not named there, or with no slots given, has one)."""
    n = math.ceil((until_ms - since_ms) / step_ms)
    lanes = {lane: max(1, int(count)) for lane, count in (slots or {}).items()}
    own, borrowed = _busy_ms(node_id, since_ms, until_ms, step_ms, n, lanes)
    lent, owners = _lending(node_id, since_ms, until_ms, step_ms, n)
    own_ms = [round(v) for v in own]
    borrowed_ms = [round(v) for v in borrowed]
    capacity = sum(lanes.values()) * step_ms
    return {
        "since_ms": since_ms,
        "until_ms": until_ms,
        "step_ms": step_ms,
        "node": {
            "node_id": node_id,
            "slots": sum(lanes.values()),
            "own_ms": own_ms,
            "borrowed_ms": borrowed_ms,
            # What is left of the slots' time, so the three parts always add up to it.
            "idle_ms": [max(0, capacity - a - b) for a, b in zip(own_ms, borrowed_ms, strict=True)],
            "lent": lent,
        },
        "owners": [owners[k] for k in sorted(owners)],
    }


def _busy_ms(
    node_id: str, since_ms: int, until_ms: int, step_ms: int, n: int, lanes: dict[str, int]
) -> tuple[list[float], list[float]]:
    """Milliseconds of each bucket this node's backend slots spent on its own requests and on
    borrowed ones. `lanes` gains a one-slot entry for a lane a row names that it lacks."""
    from analytics.models import RequestRecord

    own = [0.0] * n
    borrowed = [0.0] * n
    since_dt = datetime.fromtimestamp(since_ms / 1000, tz=UTC)
    until_dt = datetime.fromtimestamp(until_ms / 1000, tz=UTC)
    rows = RequestRecord.objects.filter(
        node_id=node_id, finished_at__gte=since_dt, started_at__lt=until_dt
    ).values_list("lane", "finished_at", "duration_ms", "borrowed")
    by_lane: dict[str, list[tuple[float, float, bool]]] = {}
    for lane, finished, duration, was_borrowed in rows.iterator():
        end = finished.timestamp() * 1000
        by_lane.setdefault(lane, []).append((end - max(0.0, duration), end, was_borrowed))
    for lane, intervals in by_lane.items():
        slots = lanes.setdefault(lane, 1)
        for start, end, own_rate, borrowed_rate in _busy_segments(intervals, slots):
            _spread(own, since_ms, step_ms, start, end, own_rate)
            _spread(borrowed, since_ms, step_ms, start, end, borrowed_rate)
    return own, borrowed


def _busy_segments(
    intervals: Iterable[tuple[float, float, bool]], slots: int
) -> list[tuple[float, float, float, float]]:
    """`(start, end, own rate, borrowed rate)` for each stretch between two request edges.

    The rates are busy slots: the requests running then, at most `slots` of them, split
    between own and borrowed in proportion. A row whose duration overstates its backend time
    (a failure, which records the client's wait) can therefore never fill more than the lane.
    """
    edges: list[tuple[float, int, bool]] = []
    for start, end, was_borrowed in intervals:
        if end > start:
            edges += [(start, 1, was_borrowed), (end, -1, was_borrowed)]
    edges.sort(key=lambda e: (e[0], e[1]))
    segments: list[tuple[float, float, float, float]] = []
    running = {False: 0, True: 0}
    last = 0.0
    for at, change, was_borrowed in edges:
        total = running[False] + running[True]
        if total and at > last:
            busy = min(total, slots)
            segments.append((last, at, busy * running[False] / total, busy * running[True] / total))
        running[was_borrowed] += change
        last = at
    return segments


def _lending(
    node_id: str, since_ms: int, until_ms: int, step_ms: int, n: int
) -> tuple[list[int], dict[tuple[str, str, str], dict[str, Any]]]:
    """How many of this node's requests it lent in each bucket, and each owner's series from
    the decision rows here: the deepest hold planned and the requests lent."""
    from lending.models import OffloadDecision

    lent = [0] * n
    owners: dict[tuple[str, str, str], dict[str, Any]] = {}

    def owner(row_node: str, model: str, lane: str) -> dict[str, Any]:
        key = (row_node, model, lane)
        if key not in owners:
            owners[key] = {
                "owner_node_id": row_node,
                "owner_model_id": model,
                "lane": lane,
                "held_max": [0] * n,
                "lent": [0] * n,
            }
        return owners[key]

    rows = OffloadDecision.objects.filter(
        recorded_at__gte=since_ms, recorded_at__lt=until_ms
    ).filter(kind__in=("plan", "dispatch"))
    for kind, outcome, at, owner_node, owner_model, lane, pending in rows.values_list(
        "kind",
        "outcome",
        "recorded_at",
        "owner_node_id",
        "owner_model_id",
        "lane",
        "pending_count",
    ).iterator():
        i = _bucket(since_ms, step_ms, n, at)
        if i is None or not owner_model:
            continue
        if kind == "dispatch" and outcome == "lent":
            owner(owner_node, owner_model, lane)["lent"][i] += 1
            if owner_node == node_id:
                lent[i] += 1
        elif kind == "plan":
            entry = owner(owner_node, owner_model, lane)
            entry["held_max"][i] = max(entry["held_max"][i], pending)
    return lent, owners


def merge_timelines(
    answers: Mapping[str, Mapping[str, Any]], *, since_ms: int, until_ms: int, step_ms: int
) -> dict[str, Any]:
    """Every node's answer as one document: the nodes side by side, owners merged.

    An owner's held depth is the deepest any answer saw; its lent count is the sum (the owner
    records its own `lent` rows; no row is in two databases).
    """
    n = math.ceil((until_ms - since_ms) / step_ms)
    nodes: list[dict[str, Any]] = []
    owners: dict[tuple[str, str, str], dict[str, Any]] = {}
    for doc in answers.values():
        if (doc.get("since_ms"), doc.get("until_ms"), doc.get("step_ms")) != (
            since_ms,
            until_ms,
            step_ms,
        ):
            continue  # a node that bucketed otherwise cannot be drawn on the same axis
        node = doc.get("node")
        if isinstance(node, dict):
            nodes.append(node)
        for o in doc.get("owners", []):
            key = (o["owner_node_id"], o["owner_model_id"], o["lane"])
            have = owners.get(key)
            if have is None:
                owners[key] = {**o, "held_max": list(o["held_max"]), "lent": list(o["lent"])}
                continue
            have["held_max"] = [
                max(a, b) for a, b in zip(have["held_max"], o["held_max"], strict=True)
            ]
            have["lent"] = [a + b for a, b in zip(have["lent"], o["lent"], strict=True)]
    nodes.sort(key=lambda d: str(d.get("node_id", "")))
    return {
        "since_ms": since_ms,
        "until_ms": until_ms,
        "step_ms": step_ms,
        "buckets": n,
        "nodes": nodes,
        "owners": [owners[k] for k in sorted(owners)],
    }
