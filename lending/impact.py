"""What lending did: the recorded traffic of every owner that lent, measured, against the same
traffic replayed with its links removed.

Each node hands the master its rows for the window (`impact_rows`: requests, loads and the
decision rows the replay reads, columnar, times in Unix seconds). The master merges them and,
per owner model that lent, cuts the arrivals into bursts (lending/whatif.py, which also gives
each lent request its arrival at the owner and the work its helper measured), then replays them
through the real planner with the link removed (lending/replay.py, `linked=False`): the owner
alone runs every request at the cost its fit over the window says. What it compares:

* waiting: the time from each request's arrival to its answer, summed; measured from the rows
  (an own request's `finished_at`; a lent one's helper row, matched by request ID);
* makespan: per burst, from its first arrival to its last answer, summed over bursts.

The replays run under a time budget: owners left when it runs out are listed, never guessed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from lending.replay import ReplaySettings, Request, replay
from lending.settings_store import EffectiveSettings
from lending.whatif import Selection, bursts
from routerproject.errors import RouterError

__all__ = [
    "IMPACT_DECISION_COLUMNS",
    "IMPACT_LOAD_COLUMNS",
    "IMPACT_REQUEST_COLUMNS",
    "OwnerImpact",
    "impact_compute",
    "impact_minutes",
    "impact_rows",
    "impact_window",
    "merge_rows",
    "plain_summary",
]

MS = 1000.0
# Rows one node hands over per table: a day of a busy node fits; past it the answer says so.
MAX_ROWS = 200_000
# The request columns that are numbers (times and sizes), the rest are names and flags.
REQUEST_NUMBERS = (
    "started_at",
    "finished_at",
    "duration_ms",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "image_width",
    "image_height",
    "image_steps",
    "image_count",
)
IMPACT_REQUEST_COLUMNS = (
    "node_id",
    "model_id",
    "config_filename",
    "lane",
    "borrowed",
    "success",
    *REQUEST_NUMBERS,
    "request_id",
)
IMPACT_LOAD_COLUMNS = ("node_id", "config_filename", "success", "duration_ms", "finished_at")
IMPACT_DECISION_COLUMNS = (
    "kind",
    "outcome",
    "node_id",
    "lane",
    "owner_node_id",
    "owner_model_id",
    "helper_node_id",
    "helper_model_id",
    "recorded_at",
    "wait_ms",
    "request_id",
)
# Decision rows the replay reads: lent and returned requests, and the helper's own waits.
DECISION_KINDS = ("dispatch", "helper")


MAX_MINUTES = 1440


def impact_minutes(query: Mapping[str, str], default: int = 60) -> int:
    """`minutes` of the site API: 1 to a day."""
    raw = str(query.get("minutes", "") or default).strip()
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_MINUTES:
        raise RouterError(
            400, f"minutes must be a whole number from 1 to {MAX_MINUTES}", param="minutes"
        )
    return int(raw)


def impact_window(query: Mapping[str, str]) -> tuple[float, float]:
    """`(since, until)` in Unix seconds from `since_ms` and `until_ms`."""
    values: dict[str, int] = {}
    for name in ("since_ms", "until_ms"):
        raw = str(query.get(name, ""))
        if not raw.isdigit():
            raise RouterError(400, f"{name} must be a whole number", param=name)
        values[name] = int(raw)
    since, until = values["since_ms"], values["until_ms"]
    if until <= since or until - since > MAX_MINUTES * 60_000:
        raise RouterError(
            400, f"until_ms must be after since_ms, at most {MAX_MINUTES} minutes", param="until_ms"
        )
    return since / MS, until / MS


def impact_rows(
    *, since_s: float, until_s: float, fit_since_s: float | None = None
) -> dict[str, Any]:
    """This node's rows for the window, columnar and JSON-ready (the node route's answer).

    Requests and loads go back to `fit_since_s` (the nodes' own sample window): what a model
    costs is fitted over them, as the nodes fit it, even when the window holds few of its rows.
    """
    from analytics.frames import decisions_frame, loads_frame, requests_frame

    since = datetime.fromtimestamp(since_s, tz=UTC)
    fit_since = datetime.fromtimestamp(min(since_s, fit_since_s or since_s), tz=UTC)
    requests = requests_frame(fit_since)
    requests = requests[requests["started_at"] < until_s] if len(requests) else requests
    loads = loads_frame(fit_since)
    loads = loads[loads["finished_at"] < until_s] if len(loads) else loads
    decisions = decisions_frame(since)
    if len(decisions):
        decisions = decisions[
            (decisions["recorded_at"] < until_s) & decisions["kind"].isin(DECISION_KINDS)
        ]
    out: dict[str, Any] = {"truncated": False}
    for name, frame, columns in (
        ("requests", requests, IMPACT_REQUEST_COLUMNS),
        ("loads", loads, IMPACT_LOAD_COLUMNS),
        ("decisions", decisions, IMPACT_DECISION_COLUMNS),
    ):
        if len(frame) > MAX_ROWS:
            frame = frame.iloc[-MAX_ROWS:]
            out["truncated"] = True
        kept = frame.reindex(columns=list(columns))
        out[name] = {c: _plain(kept[c].tolist()) for c in columns}
    return out


def _plain(values: list[Any]) -> list[Any]:
    # NaN is not JSON: a missing value travels as null.
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values]


def merge_rows(answers: Sequence[Mapping[str, Any]]) -> dict[str, pd.DataFrame]:
    """Every node's `impact_rows` answer as one frame per table."""
    out: dict[str, pd.DataFrame] = {}
    for name, columns in (
        ("requests", IMPACT_REQUEST_COLUMNS),
        ("loads", IMPACT_LOAD_COLUMNS),
        ("decisions", IMPACT_DECISION_COLUMNS),
    ):
        parts = [
            pd.DataFrame(doc[name], columns=list(columns))
            for doc in answers
            if isinstance(doc.get(name), dict)
        ]
        parts = [p for p in parts if len(p)]
        frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
        out[name] = _typed(frame, name)
    return out


def _typed(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    numbers = {
        "requests": REQUEST_NUMBERS,
        "loads": ("duration_ms", "finished_at"),
        "decisions": ("recorded_at", "wait_ms"),
    }[name]
    for column in numbers:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").fillna(0.0).astype(float)
    return frame


@dataclass
class OwnerImpact:
    lane: str
    owner_node_id: str
    owner_model_id: str
    helpers: list[str]
    requests: int = 0
    lent: int = 0
    bursts: int = 0
    waited_ms: float = 0.0
    waited_without_ms: float = 0.0
    makespan_ms: float = 0.0
    makespan_without_ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        saved = self.waited_without_ms - self.waited_ms
        return {
            "lane": self.lane,
            "owner_node_id": self.owner_node_id,
            "owner_model_id": self.owner_model_id,
            "helpers": self.helpers,
            "requests": self.requests,
            "lent": self.lent,
            "bursts": self.bursts,
            "waited_ms": round(self.waited_ms, 1),
            "waited_without_links_ms": round(self.waited_without_ms, 1),
            "waiting_saved_ms": round(saved, 1),
            "waiting_saved_pct": _pct(saved, self.waited_without_ms),
            "makespan_ms": round(self.makespan_ms, 1),
            "makespan_without_links_ms": round(self.makespan_without_ms, 1),
            "notes": self.notes,
        }


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 1) if whole > 0 else None


def _owners(decisions: pd.DataFrame) -> list[tuple[Selection, list[str]]]:
    """Each owner model that lent in the window, with the helper it lent to most (the pair the
    replay prices) and every helper it lent to."""
    lent = decisions[(decisions["kind"] == "dispatch") & (decisions["outcome"] == "lent")]
    out: list[tuple[Selection, list[str]]] = []
    keys = ["lane", "node_id", "owner_model_id"]
    for (lane, node, model), rows in lent.groupby(keys, sort=True):
        helpers = rows.groupby(["helper_node_id", "helper_model_id"]).size()
        top = helpers.sort_values(ascending=False, kind="stable").index[0]
        pick = Selection(str(lane), str(node), str(model), str(top[0]), str(top[1]))
        names = sorted({f"{n}/{m}" for n, m in helpers.index})
        out.append((pick, names))
    return out


def _answers(requests: pd.DataFrame, decisions: pd.DataFrame, pick: Selection) -> pd.DataFrame:
    """(arrival, answer) in Unix seconds of every request of the owner's model that was
    answered: its own rows, and each lent one matched with the helper row of its request ID."""
    own = requests[
        (requests["node_id"] == pick.owner_node)
        & (requests["model_id"] == pick.owner_model)
        & ~requests["borrowed"].map(_true)
    ]
    frames = [own[["started_at", "finished_at"]].set_axis(["arrival", "answer"], axis=1)]
    lent = decisions[
        (decisions["kind"] == "dispatch")
        & (decisions["outcome"] == "lent")
        & (decisions["node_id"] == pick.owner_node)
        & (decisions["owner_model_id"] == pick.owner_model)
        & decisions["request_id"].notna()
    ]
    if len(lent):
        ran_here = set(own["request_id"].dropna().astype(str))
        arrivals = (
            lent.assign(arrival=lent["recorded_at"] - lent["wait_ms"] / MS)
            .groupby("request_id")["arrival"]
            .min()
        )
        arrivals = arrivals[~arrivals.index.isin(ran_here)]
        borrowed = requests[requests["borrowed"].map(_true) & requests["request_id"].notna()]
        answered = borrowed.groupby("request_id")["finished_at"].max()
        joined = pd.concat([arrivals, answered], axis=1, join="inner")
        frames.append(joined.set_axis(["arrival", "answer"], axis=1).reset_index(drop=True))
    return pd.concat(frames, ignore_index=True)


def _true(value: Any) -> bool:
    return value in (True, 1, "1", "true", "True")


def _owner_impact(
    frames: Mapping[str, pd.DataFrame],
    pick: Selection,
    helpers: list[str],
    settings: EffectiveSettings,
    replay_settings: ReplaySettings,
    window: tuple[float, float],
    gap_secs: float,
) -> OwnerImpact:
    result = OwnerImpact(pick.lane, pick.owner_node, pick.owner_model, helpers)
    requests, decisions = frames["requests"], frames["decisions"]
    try:
        every = bursts(requests, decisions, frames["loads"], pick, settings, gap_secs)
    except ValueError as exc:  # too few rows to price the owner's work
        result.notes.append(str(exc))
        return result
    # Rows before the window are there to fit costs from; only its own bursts are compared.
    recorded = [b for b in every if window[0] <= b.start < window[1]]
    if not recorded:
        return result
    answers = _answers(requests, decisions, pick)
    origin = recorded[0].start
    # One replay over every burst, on one clock: a backlog the owner alone would carry from one
    # burst into the next is part of what the links saved.
    shifted = [
        Request((b.start - origin) * MS + r.at_ms, r.work, b.index)
        for b in recorded
        for r in b.requests
    ]
    alone = {
        r.burst: r
        for r in replay(recorded[-1].pair, replace(replay_settings, linked=False), shifted)
    }
    for b in recorded:
        ran = answers[(answers["arrival"] >= b.start) & (answers["arrival"] < b.end)]
        without = alone.get(b.index)
        if without is None or ran.empty:
            continue
        result.bursts += 1
        result.requests += len(b.requests)
        result.lent += b.actual_lent
        result.waited_ms += float((ran["answer"] - ran["arrival"]).sum()) * MS
        result.makespan_ms += float(ran["answer"].max() - b.start) * MS
        result.waited_without_ms += without.waited_ms
        result.makespan_without_ms += without.makespan_ms
    return result


def impact_compute(
    frames: Mapping[str, pd.DataFrame],
    settings: EffectiveSettings,
    replay_settings: ReplaySettings,
    *,
    window: tuple[float, float],
    gap_secs: float,
    budget_secs: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Per owner model that lent: requests, lent, waiting and makespans, measured and replayed
    without links; and the totals. Owners not replayed within `budget_secs` are listed in
    `not_replayed`."""
    started = clock()
    owners: list[OwnerImpact] = []
    skipped: list[str] = []
    for pick, helpers in _owners(frames["decisions"]):
        if clock() - started > budget_secs:
            skipped.append(f"{pick.owner_node}/{pick.owner_model}")
            continue
        owners.append(
            _owner_impact(frames, pick, helpers, settings, replay_settings, window, gap_secs)
        )
    waited = sum(o.waited_ms for o in owners)
    without = sum(o.waited_without_ms for o in owners)
    totals = {
        "requests": sum(o.requests for o in owners),
        "lent": sum(o.lent for o in owners),
        "waited_ms": round(waited, 1),
        "waited_without_links_ms": round(without, 1),
        "waiting_saved_ms": round(without - waited, 1),
        "waiting_saved_pct": _pct(without - waited, without),
    }
    return {
        "owners": [o.as_dict() for o in owners],
        "totals": totals,
        "not_replayed": skipped,
    }


def plain_summary(totals: Mapping[str, Any], minutes: int, *, recent: bool = True) -> str:
    """The answer in one sentence: "lending saved 14 min of waiting (38 %) over the last hour"
    (a window that does not end now: "over these 90 minutes")."""
    span = _span(minutes) if recent else f"{minutes} minutes asked for"
    if not totals.get("lent"):
        return f"nothing was lent over the {span}"
    saved = float(totals.get("waiting_saved_ms") or 0.0)
    pct = totals.get("waiting_saved_pct")
    share = f" ({abs(pct):g} %)" if pct is not None else ""
    verb = "saved" if saved >= 0 else "cost"
    return f"lending {verb} {_duration(abs(saved))} of waiting{share} over the {span}"


def _span(minutes: int) -> str:
    if minutes == 60:
        return "last hour"
    if minutes % 1440 == 0:
        days = minutes // 1440
        return "last day" if days == 1 else f"last {days} days"
    if minutes % 60 == 0:
        return f"last {minutes // 60} hours"
    return "last minute" if minutes == 1 else f"last {minutes} minutes"


def _duration(ms: float) -> str:
    seconds = ms / MS
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{ms:.0f} ms"
