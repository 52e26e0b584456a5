"""This node's cost table for lending, fitted from its own analytics rows.

Raw rows never leave the node: it fits here and publishes only coefficients (``to_wire``) in
its runtime status, where the master merges every node's table. Borrowed requests count like
any other: the time this node takes for lent work is exactly what lending needs to know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db.models import Q

from analytics.fitting import (
    MATCH_FLOOR_BY_SECTION,
    MIN_FIT_SAMPLES_FLOOR,
    SECTION_IMAGE,
    SECTION_LLM,
    CostFit,
    TokenProfile,
    fit_durations,
    fits_to_wire,
    load_costs,
    token_profile,
)
from analytics.models import LoadRecord, RequestRecord
from analytics.recorder import RequestSample

__all__ = ["NodeCosts", "fit_key", "fit_threshold", "node_costs_compute"]

LANE_TEXT = "text"
LANE_IMAGE = "image"


@dataclass(frozen=True)
class NodeCosts:
    """Cost fits of one node at one moment."""

    models: dict[tuple[str, str], CostFit]
    loads: dict[str, float]
    tokens: dict[str, TokenProfile]
    # Unix seconds of the ``now`` the table was computed for.
    computed_at: float
    # Rows each fit saw (or, for a model without a fit yet, that it would have seen): how
    # many more a model needs before a refit can fit it.
    samples: dict[tuple[str, str], int] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return fits_to_wire(self.models, self.loads, self.tokens)


def _groups(model_ids: list[str]) -> list[tuple[str, np.ndarray]]:
    """Row indices per model ID, in model ID order."""
    if not model_ids:
        return []
    names, inverse = np.unique(np.asarray(model_ids, dtype=object), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(names) + 1))
    return [(str(name), order[bounds[i] : bounds[i + 1]]) for i, name in enumerate(names.tolist())]


def _text_costs(
    since: datetime, min_samples: int, samples: dict[tuple[str, str], int]
) -> tuple[dict[tuple[str, str], CostFit], dict[str, TokenProfile]]:
    rows = list(
        RequestRecord.objects.filter(
            Q(prompt_tokens__gt=0) | Q(output_tokens__gt=0),
            lane=LANE_TEXT,
            success=True,
            duration_ms__gt=0,
            finished_at__gte=since,
        ).values_list(
            "model_id",
            "prompt_bytes",
            "prompt_tokens",
            "output_tokens",
            "duration_ms",
            "cached_tokens",
        )
    )
    fits: dict[tuple[str, str], CostFit] = {}
    profiles: dict[str, TokenProfile] = {}
    if not rows:
        return fits, profiles
    model_ids = [row[0] for row in rows]
    numbers = np.array([row[1:] for row in rows], dtype=np.float64)
    for model_id, index in _groups(model_ids):
        samples[(model_id, SECTION_LLM)] = len(index)
        part = numbers[index]
        # The prefill a request paid for is its prompt less what the backend's prompt cache
        # reused: fitted on whole prompts, a cached conversation would flatten the slope.
        work = np.column_stack((np.maximum(part[:, 1] - part[:, 4], 0.0), part[:, 2]))
        fit = fit_durations(
            work,
            part[:, 3],
            min_samples=min_samples,
            match_floor=MATCH_FLOOR_BY_SECTION[SECTION_LLM],
        )
        if fit is not None:
            fits[(model_id, SECTION_LLM)] = fit
        profile = token_profile(part[:, 0], part[:, 1], part[:, 2], min_samples=min_samples)
        if profile is not None:
            profiles[model_id] = profile
    return fits, profiles


def _image_costs(
    since: datetime, min_samples: int, samples: dict[tuple[str, str], int]
) -> dict[tuple[str, str], CostFit]:
    rows = list(
        RequestRecord.objects.filter(
            lane=LANE_IMAGE,
            success=True,
            duration_ms__gt=0,
            finished_at__gte=since,
            image_width__gt=0,
            image_height__gt=0,
            image_steps__gt=0,
        ).values_list(
            "model_id", "image_width", "image_height", "image_steps", "image_count", "duration_ms"
        )
    )
    fits: dict[tuple[str, str], CostFit] = {}
    if not rows:
        return fits
    model_ids = [row[0] for row in rows]
    numbers = np.array([row[1:] for row in rows], dtype=np.float64)
    # A request that does not state its image count made one image.
    work = numbers[:, 0] * numbers[:, 1] * numbers[:, 2] * np.maximum(numbers[:, 3], 1.0)
    for model_id, index in _groups(model_ids):
        samples[(model_id, SECTION_IMAGE)] = len(index)
        fit = fit_durations(
            work[index].reshape(-1, 1),
            numbers[index, 4],
            min_samples=min_samples,
            match_floor=MATCH_FLOOR_BY_SECTION[SECTION_IMAGE],
        )
        if fit is not None:
            fits[(model_id, SECTION_IMAGE)] = fit
    return fits


def node_costs_compute(*, now: datetime, window_secs: float, min_samples: int) -> NodeCosts:
    """Fit this node's costs from the rows that finished within ``window_secs`` before ``now``."""
    since = now - timedelta(seconds=window_secs)
    samples: dict[tuple[str, str], int] = {}
    models, tokens = _text_costs(since, min_samples, samples)
    models.update(_image_costs(since, min_samples, samples))
    # Every successful load counts, also one never followed by a generation: a helper that
    # was only ever loaded still has a switch cost.
    load_rows = LoadRecord.objects.filter(
        success=True, duration_ms__gt=0, finished_at__gte=since
    ).values_list("config_filename", "duration_ms")
    loads = load_costs(load_rows)
    return NodeCosts(
        models=models, loads=loads, tokens=tokens, computed_at=now.timestamp(), samples=samples
    )


def fit_threshold(min_samples: int) -> int:
    """The rows a model needs before `fit_durations` tries to fit it."""
    return max(MIN_FIT_SAMPLES_FLOOR, min_samples)


def fit_key(sample: RequestSample) -> tuple[str, str] | None:
    """The fit a newly recorded row counts toward, or None for a row the fits leave out (the
    same filters as the queries above)."""
    if not sample.success or sample.duration_ms <= 0:
        return None
    if sample.lane == LANE_TEXT and (sample.prompt_tokens > 0 or sample.output_tokens > 0):
        return (sample.model_id, SECTION_LLM)
    image = sample.image_width > 0 and sample.image_height > 0 and sample.image_steps > 0
    if sample.lane == LANE_IMAGE and image:
        return (sample.model_id, SECTION_IMAGE)
    return None
