"""Prices for backlog lending: what the owner needs alone, what a helper needs, who finishes first.

Pure functions over ``analytics.fitting.CostFit``: no Django, no I/O, no clock (callers pass
``now_ms``). The master's planner prices every (owner, helper) pair with these; the owner's
hold predicate compares the two finish times (reference-lending.md 2.6, 3.4, 4.5).

Every price is in milliseconds; ``None`` means "unpriced", never zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from analytics.fitting import SECTION_IMAGE, SECTION_LLM, CostFit

__all__ = [
    "LANES",
    "LANE_IMAGE",
    "LANE_TEXT",
    "SERVICE_FROM_HELPER",
    "SERVICE_FROM_OWNER",
    "CostTable",
    "Key",
    "Lane",
    "helper_finish_ms",
    "owner_demand",
    "owner_finish_ms",
    "section_fit",
    "service_price",
]

Key = tuple[str, str]  # (node_id, model_id)

LANE_IMAGE = "image"
LANE_TEXT = "text"
# The lanes lending works on, each with its own links, queue and cost model.
Lane = Literal["image", "text"]
LANES: tuple[Lane, ...] = ("image", "text")
# Fits are stored per analytics section; the text lane is priced from the "llm" section.
_LANE_SECTIONS: dict[str, str] = {LANE_IMAGE: SECTION_IMAGE, LANE_TEXT: SECTION_LLM}

SERVICE_FROM_HELPER = "helper"
SERVICE_FROM_OWNER = "owner_fallback"


@dataclass(frozen=True)
class CostTable:
    """Every node's published fits and load costs, merged by the master."""

    fits: Mapping[tuple[str, str, str], CostFit]  # (node_id, model_id, section)
    loads: Mapping[tuple[str, str], float]  # (node_id, config_filename) -> mean load ms

    def fit(self, node_id: str, model_id: str, lane: str) -> CostFit | None:
        """The duration fit of one model on one node for ``lane`` ("image" or "text")."""
        section = _LANE_SECTIONS.get(lane)
        if section is None:
            raise ValueError(f"unknown lane {lane!r}")
        return self.fits.get((node_id, model_id, section))

    def load_ms(self, node_id: str, config: str) -> float | None:
        """Mean time ``node_id`` takes to load ``config``; None when it was never measured."""
        if not config:
            return None
        return self.loads.get((node_id, config))


def section_fit(
    fits: Mapping[tuple[str, str], CostFit], lane: str, model_id: str
) -> CostFit | None:
    """A node's own fit of ``model_id`` for ``lane``, from its (model, section) table."""
    section = _LANE_SECTIONS.get(lane)
    if section is None:
        raise ValueError(f"unknown lane {lane!r}")
    return fits.get((model_id, section))


def owner_demand(
    fit: CostFit | None,
    *,
    mean_work: Sequence[float],
    backlog_count: int,
    backlog_work: Sequence[float],
) -> tuple[float | None, float | None]:
    """``(keep_ms, owner_job_ms)`` of an owner (reference-lending.md 3.4).

    ``keep_ms`` is the owner's drain time alone over its whole backlog (held plus admitted
    jobs, each admitted job counted whole); ``owner_job_ms`` is one job of the mean held work.
    The owner counts as priced only when both are numbers.
    """
    if fit is None:
        return None, None
    return fit.queue_price(backlog_count, backlog_work), fit.predict(mean_work)


def service_price(
    helper_fit: CostFit | None, owner_fit: CostFit | None, mean_work: Sequence[float]
) -> tuple[float | None, str]:
    """One lent job's price on the helper: ``(ms, "helper" | "owner_fallback" | "")``.

    The helper's own fit wins as soon as it prices the work; until then the owner's fit
    stands in, so that a helper without history can still be weighed (reference 2.6).
    Callers pass ``owner_fit`` only when the owner itself is priced.
    """
    if helper_fit is not None:
        own = helper_fit.predict(mean_work)
        if own is not None:
            return own, SERVICE_FROM_HELPER
    if owner_fit is not None:
        fallback = owner_fit.predict(mean_work)
        if fallback is not None:
            return fallback, SERVICE_FROM_OWNER
    return None, ""


def owner_finish_ms(
    *,
    now_ms: float,
    oldest_admitted_start_ms: float,
    last_own_completion_ms: float | None,
    in_flight: int,
    job_ms: float,
    this_job_ms: float | None = None,
) -> float:
    """When the owner would finish one more job admitted behind its ``in_flight`` ones.

    The running job started at the later of the oldest admitted start and the last own
    completion (the backend only starts the next job when the previous one is done); a job
    already running longer than predicted is assumed to finish now, not in the past.
    ``this_job_ms`` is the price of the job asked about (default: one ``job_ms``).
    """
    generating_since = oldest_admitted_start_ms
    if last_own_completion_ms is not None:
        generating_since = max(generating_since, last_own_completion_ms)
    first_done = max(generating_since + job_ms, now_ms)
    # With nothing admitted the hold is never consulted; count the new job alone then.
    ahead = max(in_flight, 1) - 1
    return first_done + ahead * job_ms + (job_ms if this_job_ms is None else this_job_ms)


def helper_finish_ms(
    *,
    now_ms: float,
    lent_at_ms: Iterable[float],
    switch_ms: float,
    service_ms: float,
    this_job_ms: float | None = None,
    lent_job_ms: Sequence[float] | None = None,
) -> float:
    """When the helper would finish one more job queued behind the jobs lent to it.

    The first lent job pays the switch; each later one starts when the helper is free or
    when it was lent, whichever is later. ``this_job_ms`` is the helper's price of the job
    asked about (default: one ``service_ms``); ``lent_job_ms``, in the order of
    ``lent_at_ms``, the price of each lent job (default: ``service_ms`` each): the largest
    requests are lent first, so the mean underrates what the helper still has to do.
    """
    this = service_ms if this_job_ms is None else this_job_ms
    at = list(lent_at_ms)
    each = [service_ms] * len(at) if lent_job_ms is None else list(lent_job_ms)
    lent = sorted(zip(at, each, strict=True))
    if not lent:
        return now_ms + switch_ms + this
    busy = lent[0][0] + switch_ms
    for lent_at, job_ms in lent:
        busy = max(busy, lent_at) + job_ms
    return max(busy, now_ms) + this
