"""A model without a fit is refitted the moment its rows reach the threshold, not a tick later."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from analytics.costs import NodeCosts
from analytics.fitting import SECTION_LLM
from analytics.recorder import RequestSample
from analytics.tests.test_costs import TEXT_JOBS, add_text
from lending.ticker import LendingTicker

# The refit reads through database_sync_to_async, which closes the connection around each
# call: only committed rows (transaction=True) survive that.
pytestmark = pytest.mark.django_db(transaction=True)

KEY = ("m", SECTION_LLM)


def sample(prompt: int, output: int, **fields: Any) -> RequestSample:
    values: dict[str, Any] = {
        "node_id": "node-a",
        "model_id": "m",
        "config_filename": "m.kcpps",
        "lane": "text",
        "path": "/v1/chat/completions",
        "status": 200,
        "success": True,
        "stream": False,
        "prompt_bytes": 4 * prompt,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "image_width": 0,
        "image_height": 0,
        "image_steps": 0,
        "image_count": 0,
        "duration_ms": 40.0 + 0.5 * prompt + 20.0 * output,
        "started_at": 0.0,
        "finished_at": 0.0,
    }
    values.update(fields)
    return RequestSample(**values)


def ticker(min_samples: int) -> LendingTicker:
    settings = SimpleNamespace(
        refresh_interval_secs=60.0, sample_window_secs=10 * 365 * 86_400.0, min_samples=min_samples
    )
    lending = SimpleNamespace(settings=settings, listeners=[], costs=None, settings_source="local")
    return LendingTicker(SimpleNamespace(role="slave", lending=lending))


def costs(t: LendingTicker) -> NodeCosts:
    current = t.node.lending.costs
    assert current is not None
    return current


def written(t: LendingTicker, *samples: RequestSample) -> bool:
    """Hand the rows to the ticker; True when that started an early refit (awaited here)."""

    async def run() -> bool:
        before = t._early
        t.rows_written(list(samples))
        started = t._early is not before and t._early is not None
        if started:
            assert t._early is not None
            await asyncio.wait_for(t._early, 10)
        return started

    result: bool = async_to_sync(run)()
    return result


def test_the_row_that_reaches_the_threshold_refits_at_once() -> None:
    t = ticker(min_samples=len(TEXT_JOBS))
    *first, last = TEXT_JOBS
    for prompt, output in first:
        add_text("m", prompt, output, age_secs=10.0)
    async_to_sync(t.refit)()
    assert KEY not in costs(t).models and costs(t).samples[KEY] == len(first)
    # Rows the fits leave out count for nothing.
    assert not written(t, sample(100, 10, success=False), sample(0, 0))
    assert not written(t, sample(100, 10, lane="image"))
    # The row that makes the threshold: refitted now, and the model has its fit.
    add_text("m", *last, age_secs=10.0)
    assert written(t, sample(*last))
    assert KEY in costs(t).models


def test_one_row_short_waits_for_the_tick() -> None:
    t = ticker(min_samples=len(TEXT_JOBS) + 1)
    for prompt, output in TEXT_JOBS[:-1]:
        add_text("m", prompt, output, age_secs=10.0)
    async_to_sync(t.refit)()
    add_text("m", *TEXT_JOBS[-1], age_secs=10.0)
    assert not written(t, sample(*TEXT_JOBS[-1]))
    assert KEY not in costs(t).models


def test_a_model_asked_for_once_is_not_refitted_on_every_row_until_the_tick() -> None:
    # Rows that reach the threshold but fit nothing (the longer prompt ran steadily faster,
    # far beyond the rows' scatter): one early refit, then none until the tick, then one again.
    t = ticker(min_samples=3)
    async_to_sync(t.refit)()
    rows = [(100, 10, 500.0), (200, 10, 300.0), (300, 10, 101.0)]
    for prompt, output, ms in rows:
        add_text("m", prompt, output, duration_ms=ms, age_secs=10.0)
    assert written(t, *(sample(p, o, duration_ms=ms) for p, o, ms in rows))
    assert KEY not in costs(t).models
    assert not written(t, sample(100, 10))
    async_to_sync(t.tick)()
    assert written(t, sample(100, 10))


def test_no_early_refit_before_the_first_fit() -> None:
    t = ticker(min_samples=1)
    assert t.node.lending.costs is None
    assert not written(t, sample(100, 10))


def test_the_threshold_is_the_fits_own_floor() -> None:
    from analytics.costs import fit_threshold
    from analytics.fitting import MIN_FIT_SAMPLES_FLOOR

    assert fit_threshold(0) == MIN_FIT_SAMPLES_FLOOR
    assert fit_threshold(MIN_FIT_SAMPLES_FLOOR + 3) == MIN_FIT_SAMPLES_FLOOR + 3
