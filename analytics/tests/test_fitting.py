"""Cost fits, load costs and token profiles: the reference rules with exact numbers."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from analytics.fitting import (
    TEXT_MATCH_FLOOR_TOKENS,
    CostFit,
    TokenProfile,
    fit_durations,
    fits_from_wire,
    fits_to_wire,
    load_costs,
    token_profile,
)

# Image sizes (width, height, steps, count) with plenty of spread in pixels*steps*count.
IMAGE_JOBS = [
    (512, 512, 20, 1),
    (768, 768, 20, 1),
    (1024, 1024, 30, 1),
    (512, 512, 40, 2),
    (640, 448, 25, 1),
    (1024, 768, 10, 4),
]
# (prompt tokens, output tokens): both terms vary and are not proportional to each other.
TEXT_JOBS = [(100, 10), (400, 20), (250, 80), (1200, 40), (60, 200), (800, 150), (30, 5)]


def image_work() -> np.ndarray:
    return np.array([[w * h * s * max(c, 1)] for w, h, s, c in IMAGE_JOBS], dtype=float)


def text_work() -> np.ndarray:
    return np.array(TEXT_JOBS, dtype=float)


def column(values: list[float]) -> np.ndarray:
    return np.array(values, dtype=float).reshape(-1, 1)


# -- fitted case ----------------------------------------------------------------------------


def test_it_recovers_the_base_and_slope_of_an_image_model() -> None:
    work = image_work()
    durations = 500.0 + 0.001 * work[:, 0]

    fit = fit_durations(work, durations, min_samples=6)

    assert fit is not None
    assert fit.base_ms == pytest.approx(500.0, rel=1e-9)
    assert fit.slopes_ms == pytest.approx((0.001,), rel=1e-9)
    assert fit.samples == 6
    assert fit.uniform_work is None
    # 512x512, 20 steps, one image: 500 + 0.001 * 5_242_880
    assert fit.predict([512 * 512 * 20]) == pytest.approx(5742.88, rel=1e-9)


def test_it_recovers_prefill_and_decode_slopes_of_a_text_model() -> None:
    work = text_work()
    durations = 40.0 + 0.5 * work[:, 0] + 20.0 * work[:, 1]

    fit = fit_durations(work, durations, min_samples=7)

    assert fit is not None
    assert fit.base_ms == pytest.approx(40.0, rel=1e-9)
    assert fit.slopes_ms == pytest.approx((0.5, 20.0), rel=1e-9)
    assert fit.predict([1000, 100]) == pytest.approx(40.0 + 500.0 + 2000.0, rel=1e-9)


def test_it_recovers_text_slopes_from_noisy_samples() -> None:
    rng = np.random.default_rng(7)
    work = np.column_stack([rng.integers(10, 4000, 2000), rng.integers(1, 500, 2000)])
    durations = 40.0 + 0.5 * work[:, 0] + 20.0 * work[:, 1] + rng.normal(0.0, 5.0, 2000)

    fit = fit_durations(work, durations, min_samples=20)

    assert fit is not None
    assert fit.base_ms == pytest.approx(40.0, abs=1.0)
    assert fit.slopes_ms == pytest.approx((0.5, 20.0), rel=1e-3)


def test_it_prices_a_queue_as_count_times_base_plus_slopes_times_total_work() -> None:
    fit = CostFit(base_ms=40.0, slopes_ms=(0.5, 20.0), samples=30)

    assert fit.queue_price(3, [600, 30]) == pytest.approx(3 * 40.0 + 300.0 + 600.0)
    assert fit.queue_price(0, [600, 30]) == 0.0
    assert fit.queue_price(-1, []) == 0.0


def test_it_does_not_price_work_of_the_wrong_arity() -> None:
    fit = CostFit(base_ms=500.0, slopes_ms=(0.001,), samples=30)

    assert fit.predict([100, 20]) is None
    assert fit.predict([]) is None
    assert fit.queue_price(2, [100, 20]) is None
    assert fit.predict([math.nan]) is None


def test_it_treats_negative_work_as_zero_when_predicting() -> None:
    fit = CostFit(base_ms=500.0, slopes_ms=(0.001,), samples=30)

    assert fit.predict([-1000]) == 500.0


# -- sample count ---------------------------------------------------------------------------


def test_it_leaves_a_model_with_too_few_samples_unpriced() -> None:
    work = text_work()
    durations = 40.0 + 0.5 * work[:, 0] + 20.0 * work[:, 1]

    assert fit_durations(work, durations, min_samples=8) is None
    assert fit_durations(work, durations, min_samples=7) is not None


def test_it_floors_min_samples_at_two() -> None:
    one = fit_durations(column([100.0]), np.array([150.0]), min_samples=1)
    two = fit_durations(column([100.0, 200.0]), np.array([150.0, 250.0]), min_samples=1)

    assert one is None
    assert two is not None
    assert two.base_ms == pytest.approx(50.0)
    assert two.slopes_ms == pytest.approx((1.0,))


def test_it_excludes_rows_without_duration_or_work_before_counting() -> None:
    work = column([100.0, 200.0, 0.0, 300.0, 400.0])
    durations = np.array([150.0, 250.0, 999.0, 0.0, -5.0])

    assert fit_durations(work, durations, min_samples=3) is None
    fit = fit_durations(work, durations, min_samples=2)
    assert fit is not None
    assert fit.samples == 2
    assert fit.base_ms == pytest.approx(50.0)


# -- uniform and narrow spread --------------------------------------------------------------


def test_uniform_work_is_priced_at_its_mean_for_that_work_only() -> None:
    size = 512.0 * 512.0 * 20.0
    fit = fit_durations(
        column([size] * 4), np.array([900.0, 1000.0, 1100.0, 1000.0]), min_samples=4
    )

    assert fit is not None
    assert fit.base_ms == pytest.approx(1000.0)
    assert fit.slopes_ms == (0.0,)
    assert fit.uniform_work == pytest.approx((size,))
    assert fit.predict([size]) == pytest.approx(1000.0)
    assert fit.predict([size * 1.1]) == pytest.approx(1000.0)
    assert fit.predict([size * 1.2]) is None
    assert fit.predict([size * 0.8]) is None


def test_a_uniform_queue_is_priced_only_when_its_mean_work_matches() -> None:
    fit = CostFit(base_ms=1000.0, slopes_ms=(0.0,), samples=4, uniform_work=(5000.0,))

    assert fit.queue_price(3, [15000.0]) == pytest.approx(3000.0)
    # Mean 5250, within 10 % of 5000.
    assert fit.queue_price(2, [10500.0]) == pytest.approx(2000.0)
    # Mean 6000: 20 % off.
    assert fit.queue_price(2, [12000.0]) is None
    assert fit.queue_price(0, [12000.0]) == 0.0


def test_uniform_text_work_must_match_in_every_term() -> None:
    work = np.array([[200.0, 50.0]] * 5)
    fit = fit_durations(work, np.full(5, 800.0), min_samples=5)

    assert fit is not None
    assert fit.uniform_work == pytest.approx((200.0, 50.0))
    assert fit.slopes_ms == (0.0, 0.0)
    assert fit.predict([210, 52]) == pytest.approx(800.0)
    assert fit.predict([200, 60]) is None


def test_a_spread_just_below_the_threshold_counts_as_uniform() -> None:
    # n = 2: D = (a - b)^2 = 100 < (0.05 * 210)^2 = 110.25
    fit = fit_durations(column([100.0, 110.0]), np.array([300.0, 320.0]), min_samples=2)

    assert fit is not None
    assert fit.uniform_work == pytest.approx((105.0,))
    assert fit.base_ms == pytest.approx(310.0)


def test_a_spread_just_above_the_threshold_is_fitted() -> None:
    # n = 2: D = 11^2 = 121 >= (0.05 * 211)^2 = 111.3
    fit = fit_durations(column([100.0, 111.0]), np.array([300.0, 322.0]), min_samples=2)

    assert fit is not None
    assert fit.uniform_work is None
    assert fit.slopes_ms == pytest.approx((2.0,))
    assert fit.base_ms == pytest.approx(100.0)


def test_narrow_spread_in_both_text_terms_counts_as_uniform() -> None:
    work = np.array([[1000.0, 100.0], [1010.0, 101.0], [990.0, 99.0], [1000.0, 100.0]])
    fit = fit_durations(work, np.array([600.0, 610.0, 590.0, 600.0]), min_samples=4)

    assert fit is not None
    assert fit.uniform_work == pytest.approx((1000.0, 100.0))
    assert fit.base_ms == pytest.approx(600.0)


def test_a_constant_prompt_with_varying_output_fits_the_output_alone() -> None:
    # Template traffic: one prompt, answers of many lengths. The prompt's cost (150 ms) is
    # inside the base; the fit prices work whose prompt matches the one it saw.
    outputs = [10.0, 50.0, 100.0, 200.0, 400.0]
    work = np.array([[300.0, o] for o in outputs])
    durations = np.array([40.0 + 150.0 + 20.0 * o for o in outputs])

    fit = fit_durations(work, durations, min_samples=5, match_floor=16.0)

    assert fit is not None
    assert fit.uniform_work is None
    assert fit.constant_work == (300.0, None)
    assert fit.base_ms == pytest.approx(190.0)
    assert fit.slopes_ms == pytest.approx((0.0, 20.0))
    assert fit.predict((300.0, 77.0)) == pytest.approx(190.0 + 20.0 * 77)
    # Outputs never seen are extrapolated along the fitted term.
    assert fit.predict((300.0, 1000.0)) == pytest.approx(190.0 + 20.0 * 1000)
    # 10 % of 300 tokens (30) is wider than the 16-token floor.
    assert fit.predict((330.0, 10.0)) is not None
    assert fit.predict((331.0, 10.0)) is None
    assert fit.predict((269.0, 10.0)) is None
    # A queue is priced when its mean prompt matches: 3 jobs of 300 tokens, 60 output tokens.
    assert fit.queue_price(3, (900.0, 60.0)) == pytest.approx(3 * 190.0 + 20.0 * 60)
    assert fit.queue_price(3, (1000.0, 60.0)) is None


def test_a_short_constant_term_matches_within_the_absolute_floor() -> None:
    outputs = [10.0, 50.0, 100.0]
    work = np.array([[40.0, o] for o in outputs])
    durations = np.array([100.0 + 2.0 * o for o in outputs])

    fit = fit_durations(work, durations, min_samples=3, match_floor=16.0)
    unfloored = fit_durations(work, durations, min_samples=3)

    assert fit is not None and unfloored is not None
    # 10 % of 40 is 4 tokens; the floor widens the match to 16.
    assert fit.predict((56.0, 10.0)) == pytest.approx(120.0)
    assert fit.predict((24.0, 10.0)) == pytest.approx(120.0)
    assert fit.predict((57.0, 10.0)) is None
    assert unfloored.predict((44.0, 10.0)) == pytest.approx(120.0)
    assert unfloored.predict((45.0, 10.0)) is None


def test_a_uniform_text_fit_prices_a_few_tokens_more_or_less() -> None:
    # Same-sized warm-up requests, then a request three tokens longer: still priced.
    work = np.array([[20.0, 8.0]] * 4)
    fit = fit_durations(work, np.array([400.0] * 4), min_samples=3, match_floor=16.0)

    assert fit is not None and fit.uniform_work == (20.0, 8.0)
    assert fit.predict((23.0, 11.0)) == pytest.approx(400.0)
    assert fit.predict((36.0, 24.0)) == pytest.approx(400.0)
    assert fit.predict((37.0, 8.0)) is None
    assert fit.predict((20.0, 25.0)) is None


def test_a_term_that_is_always_zero_next_to_a_varying_one_is_fitted_alone() -> None:
    work = np.array([[100.0, 0.0], [400.0, 0.0], [900.0, 0.0]])

    fit = fit_durations(work, np.array([90.0, 240.0, 490.0]), min_samples=3)

    assert fit is not None
    assert fit.constant_work == (None, 0.0)
    assert fit.base_ms == pytest.approx(40.0)
    assert fit.slopes_ms == pytest.approx((0.5, 0.0))
    assert fit.predict((200.0, 0.0)) == pytest.approx(140.0)
    # Work the fit never saw on the constant term is not priced.
    assert fit.predict((200.0, 5.0)) is None


# -- rejected fits --------------------------------------------------------------------------


def test_a_negative_slope_is_unpriced() -> None:
    work = column([100.0, 200.0, 300.0, 400.0])
    durations = np.array([900.0, 800.0, 700.0, 600.0])

    assert fit_durations(work, durations, min_samples=4) is None


def noisy_prompt_rows(slope: float) -> tuple[np.ndarray, np.ndarray]:
    # Plain bodies of 40 prompt tokens and streamed ones of 50 (the stream options the router
    # adds), one answer length; durations around 1000 ms fall by ``slope`` per prompt token.
    prompts = [40.0, 50.0] * 4
    work = np.array([[p, 30.0] for p in prompts])
    durations = np.array([1000.0 - slope * (p - 45.0) for p in prompts])
    return work, durations


def test_a_term_with_a_negative_slope_within_noise_is_treated_as_constant() -> None:
    # Over the 10 tokens the prompt spanned, 0.49 ms per token is 4.9 ms: under 5 % of the
    # 1000 ms mean, so noise. The model stays priced for the work it saw.
    work, durations = noisy_prompt_rows(0.49 * 10)

    fit = fit_durations(work, durations, min_samples=4, match_floor=16.0)

    assert fit is not None
    assert fit.uniform_work == pytest.approx((45.0, 30.0))
    assert fit.slopes_ms == (0.0, 0.0)
    assert fit.predict((40.0, 30.0)) == pytest.approx(1000.0)
    assert fit.predict((50.0, 30.0)) == pytest.approx(1000.0)
    assert fit.queue_price(40, (40 * 40.0, 40 * 30.0)) == pytest.approx(40_000.0)


def test_a_negative_slope_beyond_the_noise_share_is_unpriced() -> None:
    # 5.1 ms per token over 10 tokens is 51 ms, over 5 % of the mean: jobs really got faster.
    work, durations = noisy_prompt_rows(0.51 * 10)

    assert fit_durations(work, durations, min_samples=4, match_floor=16.0) is None


def test_a_noise_term_becomes_a_condition_beside_a_fitted_term() -> None:
    # Prompt noise next to answers of many lengths: the answers are fitted, the prompt is
    # held to what was seen, as for a template.
    outputs = [10.0, 50.0, 100.0, 200.0, 10.0, 50.0, 100.0, 200.0]
    prompts = [40.0, 40.0, 40.0, 40.0, 50.0, 50.0, 50.0, 50.0]
    work = np.array(list(zip(prompts, outputs, strict=True)))
    durations = np.array([40.0 + 20.0 * o - 0.3 * (p - 45.0) for p, o in work])

    fit = fit_durations(work, durations, min_samples=8, match_floor=16.0)

    assert fit is not None
    assert fit.constant_work == (pytest.approx(45.0), None)
    assert fit.slopes_ms[0] == 0.0
    assert fit.slopes_ms[1] == pytest.approx(20.0)
    assert fit.predict((40.0, 70.0)) == pytest.approx(40.0 + 20.0 * 70)
    assert fit.predict((200.0, 70.0)) is None


def ols(work: np.ndarray, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # The textbook fit, independent of the fitter's scaling and elimination: coefficients
    # (base first) and their standard errors, sqrt(diag(RSS / (n - p) * (D^T D)^-1)).
    design = np.column_stack([np.ones(len(durations)), work])
    coefficients, rss, *_ = np.linalg.lstsq(design, durations, rcond=None)
    freedom = design.shape[0] - design.shape[1]
    covariance = rss[0] / freedom * np.linalg.inv(design.T @ design)
    return coefficients, np.sqrt(np.diag(covariance))


# Plain requests of 33 prompt tokens and three streamed ones of 46 (the stream options the
# router adds), answers of many lengths at 2 ms a token, the plain ones 10 ms slower, timing
# jitter of a loaded machine on top.
FLAKE_PROMPTS = [33.0, 33.0, 33.0, 46.0, 33.0, 33.0, 33.0, 46.0, 33.0, 33.0, 46.0, 33.0]
FLAKE_OUTPUTS = [12.0, 20.0, 31.0, 40.0, 16.0, 25.0, 36.0, 44.0, 18.0, 28.0, 14.0, 38.0]
FLAKE_JITTER_MS = [9.0, -11.5, 3.5, -6.0, -13.0, 12.0, -4.0, 7.5, 15.0, -2.5, -4.0, -7.0]


def flake_rows(jitter_scale: float) -> tuple[np.ndarray, np.ndarray]:
    work = np.array(list(zip(FLAKE_PROMPTS, FLAKE_OUTPUTS, strict=True)))
    durations = np.array(
        [
            60.0 + 2.0 * o + (10.0 if p == 33.0 else 0.0) + jitter_scale * e
            for p, o, e in zip(FLAKE_PROMPTS, FLAKE_OUTPUTS, FLAKE_JITTER_MS, strict=True)
        ]
    )
    return work, durations


def test_a_negative_slope_lost_in_the_scatter_is_noise_though_its_effect_is_large() -> None:
    work, durations = flake_rows(1.0)
    (_, prompt_slope, _), (_, prompt_error, _) = ols(work, durations)
    # -0.8194 ms a token over 13 tokens is 10.65 ms, beyond 5 % of the 121.08 ms mean (6.05):
    # the effect share alone unpriced this model. But it is 1.48 standard errors from zero.
    assert prompt_slope == pytest.approx(-0.81941351, rel=1e-6)
    assert prompt_error == pytest.approx(0.55276123, rel=1e-6)
    assert durations.mean() == pytest.approx(121.0833333)
    assert -prompt_slope * 13 > 0.05 * durations.mean()

    fit = fit_durations(work, durations, min_samples=5, match_floor=16.0)

    # The prompt becomes a condition (its mean, 36.25 tokens) and the answers are fitted
    # alone: base and slope of the simple regression of durations on output tokens.
    (base, output_slope), _ = ols(work[:, 1], durations)
    assert base == pytest.approx(72.38930098, rel=1e-6)
    assert output_slope == pytest.approx(1.81468444, rel=1e-6)
    assert fit is not None
    assert fit.constant_work == (pytest.approx(36.25), None)
    assert fit.base_ms == pytest.approx(base, rel=1e-9)
    assert fit.slopes_ms == (0.0, pytest.approx(output_slope, rel=1e-9))
    assert fit.predict((33.0, 20.0)) == pytest.approx(72.38930098 + 1.81468444 * 20, rel=1e-6)
    assert fit.predict((46.0, 20.0)) == fit.predict((33.0, 20.0))


def test_a_significant_negative_slope_with_a_large_effect_is_still_unpriced() -> None:
    # The same rows with a quarter of the jitter: the prompt's 10 ms is now 5.66 standard
    # errors below zero, and still beyond 5 % of the mean. Longer prompts made jobs faster.
    work, durations = flake_rows(0.25)
    (_, prompt_slope, _), (_, prompt_error, _) = ols(work, durations)
    assert prompt_slope / prompt_error == pytest.approx(-5.6574, rel=1e-4)
    assert -prompt_slope * 13 > 0.05 * durations.mean()

    assert fit_durations(work, durations, min_samples=5, match_floor=16.0) is None


def two_group_rows(standard_errors: float) -> tuple[np.ndarray, np.ndarray]:
    # Prompts of 40 and 50 tokens, four of each, one answer length; each group's durations
    # are +-60 ms around its mean, so the residuals are exactly those +-60 ms: RSS = 8 * 3600
    # over 8 - 2 degrees of freedom, the prompt's spread sum((x - mean)^2) = 8 * 25, and its
    # standard error sqrt(4800 / 200) = sqrt(24) ms a token. The slope is set to
    # ``standard_errors`` of those below zero: ~9.8 ms a token, ~98 ms over the 10 tokens, far
    # beyond 5 % of the 1000 ms mean, so only the scatter can make it noise.
    slope = standard_errors * math.sqrt(24.0)
    prompts = [40.0, 50.0] * 4
    jitter = [60.0, 60.0, -60.0, -60.0] * 2
    work = np.array([[p, 30.0] for p in prompts])
    durations = np.array(
        [1000.0 - slope * (p - 45.0) + e for p, e in zip(prompts, jitter, strict=True)]
    )
    return work, durations


@pytest.mark.parametrize(("standard_errors", "priced"), [(1.99, True), (2.01, False)])
def test_a_negative_slope_is_noise_within_two_standard_errors_of_zero(
    standard_errors: float, priced: bool
) -> None:
    work, durations = two_group_rows(standard_errors)
    (_, slope), (_, error) = ols(work[:, 0], durations)
    assert error == pytest.approx(math.sqrt(24.0), rel=1e-9)
    assert slope == pytest.approx(-standard_errors * math.sqrt(24.0), rel=1e-9)

    fit = fit_durations(work, durations, min_samples=4, match_floor=16.0)

    if priced:
        assert fit is not None
        assert fit.uniform_work == pytest.approx((45.0, 30.0))
        assert fit.base_ms == pytest.approx(1000.0)
    else:
        assert fit is None


@pytest.mark.parametrize(("standard_errors", "priced"), [(-1.99, True), (-2.01, False)])
def test_two_standard_errors_hold_beside_a_fitted_term(
    standard_errors: float, priced: bool
) -> None:
    # The flake's rows with their jitter scaled so that the prompt's slope lies just inside
    # or just outside two standard errors of the two-term fit (its effect stays ~10.5 ms,
    # beyond 5 % of the mean). The scale is solved from the textbook fit: the slope is the
    # exact rows' plus the scale times the jitter's, and its error the scale times the
    # jitter's (the exact rows leave no residuals).
    work, exact = flake_rows(0.0)
    jitter = np.array(FLAKE_JITTER_MS)
    (_, exact_slope, _), _ = ols(work, exact)
    (_, jitter_slope, _), (_, jitter_error, _) = ols(work, jitter)
    scale = exact_slope / (standard_errors * jitter_error - jitter_slope)
    durations = exact + scale * jitter
    (_, slope, _), (_, error, _) = ols(work, durations)
    assert slope / error == pytest.approx(standard_errors, rel=1e-9)
    assert -slope * 13 > 0.05 * durations.mean()

    fit = fit_durations(work, durations, min_samples=5, match_floor=16.0)

    assert (fit is not None) == priced
    if fit is not None:
        assert fit.constant_work == (pytest.approx(36.25), None)
        assert fit.slopes_ms[1] == pytest.approx(ols(work[:, 1], durations)[0][1], rel=1e-9)


def test_without_degrees_of_freedom_only_the_effect_share_judges_a_negative_slope() -> None:
    # n - p = 0: two rows for base and one slope, three for base and two. The line passes
    # through every row, so there is no scatter to measure the slope against, and a slope
    # beyond 5 % of the mean still unprices the model as before.
    assert fit_durations(column([100.0, 200.0]), np.array([900.0, 800.0]), min_samples=2) is None
    work = np.array([[10.0, 10.0], [20.0, 15.0], [30.0, 40.0]])
    durations = 500.0 - 10.0 * work[:, 0] + 5.0 * work[:, 1]
    assert fit_durations(work, durations, min_samples=3) is None
    # (The rows are not collinear: the same work with a positive prompt slope is fitted.)
    rising = fit_durations(work, durations + 20.0 * work[:, 0], min_samples=3)
    assert rising is not None
    assert rising.slopes_ms == pytest.approx((10.0, 5.0))
    # Within 5 % it is noise, as before: 0.02 ms a token over 100 tokens is 2 ms of 1000.
    fit = fit_durations(column([100.0, 200.0]), np.array([1001.0, 999.0]), min_samples=2)
    assert fit is not None
    assert fit.uniform_work == (150.0,)
    assert fit.base_ms == pytest.approx(1000.0)


def test_a_negative_base_is_clamped_to_zero() -> None:
    work = column([20000.0, 25000.0, 30000.0, 40000.0])
    durations = -100.0 + 0.01 * work[:, 0]

    fit = fit_durations(work, durations, min_samples=4)

    assert fit is not None
    assert fit.base_ms == 0.0
    assert fit.slopes_ms == pytest.approx((0.01,))


def test_collinear_terms_are_unpriced() -> None:
    outputs = np.array([10.0, 50.0, 100.0, 200.0, 400.0, 35.0])
    work = np.column_stack([2.0 * outputs, outputs])
    durations = 40.0 + 0.5 * work[:, 0] + 20.0 * work[:, 1]

    assert fit_durations(work, durations, min_samples=6) is None


def test_collinear_terms_are_unpriced_at_image_scale_magnitudes() -> None:
    base = np.array([5e6, 8e6, 2e7, 4e7, 1.1e7])
    work = np.column_stack([3.0 * base, base])

    assert fit_durations(work, 500.0 + 0.001 * base, min_samples=5) is None


def test_more_than_two_work_terms_are_unpriced() -> None:
    work = np.array([[1.0, 2.0, 3.0], [2.0, 1.0, 5.0], [7.0, 3.0, 1.0]])

    assert fit_durations(work, np.array([10.0, 20.0, 30.0]), min_samples=2) is None


# -- load costs -----------------------------------------------------------------------------


def test_load_costs_average_per_config() -> None:
    costs = load_costs(
        [("a.kcpps", 1000.0), ("a.kcpps", 3000.0), ("b.kcpps", 1500.0), ("a.kcpps", 2000.0)]
    )

    assert costs == {"a.kcpps": 2000.0, "b.kcpps": 1500.0}


def test_load_costs_skip_non_positive_durations_and_empty_names() -> None:
    costs = load_costs([("a.kcpps", 0.0), ("a.kcpps", -3.0), ("", 800.0), ("c.kcpps", 700.0)])

    assert costs == {"c.kcpps": 700.0}


# -- token profile --------------------------------------------------------------------------


def test_a_token_profile_without_spread_uses_the_mean_ratio() -> None:
    profile = token_profile(
        np.array([400, 800, 1200]),
        np.array([100, 200, 300]),
        np.array([50, 50, 50]),
        min_samples=3,
    )

    assert profile is not None
    assert (profile.reserved_output_tokens, profile.samples, profile.mean_output) == (50.0, 3, 50.0)
    assert profile.conservative_bytes_per_token == pytest.approx(4.0)
    assert profile.mean_bytes_per_token == pytest.approx(4.0)
    assert profile.overhead_bytes == pytest.approx(0.0, abs=1e-9)
    assert profile.spread_tokens == pytest.approx(0.0, abs=1e-9)
    assert profile.prompt_tokens(1000) == 250
    assert profile.prompt_tokens(1001) == 251


def test_more_spread_in_the_ratio_estimates_more_tokens() -> None:
    # Ratios 3 and 5: mean 4, population sigma 1 -> 4 - 2 = 2 bytes per token.
    # Outputs 100 and 300: mean 200, sigma 100 -> 400 reserved.
    profile = token_profile(
        np.array([300, 500]), np.array([100, 100]), np.array([100, 300]), min_samples=2
    )

    assert profile is not None
    assert profile.conservative_bytes_per_token == pytest.approx(2.0)
    assert profile.reserved_output_tokens == pytest.approx(400.0)
    assert profile.prompt_tokens(1000) == 500


def test_the_conservative_ratio_never_drops_below_half_a_byte() -> None:
    # Ratios 1 and 7: mean 4, sigma 3 -> 4 - 6 < 0.5.
    profile = token_profile(
        np.array([100, 700]), np.array([100, 100]), np.array([10, 10]), min_samples=2
    )

    assert profile is not None
    assert profile.conservative_bytes_per_token == 0.5


# Measured on llama-server with Gemma 3 270M: chats and completions of "Hi", a short
# sentence and a long repeated one (bodies in bytes, prompt tokens as it counted them).
LLAMA_SERVER_BYTES = np.array([76, 97, 46, 62, 434, 314])
LLAMA_SERVER_TOKENS = np.array([25, 29, 2, 5, 144, 92])


def test_short_prompts_are_estimated_from_the_line_of_tokens_against_bytes() -> None:
    body, tokens = LLAMA_SERVER_BYTES, LLAMA_SERVER_TOKENS
    plain = body / tokens
    # The spec's ratio rule alone sits at the floor here: 3 to 46 times too many tokens.
    assert plain.mean() - 2 * plain.std() < 0.5
    profile = token_profile(body, tokens, np.full(body.shape, 2), min_samples=3)
    assert profile is not None
    assert 2.5 < profile.mean_bytes_per_token < 3.5
    assert profile.conservative_bytes_per_token == profile.mean_bytes_per_token
    assert 10 < profile.spread_tokens < 15
    for b, t in zip(body.tolist(), tokens.tolist(), strict=True):
        # Never fewer tokens than llama-server counted, and at most the margin more.
        assert t <= profile.prompt_tokens(b) <= t + 20
        assert abs(profile.expected_prompt_tokens(b) - t) <= 12


def test_a_chat_templates_own_tokens_make_a_negative_overhead() -> None:
    # 70 bytes of JSON around the prompt, 23 template tokens, 4 bytes per prompt token.
    content = np.array([1, 5, 20, 60, 200])
    profile = token_profile(70 + 4 * content, 23 + content, np.ones(5), min_samples=3)
    assert profile is not None
    assert profile.overhead_bytes == pytest.approx(70 - 4 * 23)
    assert profile.mean_bytes_per_token == pytest.approx(4.0)
    assert profile.prompt_tokens(70 + 4 * 10) == 33


def test_without_varying_body_sizes_the_ratio_rule_stands() -> None:
    profile = token_profile(
        np.array([400, 400, 400]), np.array([90, 100, 110]), np.array([1, 1, 1]), min_samples=1
    )
    assert profile is not None
    assert (profile.overhead_bytes, profile.spread_tokens) == (0.0, 0.0)
    assert profile.conservative_bytes_per_token < profile.mean_bytes_per_token


def test_the_estimate_follows_the_line_and_adds_the_spread() -> None:
    profile = TokenProfile(
        conservative_bytes_per_token=4.0,
        reserved_output_tokens=10,
        samples=5,
        mean_bytes_per_token=4.0,
        overhead_bytes=50.0,
        spread_tokens=3.0,
    )
    assert profile.prompt_tokens(30) == 1 and profile.expected_prompt_tokens(30) == 1
    assert profile.prompt_tokens(90) == 13 and profile.expected_prompt_tokens(90) == 10
    assert profile.prompt_tokens(0) == 0


def test_a_ratio_outside_half_to_sixty_four_bytes_gives_no_profile() -> None:
    many_bytes = token_profile(
        np.array([6500, 6500]), np.array([100, 100]), np.array([10, 10]), min_samples=1
    )
    few_bytes = token_profile(
        np.array([40, 40]), np.array([100, 100]), np.array([10, 10]), min_samples=1
    )
    edge = token_profile(np.array([6400]), np.array([100]), np.array([10]), min_samples=1)

    assert many_bytes is None
    assert few_bytes is None
    assert edge is not None


def test_a_token_profile_needs_min_samples_rows_with_all_three_counts() -> None:
    prompt_bytes = np.array([400, 400, 0, 400])
    input_tokens = np.array([100, 100, 100, 100])
    output_tokens = np.array([50, 50, 50, 0])

    assert token_profile(prompt_bytes, input_tokens, output_tokens, min_samples=3) is None
    profile = token_profile(prompt_bytes, input_tokens, output_tokens, min_samples=2)
    assert profile is not None
    assert profile.samples == 2
    assert (
        token_profile(prompt_bytes[:0], input_tokens[:0], output_tokens[:0], min_samples=0) is None
    )


def test_required_context_applies_the_floor_only_without_max_tokens() -> None:
    profile = TokenProfile(
        conservative_bytes_per_token=4.0, reserved_output_tokens=100.4, samples=20
    )

    # 400 bytes -> 100 prompt tokens.
    assert profile.required_context(400, None, 256) == 100 + 256
    assert profile.required_context(400, None, 0) == 100 + 101
    assert profile.required_context(400, 50, 256) == 100 + 101
    assert profile.required_context(400, 500, 256) == 100 + 500


# -- wire form ------------------------------------------------------------------------------


def sample_tables() -> tuple[
    dict[tuple[str, str], CostFit], dict[str, float], dict[str, TokenProfile]
]:
    models = {
        ("sd-xl", "image"): CostFit(base_ms=500.0, slopes_ms=(0.001,), samples=40),
        ("llama", "llm"): CostFit(
            base_ms=40.0, slopes_ms=(0.5, 20.0), samples=25, match_floor=TEXT_MATCH_FLOOR_TOKENS
        ),
        ("template", "llm"): CostFit(
            base_ms=190.0,
            slopes_ms=(0.0, 20.0),
            samples=5,
            constant_work=(300.0, None),
            match_floor=TEXT_MATCH_FLOOR_TOKENS,
        ),
        ("sd-turbo", "image"): CostFit(
            base_ms=1000.0, slopes_ms=(0.0,), samples=20, uniform_work=(5242880.0,)
        ),
    }
    loads = {"llama.kcpps": 4200.0, "sd-xl.kcpps": 9000.5}
    tokens = {
        "llama": TokenProfile(
            conservative_bytes_per_token=3.25,
            reserved_output_tokens=412.0,
            samples=25,
            mean_bytes_per_token=3.9,
            mean_output=300.0,
            overhead_bytes=-62.5,
            spread_tokens=8.25,
        )
    }
    return models, loads, tokens


def test_the_wire_form_round_trips_through_json() -> None:
    models, loads, tokens = sample_tables()

    doc = json.loads(json.dumps(fits_to_wire(models, loads, tokens)))

    assert fits_from_wire(doc) == (models, loads, tokens)


def test_the_wire_form_has_the_published_shape() -> None:
    models, loads, tokens = sample_tables()

    doc = fits_to_wire(models, loads, tokens)

    assert doc["models"][0] == {
        "model_id": "llama",
        "section": "llm",
        "base_ms": 40.0,
        "slopes_ms": [0.5, 20.0],
        "samples": 25,
    }
    assert doc["models"][1]["uniform_work"] == [5242880.0]
    assert doc["loads"] == [
        {"config_filename": "llama.kcpps", "load_ms": 4200.0},
        {"config_filename": "sd-xl.kcpps", "load_ms": 9000.5},
    ]
    assert doc["tokens"] == [
        {
            "model_id": "llama",
            "conservative_bytes_per_token": 3.25,
            "reserved_output_tokens": 412.0,
            "samples": 25,
            "mean_bytes_per_token": 3.9,
            "mean_output_tokens": 300.0,
            "overhead_bytes": -62.5,
            "spread_tokens": 8.25,
        }
    ]


def test_malformed_wire_rows_are_ignored() -> None:
    good: dict[str, Any] = {
        "model_id": "ok",
        "section": "image",
        "base_ms": 1.0,
        "slopes_ms": [2.0],
        "samples": 3,
    }
    bad_models: list[Any] = [
        "not a row",
        {**good, "model_id": ""},
        {**good, "section": "video"},
        {**good, "base_ms": "1"},
        {**good, "slopes_ms": []},
        {**good, "slopes_ms": [1.0, 2.0, 3.0]},
        {**good, "slopes_ms": [-1.0]},
        {**good, "samples": True},
        {**good, "uniform_work": [1.0, 2.0]},
        {k: v for k, v in good.items() if k != "base_ms"},
    ]
    doc = {
        "models": [*bad_models, good],
        "loads": [
            {"config_filename": "a", "load_ms": -1.0},
            {"config_filename": "", "load_ms": 5.0},
            {"load_ms": 5.0},
            {"config_filename": "b", "load_ms": 5.0},
        ],
        "tokens": [
            {"model_id": "x", "conservative_bytes_per_token": 0, "reserved_output_tokens": 1},
            {"model_id": "y", "reserved_output_tokens": 1, "samples": 1},
            [],
        ],
    }

    models, loads, tokens = fits_from_wire(doc)

    assert models == {("ok", "image"): CostFit(base_ms=1.0, slopes_ms=(2.0,), samples=3)}
    assert loads == {"b": 5.0}
    assert tokens == {}


def test_a_wire_document_that_is_not_an_object_gives_empty_tables() -> None:
    assert fits_from_wire(None) == ({}, {}, {})
    assert fits_from_wire({"models": "x", "loads": 3}) == ({}, {}, {})


def test_a_template_fit_travels_with_its_constant_terms() -> None:
    models, loads, tokens = sample_tables()

    doc = fits_to_wire(models, loads, tokens)
    row = next(r for r in doc["models"] if r["model_id"] == "template")

    assert row["constant_work"] == [300.0, None]
    assert "uniform_work" not in row
    read, _, _ = fits_from_wire(json.loads(json.dumps(doc)))
    assert read[("template", "llm")].predict((316.0, 10.0)) == pytest.approx(390.0)


@pytest.mark.parametrize(
    "constant_work",
    [[300.0], [300.0, 5.0, None], "300", [-1.0, None], [True, None]],
)
def test_a_template_fit_with_a_malformed_condition_is_dropped(constant_work: Any) -> None:
    row = {
        "model_id": "template",
        "section": "llm",
        "base_ms": 190.0,
        "slopes_ms": [0.0, 20.0],
        "samples": 5,
        "constant_work": constant_work,
    }

    models, _, _ = fits_from_wire({"models": [row]})

    assert models == {}


def test_a_text_fit_read_from_the_wire_matches_within_sixteen_tokens() -> None:
    # The wire form carries no floor: the reader applies its section's default.
    row = {
        "model_id": "m",
        "section": "llm",
        "base_ms": 400.0,
        "slopes_ms": [0.0, 0.0],
        "samples": 4,
        "uniform_work": [20.0, 8.0],
    }

    models, _, _ = fits_from_wire({"models": [row]})
    fit = models[("m", "llm")]

    assert fit.predict((36.0, 24.0)) == 400.0
    assert fit.predict((37.0, 8.0)) is None
    assert fit.predict((20.0, 25.0)) is None


def test_an_image_fit_read_from_the_wire_has_no_absolute_floor() -> None:
    row = {
        "model_id": "m",
        "section": "image",
        "base_ms": 300.0,
        "slopes_ms": [0.0],
        "samples": 4,
        "uniform_work": [64.0],
    }

    models, _, _ = fits_from_wire({"models": [row]})
    fit = models[("m", "image")]

    assert fit.predict((70.0,)) == 300.0
    assert fit.predict((71.0,)) is None
