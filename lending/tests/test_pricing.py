"""Lending prices: the cost table, the owner's demand, the helper's service price, finish times."""

from __future__ import annotations

import pytest

from analytics.fitting import CostFit
from lending.pricing import (
    CostTable,
    helper_finish_ms,
    owner_demand,
    owner_finish_ms,
    service_price,
)

IMAGE_FIT = CostFit(base_ms=1000.0, slopes_ms=(0.0,), samples=20)
# 40 ms fixed, 0.5 ms per prompt token, 20 ms per output token.
TEXT_FIT = CostFit(base_ms=40.0, slopes_ms=(0.5, 20.0), samples=30)
# Every sample was a 1 Mpx x 20 step image: priced only near that work.
UNIFORM_FIT = CostFit(base_ms=800.0, slopes_ms=(0.0,), samples=20, uniform_work=(20e6,))


def test_the_text_lane_reads_the_llm_section_of_the_table() -> None:
    table = CostTable(
        fits={("n1", "m", "llm"): TEXT_FIT, ("n1", "m", "image"): IMAGE_FIT}, loads={}
    )
    assert table.fit("n1", "m", "text") is TEXT_FIT
    assert table.fit("n1", "m", "image") is IMAGE_FIT
    assert table.fit("n2", "m", "text") is None


def test_the_cost_table_rejects_an_unknown_lane() -> None:
    with pytest.raises(ValueError):
        CostTable(fits={}, loads={}).fit("n1", "m", "audio")


def test_load_cost_is_keyed_by_node_and_config_file() -> None:
    table = CostTable(fits={}, loads={("n1", "a.yaml"): 2000.0})
    assert table.load_ms("n1", "a.yaml") == 2000.0
    assert table.load_ms("n2", "a.yaml") is None
    assert table.load_ms("n1", "b.yaml") is None
    assert table.load_ms("n1", "") is None


def test_owner_demand_prices_the_whole_backlog_and_one_mean_job() -> None:
    keep, job = owner_demand(IMAGE_FIT, mean_work=(20e6,), backlog_count=42, backlog_work=(840e6,))
    assert keep == 42_000.0
    assert job == 1000.0


def test_owner_demand_with_a_text_fit_uses_both_work_terms() -> None:
    keep, job = owner_demand(
        TEXT_FIT, mean_work=(1000.0, 100.0), backlog_count=3, backlog_work=(3000.0, 300.0)
    )
    assert keep == 3 * 40.0 + 0.5 * 3000.0 + 20.0 * 300.0  # 7620
    assert job == 40.0 + 0.5 * 1000.0 + 20.0 * 100.0  # 2540


def test_an_owner_without_a_fit_is_unpriced() -> None:
    assert owner_demand(None, mean_work=(1.0,), backlog_count=3, backlog_work=(3.0,)) == (
        None,
        None,
    )


def test_a_uniform_owner_is_unpriced_for_work_it_never_did() -> None:
    keep, job = owner_demand(UNIFORM_FIT, mean_work=(50e6,), backlog_count=2, backlog_work=(100e6,))
    assert (keep, job) == (None, None)
    keep, job = owner_demand(UNIFORM_FIT, mean_work=(20e6,), backlog_count=2, backlog_work=(40e6,))
    assert (keep, job) == (1600.0, 800.0)


def test_service_uses_the_helper_fit_when_it_prices_the_work() -> None:
    helper = CostFit(base_ms=250.0, slopes_ms=(0.0,), samples=5)
    assert service_price(helper, IMAGE_FIT, (20e6,)) == (250.0, "helper")


def test_service_falls_back_to_the_owner_fit_when_the_helper_has_none() -> None:
    assert service_price(None, IMAGE_FIT, (20e6,)) == (1000.0, "owner_fallback")


def test_service_falls_back_when_the_helper_fit_cannot_price_this_work() -> None:
    assert service_price(UNIFORM_FIT, IMAGE_FIT, (50e6,)) == (1000.0, "owner_fallback")


def test_service_is_unpriced_when_neither_side_prices_the_work() -> None:
    assert service_price(None, None, (20e6,)) == (None, "")
    assert service_price(UNIFORM_FIT, UNIFORM_FIT, (50e6,)) == (None, "")


def test_owner_finish_counts_from_the_later_of_oldest_start_and_last_completion() -> None:
    # gen = max(9000, 9500) = 9500; first_done = max(10500, 10000) = 10500;
    # finish = 10500 + (2 - 1) * 1000 + 1000.
    finish = owner_finish_ms(
        now_ms=10_000,
        oldest_admitted_start_ms=9_000,
        last_own_completion_ms=9_500,
        in_flight=2,
        job_ms=1_000,
    )
    assert finish == 12_500


def test_owner_finish_treats_an_overdue_job_as_finishing_now() -> None:
    # gen = 5000, the job was due at 6000 but still runs at 10000: first_done = 10000.
    finish = owner_finish_ms(
        now_ms=10_000,
        oldest_admitted_start_ms=5_000,
        last_own_completion_ms=None,
        in_flight=1,
        job_ms=1_000,
    )
    assert finish == 11_000


def test_helper_finish_pays_the_switch_once_and_queues_each_lent_job() -> None:
    # busy = 10000 + 2000 = 12000 -> 12250 -> 12500; finish = max(12500, 10500) + 250.
    finish = helper_finish_ms(
        now_ms=10_500, lent_at_ms=[10_000, 10_200], switch_ms=2_000, service_ms=250
    )
    assert finish == 12_750


def test_helper_finish_starts_a_job_lent_after_a_gap_when_it_was_lent() -> None:
    # busy = 1000 -> 1100 -> max(1100, 5000) + 100 = 5100; finish = max(5100, 6000) + 100.
    finish = helper_finish_ms(now_ms=6_000, lent_at_ms=[5_000, 1_000], switch_ms=0, service_ms=100)
    assert finish == 6_100


def test_helper_finish_never_starts_a_lent_job_before_it_was_lent() -> None:
    # The helper idles from 1100 until the second job is lent at 5000; asked at 5050, while
    # that job still runs: busy = max(1100, 5000) + 100 = 5100, finish = 5100 + 100.
    # Starting it when the helper fell idle would give max(1200, 5050) + 100 = 5150.
    finish = helper_finish_ms(now_ms=5_050, lent_at_ms=[1_000, 5_000], switch_ms=0, service_ms=100)
    assert finish == 5_200


def test_helper_finish_pays_the_switch_before_the_first_lent_job_only() -> None:
    # busy = 1000 + 500 = 1500 -> 1600; the second job, lent at 4000, starts then: 4100.
    finish = helper_finish_ms(
        now_ms=4_050, lent_at_ms=[1_000, 4_000], switch_ms=500, service_ms=100
    )
    assert finish == 4_200


def test_a_fast_helper_finishes_before_a_slow_owner_in_a_hold_scenario() -> None:
    owner = owner_finish_ms(
        now_ms=10_000,
        oldest_admitted_start_ms=9_800,
        last_own_completion_ms=None,
        in_flight=1,
        job_ms=1_000,
    )
    helper = helper_finish_ms(now_ms=10_000, lent_at_ms=[9_900], switch_ms=0, service_ms=250)
    assert owner == 11_800
    assert helper == 10_400
    assert helper < owner


def test_owner_finish_prices_the_job_asked_about_on_its_own() -> None:
    # first_done = 11000; one more running job ahead (1000), then this 300 ms job.
    finish = owner_finish_ms(
        now_ms=10_000,
        oldest_admitted_start_ms=10_000,
        last_own_completion_ms=None,
        in_flight=2,
        job_ms=1_000,
        this_job_ms=300,
    )
    assert finish == 12_300


def test_helper_finish_prices_the_job_asked_about_on_its_own() -> None:
    # busy = 10000 + 2000 + 250 = 12250; this job of 60 ms follows it.
    finish = helper_finish_ms(
        now_ms=10_500, lent_at_ms=[10_000], switch_ms=2_000, service_ms=250, this_job_ms=60
    )
    assert finish == 12_310
    # Nothing lent: the switch, then this job.
    assert (
        helper_finish_ms(now_ms=0, lent_at_ms=[], switch_ms=500, service_ms=250, this_job_ms=60)
        == 560
    )


def test_helper_finish_prices_each_lent_job_as_itself() -> None:
    # Lent at 1000 (400 ms) and at 1100 (50 ms), given out of order: 1000 + 400 = 1400, then
    # 1450, then this 100 ms job: 1550. At 250 ms each: 1000 + 250 + 250 + 100 = 1600.
    finish = helper_finish_ms(
        now_ms=1_200,
        lent_at_ms=[1_100, 1_000],
        switch_ms=0,
        service_ms=250,
        this_job_ms=100,
        lent_job_ms=[50, 400],
    )
    assert finish == 1_550
    plain = helper_finish_ms(
        now_ms=1_200, lent_at_ms=[1_100, 1_000], switch_ms=0, service_ms=250, this_job_ms=100
    )
    assert plain == 1_600
