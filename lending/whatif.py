"""Recorded rows → what `lending.replay` replays, and the measured figures beside it.

Arrivals of the owner's model are its own analytics rows (each client request it ran, by
`started_at`) plus the requests a helper answered for it: those are not in the owner's
analytics (the helper records them), so each comes from the owner's `lent` decision row
(arrival = `recorded_at` - `wait_ms`). Rows that carry request IDs are matched by them: a lent
request the owner has a row for came back and ran there, and its work is the helper's row with
the same ID. Without IDs (rows of an older build), one lent row goes per `returned` row and the
helper's borrowed rows give the work in order.
Arrivals closer than `gap` seconds form one burst.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analytics.fitting import (
    MATCH_FLOOR_BY_SECTION,
    SECTION_IMAGE,
    SECTION_LLM,
    CostFit,
    fit_durations,
)
from lending.pricing import CostTable
from lending.replay import NEVER_MS, Pair, ReplaySettings, Request
from lending.settings_store import EffectiveSettings

MS = 1000.0
SECTIONS = {"text": "llm", "image": "image"}
CONTEXT_UNKNOWN = 1 << 30


@dataclass(frozen=True)
class Selection:
    lane: str
    owner_node: str
    owner_model: str
    helper_node: str
    helper_model: str


@dataclass
class Burst:
    index: int
    start: float
    end: float
    requests: list[Request]
    helper_own: list[Request]
    pair: Pair
    actual_makespan_ms: float
    actual_lent: int
    actual_helper_delay_ms: float


def replay_settings(effective: EffectiveSettings) -> ReplaySettings:
    """The settings a node runs with, as the replay takes them."""
    return ReplaySettings(
        backend_depth=effective.backend_depth,
        probe_idle_ms=effective.probe_idle_secs * MS,
        faster_slots=effective.faster_slots,
        slower_slots=effective.slower_slots,
        probe_slots=effective.probe_slots,
        grant_ttl_ms=int(effective.grant_ttl_secs * MS),
        hold_for_faster_helper=effective.hold_for_faster_helper,
    )


def _bools(column: pd.Series) -> pd.Series:
    return column.map(lambda v: v in (True, 1, "1", "true", "True"))


def pick_pair(decisions: pd.DataFrame) -> Selection | None:
    """The owner/helper pair that lent most (else the one planned most)."""
    if decisions.empty:
        return None
    for kind, outcome in (("dispatch", "lent"), ("plan", "granted"), ("plan", "probe")):
        rows = decisions[(decisions["kind"] == kind) & (decisions["outcome"] == outcome)]
        if len(rows):
            keys = ["lane", "owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id"]
            top = rows.groupby(keys).size().sort_values(ascending=False).index[0]
            return Selection(*(str(v) for v in top))
    return None


def work_of(rows: pd.DataFrame, lane: str) -> np.ndarray:
    if lane == "image":
        pixels = rows["image_width"] * rows["image_height"] * rows["image_steps"]
        return (pixels * rows["image_count"].clip(lower=1)).to_numpy(float).reshape(-1, 1)
    # The prefill a request paid for is its prompt less what the backend's prompt cache
    # reused, as in the nodes' own fits (analytics/costs.py): a cached conversation is cheap.
    prompt = rows["prompt_tokens"].to_numpy(float)
    if "cached_tokens" in rows.columns:
        cached = rows["cached_tokens"].fillna(0).to_numpy(float)
        prompt = np.maximum(prompt - cached, 0.0)
    return np.column_stack((prompt, rows["output_tokens"].to_numpy(float)))


def _fit(rows: pd.DataFrame, lane: str, min_samples: int) -> CostFit | None:
    rows = rows[_bools(rows["success"]) & (rows["duration_ms"] > 0)]
    if rows.empty:
        return None
    # The same slack as the nodes' own fits, or the replay would price what they would not.
    section = SECTION_LLM if lane == "text" else SECTION_IMAGE
    return fit_durations(
        work_of(rows, lane),
        rows["duration_ms"].to_numpy(float),
        min_samples=min_samples,
        match_floor=MATCH_FLOOR_BY_SECTION[section],
    )


def _model_rows(requests: pd.DataFrame, node: str, model: str) -> pd.DataFrame:
    return requests[(requests["node_id"] == node) & (requests["model_id"] == model)]


def _arrivals(
    requests: pd.DataFrame, decisions: pd.DataFrame, pick: Selection
) -> list[tuple[float, tuple[float, ...]]]:
    owner = _model_rows(requests, pick.owner_node, pick.owner_model)
    owner = owner[~_bools(owner["borrowed"])]
    own = [
        (float(at), tuple(float(w) for w in work))
        for at, work in zip(owner["started_at"], work_of(owner, pick.lane), strict=True)
    ]
    dispatch = decisions[
        (decisions["kind"] == "dispatch")
        & (decisions["node_id"] == pick.owner_node)
        & (decisions["owner_model_id"] == pick.owner_model)
        & (decisions["lane"] == pick.lane)
    ]
    lent = dispatch[dispatch["outcome"] == "lent"]
    helper = _model_rows(requests, pick.helper_node, pick.helper_model)
    borrowed = helper[_bools(helper["borrowed"])].sort_values("started_at")
    by_id = _lent_by_request_id(owner, lent, borrowed, pick.lane)
    if by_id is not None:
        return sorted(own + by_id)
    lent_at = sorted(
        float(r) - float(w) / MS for r, w in zip(lent["recorded_at"], lent["wait_ms"], strict=True)
    )
    # A request that came back ran on the owner and has its own row: drop its lent row.
    for returned_at in sorted(dispatch[dispatch["outcome"] == "returned"]["recorded_at"]):
        earlier = [i for i, at in enumerate(lent_at) if at <= float(returned_at)]
        if earlier:
            lent_at.pop(earlier[-1])
    works = [tuple(float(w) for w in work) for work in work_of(borrowed, pick.lane)]
    mean = (
        tuple(float(v) for v in work_of(owner, pick.lane).mean(axis=0))
        if len(owner)
        else (0.0, 0.0)
    )
    lent_arrivals = [(at, works[i] if i < len(works) else mean) for i, at in enumerate(lent_at)]
    return sorted(own + lent_arrivals)


def _lent_by_request_id(
    owner: pd.DataFrame, lent: pd.DataFrame, borrowed: pd.DataFrame, lane: str
) -> list[tuple[float, tuple[float, ...]]] | None:
    """The requests a helper answered, matched by request ID: lent, and never run by the
    owner (one that came back ran there), with the work the helper measured for that very
    request. None when the rows carry no request IDs (an older build): then order decides."""
    if "request_id" not in lent.columns or "request_id" not in owner.columns or lent.empty:
        return None
    ids = lent["request_id"].fillna("").astype(str)
    if (ids == "").any():
        return None
    ran_here = set(owner["request_id"].fillna("").astype(str))
    work: dict[str, tuple[float, ...]] = {}
    if "request_id" in borrowed.columns:
        for rid, row in zip(
            borrowed["request_id"].astype(str), work_of(borrowed, lane), strict=True
        ):
            work.setdefault(rid, tuple(float(w) for w in row))
    mean = tuple(float(v) for v in work_of(owner, lane).mean(axis=0)) if len(owner) else (0.0, 0.0)
    arrivals: dict[str, float] = {}
    for rid, recorded, waited in zip(ids, lent["recorded_at"], lent["wait_ms"], strict=True):
        if rid in ran_here:
            continue
        at = float(recorded) - float(waited) / MS
        arrivals[rid] = min(at, arrivals.get(rid, at))
    return [(at, work.get(rid, mean)) for rid, at in arrivals.items()]


def _loads_table(loads: pd.DataFrame, before: float) -> dict[tuple[str, str], float]:
    if loads.empty:
        return {}
    ok = loads[_bools(loads["success"]) & (loads["finished_at"] < before)]
    means = ok.groupby(["node_id", "config_filename"])["duration_ms"].mean()
    return {(str(n), str(c)): float(v) for (n, c), v in means.items()}


def _helper_loaded(loads: pd.DataFrame, pick: Selection, config: str, before: float) -> bool:
    if loads.empty:
        return True
    rows = loads[
        (loads["node_id"] == pick.helper_node)
        & _bools(loads["success"])
        & (loads["finished_at"] < before)
    ].sort_values("finished_at")
    if rows.empty:
        return True
    last = rows.iloc[-1]
    return bool(last["config_filename"] == config)


def bursts(
    requests: pd.DataFrame,
    decisions: pd.DataFrame,
    loads: pd.DataFrame,
    pick: Selection,
    settings: EffectiveSettings,
    gap_secs: float,
) -> list[Burst]:
    """The recorded bursts of `pick`, each with what the master knew as it began."""
    arrivals = _arrivals(requests, decisions, pick)
    if not arrivals:
        return []
    starts = [arrivals[0][0]]
    for (prev, _), (at, _) in itertools.pairwise(arrivals):
        if at - prev > gap_secs:
            starts.append(at)
    recorded = _recorded(requests, pick)
    waited = decisions[
        (decisions["kind"] == "helper")
        & (decisions["outcome"] == "native_waited_behind_borrowed")
        & (decisions["node_id"] == pick.helper_node)
    ]
    out: list[Burst] = []
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else math.inf
        base = start
        members = [
            Request((at - base) * MS, work, index) for at, work in arrivals if start <= at < end
        ]
        helper_own_rows = recorded.helper_own_rows
        own_in = helper_own_rows[
            (helper_own_rows["started_at"] >= start) & (helper_own_rows["started_at"] < end)
        ]
        helper_own = [
            Request((float(at) - base) * MS, (float(d),), index)
            for at, d in zip(own_in["started_at"], own_in["duration_ms"], strict=True)
        ]
        out.append(
            _actual(
                _pair_at(recorded, pick, settings, loads, start),
                index,
                start,
                end,
                members,
                helper_own,
                recorded.owner_rows,
                recorded.helper_rows,
                decisions,
                waited,
                pick,
            )
        )
    return out


@dataclass(frozen=True)
class _Recorded:
    """The analytics rows of a pick's two models, and what the whole record says of them."""

    owner_rows: pd.DataFrame
    helper_rows: pd.DataFrame
    helper_own_rows: pd.DataFrame
    """The helper's rows of its own requests (not borrowed ones)."""
    owner_config: str
    helper_config: str
    owner_truth: CostFit
    helper_truth: CostFit | None


def _recorded(requests: pd.DataFrame, pick: Selection) -> _Recorded:
    owner_rows = _model_rows(requests, pick.owner_node, pick.owner_model)
    helper_rows = _model_rows(requests, pick.helper_node, pick.helper_model)
    owner_truth = _fit(owner_rows, pick.lane, 2)
    if owner_truth is None:
        raise ValueError(
            f"{pick.owner_node}/{pick.owner_model} has too few successful rows to price its work"
        )
    helper_truth = _fit(helper_rows, pick.lane, 2)
    owner_config = str(owner_rows["config_filename"].iloc[0]) if len(owner_rows) else ""
    helper_config = str(helper_rows["config_filename"].iloc[0]) if len(helper_rows) else ""
    helper_own_rows = helper_rows[~_bools(helper_rows["borrowed"])]
    return _Recorded(
        owner_rows=owner_rows,
        helper_rows=helper_rows,
        helper_own_rows=helper_own_rows,
        owner_config=owner_config,
        helper_config=helper_config,
        owner_truth=owner_truth,
        helper_truth=helper_truth,
    )


def _pair_at(
    recorded: _Recorded,
    pick: Selection,
    settings: EffectiveSettings,
    loads: pd.DataFrame,
    start: float,
) -> Pair:
    """The pair as the master knew it when a burst began at `start`: the costs fitted from the
    rows finished before, the helper's loaded state and how long it had idled."""
    section = SECTIONS[pick.lane]
    before_owner = recorded.owner_rows[recorded.owner_rows["finished_at"] < start]
    before_helper = recorded.helper_rows[recorded.helper_rows["finished_at"] < start]
    fits: dict[tuple[str, str, str], CostFit] = {}
    for node, model, rows in (
        (pick.owner_node, pick.owner_model, before_owner),
        (pick.helper_node, pick.helper_model, before_helper),
    ):
        fit = _fit(rows, pick.lane, settings.min_samples) if len(rows) else None
        if fit is not None:
            fits[(node, model, section)] = fit
    helper_own_rows = recorded.helper_own_rows
    helper_before = helper_own_rows[helper_own_rows["finished_at"] < start]
    idle_ms = (
        (start - float(helper_before["finished_at"].max())) * MS if len(helper_before) else NEVER_MS
    )
    return Pair(
        lane=pick.lane,
        owner_node=pick.owner_node,
        owner_model=pick.owner_model,
        owner_config=recorded.owner_config,
        helper_node=pick.helper_node,
        helper_model=pick.helper_model,
        helper_config=recorded.helper_config,
        known=CostTable(fits=fits, loads=_loads_table(loads, start)),
        owner_truth=recorded.owner_truth,
        helper_truth=recorded.helper_truth,
        helper_loaded=_helper_loaded(loads, pick, recorded.helper_config, start),
        context_capacity=CONTEXT_UNKNOWN,
        helper_idle_ms=idle_ms,
    )


def _actual(
    pair: Pair,
    index: int,
    start: float,
    end: float,
    members: list[Request],
    helper_own: list[Request],
    owner_rows: pd.DataFrame,
    helper_rows: pd.DataFrame,
    decisions: pd.DataFrame,
    waited: pd.DataFrame,
    pick: Selection,
) -> Burst:
    own = owner_rows[
        (owner_rows["started_at"] >= start)
        & (owner_rows["started_at"] < end)
        & ~_bools(owner_rows["borrowed"])
    ]
    borrowed = helper_rows[
        (helper_rows["started_at"] >= start)
        & (helper_rows["started_at"] < end)
        & _bools(helper_rows["borrowed"])
    ]
    finished = [*own["finished_at"].tolist(), *borrowed["finished_at"].tolist()]
    makespan = (max(finished) - start) * MS if finished else math.nan
    in_window = decisions[
        (decisions["recorded_at"] >= start)
        & (decisions["recorded_at"] < end)
        & (decisions["node_id"] == pick.owner_node)
        & (decisions["owner_model_id"] == pick.owner_model)
        & (decisions["kind"] == "dispatch")
    ]
    lent = int((in_window["outcome"] == "lent").sum() - (in_window["outcome"] == "returned").sum())
    waits = waited[(waited["recorded_at"] >= start) & (waited["recorded_at"] < end)]
    delay = float(waits["wait_ms"].sum()) if len(waited) or not helper_own else math.nan
    return Burst(index, start, end, members, helper_own, pair, makespan, lent, delay)
