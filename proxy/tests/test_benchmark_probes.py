"""What a calibration sends (proxy/edge/benchmark.py): enough requests for a fit, with both
text terms varying apart from each other, sized to the model's window."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from analytics.fitting import fit_durations
from proxy.edge.benchmark import (
    IMAGE_SIDES,
    IMAGE_STEPS,
    OUTPUT_TOKENS,
    PROMPT_BYTES,
    _count,
    image_probes,
    parse_models,
    text_probes,
)
from routerproject.errors import RouterError

GRID = len(PROMPT_BYTES) * len(OUTPUT_TOKENS)


def test_a_calibration_sends_the_fit_threshold_or_one_whole_grid_whichever_is_more() -> None:
    assert _count(20, GRID) == 20
    assert _count(3, GRID) == GRID
    # The fit's own floor of two samples never lowers it below the grid.
    assert _count(2, 6) == 6


def test_text_probes_vary_prompt_and_answer_so_a_two_term_fit_separates_them() -> None:
    probes = text_probes("m", 20, 4096)
    assert len(probes) == 20
    prompts = np.array([p.sizes["prompt_bytes"] for p in probes], dtype=float)
    outputs = np.array([p.sizes["max_tokens"] for p in probes], dtype=float)
    # A model that costs 2 ms a prompt byte and 10 ms an answer token is fitted back exactly.
    durations = 50.0 + 2.0 * prompts + 10.0 * outputs
    fit = fit_durations(np.column_stack((prompts, outputs)), durations, min_samples=20)
    assert fit is not None and fit.uniform_work is None and fit.constant_work is None
    assert fit.slopes_ms == pytest.approx((2.0, 10.0))
    # No two prompts share their opening, so a backend's prompt cache reuses none of them.
    openings = {json.loads(p.body)["messages"][0]["content"][:8] for p in probes}
    assert len(openings) == len(probes)
    for probe in probes:
        doc: dict[str, Any] = json.loads(probe.body)
        assert doc["model"] == "m" and doc["max_tokens"] == probe.sizes["max_tokens"]
        content = doc["messages"][0]["content"]
        assert len(content.encode()) >= probe.sizes["prompt_bytes"]


def test_text_probes_stay_inside_a_small_context_window() -> None:
    probes = text_probes("m", 9, 256)
    assert max(p.sizes["prompt_bytes"] for p in probes) <= 128
    assert max(p.sizes["max_tokens"] for p in probes) <= 64
    # Still more than one size of each, so the fit still has two terms to tell apart.
    assert len({p.sizes["prompt_bytes"] for p in probes}) > 1
    assert len({p.sizes["max_tokens"] for p in probes}) > 1


def test_image_probes_vary_size_and_steps() -> None:
    probes = image_probes("pic", 20)
    assert len(probes) == 20
    seen = {(p.sizes["width"], p.sizes["steps"]) for p in probes}
    assert len(seen) == len(IMAGE_SIDES) * len(IMAGE_STEPS)
    doc = json.loads(probes[0].body)
    assert doc["size"] == f"{IMAGE_SIDES[0]}x{IMAGE_SIDES[0]}" and doc["steps"] == IMAGE_STEPS[0]


@pytest.mark.parametrize("value", [[], "chat", [""], [3], {"a": 1}])
def test_models_must_be_a_non_empty_list_of_names(value: Any) -> None:
    with pytest.raises(RouterError) as caught:
        parse_models(value)
    assert caught.value.status == 400 and caught.value.param == "models"


def test_no_models_means_every_model() -> None:
    assert parse_models(None) is None
    assert parse_models(["a", "b"]) == ["a", "b"]
