"""This node's cost table, computed from exact analytics rows in the test database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from analytics.costs import node_costs_compute
from analytics.fitting import fits_from_wire
from analytics.tests.factories import LoadRecordFactory, RequestRecordFactory

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
WINDOW_SECS = 3600.0
# (prompt tokens, output tokens), both varying independently.
TEXT_JOBS = [(100, 10), (400, 20), (250, 80), (1200, 40), (60, 200)]
# (width, height, steps, count); count 0 means "one image".
IMAGE_JOBS = [(512, 512, 20, 0), (768, 768, 20, 1), (1024, 1024, 30, 1), (512, 512, 40, 2)]

pytestmark = pytest.mark.django_db


def add_request(model_id: str, lane: str, age_secs: float = 60.0, **fields: Any) -> None:
    finished = NOW - timedelta(seconds=age_secs)
    values: dict[str, Any] = {
        "node_id": "node-a",
        "model_id": model_id,
        "lane": lane,
        "success": True,
        "duration_ms": 100.0,
        "started_at": finished - timedelta(seconds=1),
        "finished_at": finished,
    }
    values.update(fields)
    RequestRecordFactory(**values)


def add_text(model_id: str, prompt: int, output: int, **fields: Any) -> None:
    fields.setdefault("duration_ms", 40.0 + 0.5 * prompt + 20.0 * output)
    fields.setdefault("prompt_bytes", 4 * prompt)
    add_request(model_id, "text", prompt_tokens=prompt, output_tokens=output, **fields)


def add_image(
    model_id: str, width: int, height: int, steps: int, count: int, **fields: Any
) -> None:
    work = width * height * steps * max(count, 1)
    fields.setdefault("duration_ms", 500.0 + 0.001 * work)
    add_request(
        model_id,
        "image",
        image_width=width,
        image_height=height,
        image_steps=steps,
        image_count=count,
        **fields,
    )


def add_load(config: str, duration_ms: float, age_secs: float = 60.0, **fields: Any) -> None:
    values: dict[str, Any] = {
        "node_id": "node-a",
        "model_id": config.split(".")[0],
        "config_filename": config,
        "lane": "text",
        "success": True,
        "duration_ms": duration_ms,
        "finished_at": NOW - timedelta(seconds=age_secs),
    }
    values.update(fields)
    LoadRecordFactory(**values)


def compute(min_samples: int) -> Any:
    return node_costs_compute(now=NOW, window_secs=WINDOW_SECS, min_samples=min_samples)


def test_text_rows_give_a_two_term_fit_keyed_by_model_and_llm_section() -> None:
    for prompt, output in TEXT_JOBS:
        add_text("llama", prompt, output)

    costs = compute(min_samples=5)

    assert set(costs.models) == {("llama", "llm")}
    fit = costs.models[("llama", "llm")]
    assert fit.samples == 5
    assert fit.base_ms == pytest.approx(40.0)
    assert fit.slopes_ms == pytest.approx((0.5, 20.0))
    assert costs.computed_at == NOW.timestamp()


def test_image_work_is_pixels_times_steps_times_at_least_one_image() -> None:
    for job in IMAGE_JOBS:
        add_image("sd-xl", *job)

    costs = compute(min_samples=4)

    fit = costs.models[("sd-xl", "image")]
    assert fit.base_ms == pytest.approx(500.0)
    assert fit.slopes_ms == pytest.approx((0.001,))
    assert fit.predict([512 * 512 * 20]) == pytest.approx(5742.88)


def test_rows_outside_the_window_failed_or_without_duration_are_ignored() -> None:
    for prompt, output in TEXT_JOBS:
        add_text("llama", prompt, output)
    # Each of these would wreck the fit (and add a sample) if it were counted.
    add_text("llama", 300, 30, duration_ms=99999.0, age_secs=WINDOW_SECS + 1)
    add_text("llama", 300, 30, duration_ms=99999.0, success=False)
    add_text("llama", 300, 30, duration_ms=0.0)
    add_text("llama", 0, 0, duration_ms=99999.0)

    fit = compute(min_samples=5).models[("llama", "llm")]

    assert fit.samples == 5
    assert fit.slopes_ms == pytest.approx((0.5, 20.0))


def test_a_row_exactly_at_the_window_edge_counts() -> None:
    for prompt, output in TEXT_JOBS[:-1]:
        add_text("llama", prompt, output)
    add_text("llama", *TEXT_JOBS[-1], age_secs=WINDOW_SECS)

    assert compute(min_samples=5).models[("llama", "llm")].samples == 5


def test_borrowed_rows_count_like_own_rows() -> None:
    for index, (prompt, output) in enumerate(TEXT_JOBS):
        add_text("llama", prompt, output, borrowed=index % 2 == 0)

    assert compute(min_samples=5).models[("llama", "llm")].samples == 5


def test_image_rows_without_a_stated_size_are_ignored() -> None:
    for job in IMAGE_JOBS:
        add_image("sd-xl", *job)
    add_image("sd-xl", 0, 512, 20, 1, duration_ms=99999.0)
    add_image("sd-xl", 512, 512, 0, 1, duration_ms=99999.0)

    fit = compute(min_samples=4).models[("sd-xl", "image")]

    assert fit.samples == 4
    assert fit.base_ms == pytest.approx(500.0)


def test_each_model_and_lane_gets_its_own_fit() -> None:
    for prompt, output in TEXT_JOBS:
        add_text("llama", prompt, output)
        add_text("qwen", prompt, output, duration_ms=10.0 + 1.0 * prompt + 2.0 * output)
    for job in IMAGE_JOBS:
        add_image("sd-xl", *job)
    # A model with too few samples stays out of the table.
    add_text("tiny", 100, 10)

    costs = compute(min_samples=4)

    assert set(costs.models) == {("llama", "llm"), ("qwen", "llm"), ("sd-xl", "image")}
    assert costs.models[("qwen", "llm")].slopes_ms == pytest.approx((1.0, 2.0))
    assert costs.models[("qwen", "llm")].base_ms == pytest.approx(10.0)


def test_loads_are_averaged_per_config_inside_the_window() -> None:
    add_load("llama.kcpps", 3000.0)
    add_load("llama.kcpps", 5000.0, lane="image")
    add_load("llama.kcpps", 90000.0, age_secs=WINDOW_SECS + 10)
    add_load("llama.kcpps", 90000.0, success=False)
    add_load("sd-xl.kcpps", 7000.0)
    add_load("zero.kcpps", 0.0)

    costs = compute(min_samples=20)

    assert costs.loads == {"llama.kcpps": 4000.0, "sd-xl.kcpps": 7000.0}


def test_token_profiles_come_from_text_rows_with_bytes_and_both_token_counts() -> None:
    for prompt, output in TEXT_JOBS:
        add_text("llama", prompt, output)
    add_text("llama", 100, 10, prompt_bytes=0)

    costs = compute(min_samples=5)

    profile = costs.tokens["llama"]
    assert profile.samples == 5
    assert profile.conservative_bytes_per_token == pytest.approx(4.0)


def test_the_table_publishes_as_its_wire_form() -> None:
    for prompt, output in TEXT_JOBS:
        add_text("llama", prompt, output)
    add_load("llama.kcpps", 3000.0)

    costs = compute(min_samples=5)

    assert fits_from_wire(costs.to_wire()) == (costs.models, costs.loads, costs.tokens)


def test_an_empty_database_gives_an_empty_table() -> None:
    costs = compute(min_samples=2)

    assert (costs.models, costs.loads, costs.tokens) == ({}, {}, {})
    assert costs.to_wire() == {"models": [], "loads": [], "tokens": []}


def test_tokens_the_prompt_cache_reused_are_not_prefill_work() -> None:
    # Each job's backend reused `cached` tokens of its prompt and paid prefill on the rest
    # only: the slope is per token processed, not per token sent.
    for (prompt, output), cached in zip(TEXT_JOBS, (0, 300, 200, 1000, 0), strict=True):
        add_text(
            "llama",
            prompt,
            output,
            cached_tokens=cached,
            duration_ms=40.0 + 0.5 * (prompt - cached) + 20.0 * output,
        )

    fit = compute(min_samples=5).models[("llama", "llm")]

    assert fit.base_ms == pytest.approx(40.0)
    assert fit.slopes_ms == pytest.approx((0.5, 20.0))


def test_streamed_bodies_a_few_tokens_longer_do_not_unprice_a_plain_model() -> None:
    # A model whose price is its base: plain bodies of 12 prompt tokens, streamed ones of 19
    # (the stream options the router adds), durations jittering by a few milliseconds with
    # the longer bodies on the fast side. Its plain backlog must stay priced.
    for i in range(12):
        streamed = i % 3 == 0
        add_text(
            "A",
            19 if streamed else 12,
            16,
            duration_ms=401.0 - (2.0 if streamed else 0.0) + (i % 2),
            stream=streamed,
        )

    fit = compute(min_samples=5).models[("A", "llm")]

    assert fit.predict((12.0, 16.0)) == pytest.approx(400.8, abs=1.0)
    assert fit.queue_price(40, (40 * 12.0, 40 * 16.0)) == pytest.approx(40 * 400.8, rel=0.01)


def test_a_uniform_text_fit_matches_within_sixteen_tokens_of_its_mean() -> None:
    # Same-sized requests: the node's own fit must carry the text floor it published, so a
    # body 16 tokens longer is still priced and one 17 tokens longer is not.
    for _ in range(5):
        add_text("A", 20, 8, duration_ms=400.0)

    fit = compute(min_samples=5).models[("A", "llm")]

    assert fit.uniform_work == (20.0, 8.0)
    assert fit.predict((36.0, 8.0)) == 400.0
    assert fit.predict((4.0, 24.0)) == 400.0
    assert fit.predict((37.0, 8.0)) is None
    assert fit.predict((20.0, 25.0)) is None


def test_a_uniform_image_fit_has_no_absolute_floor() -> None:
    # Tiny images, so that 10 % of the work (6.4) is narrower than the text floor would be.
    for _ in range(5):
        add_image("tiny", 8, 8, 1, 1, duration_ms=300.0)

    fit = compute(min_samples=5).models[("tiny", "image")]

    assert fit.uniform_work == (64.0,)
    assert fit.predict((70.0,)) == 300.0
    assert fit.predict((71.0,)) is None
