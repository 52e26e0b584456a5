"""Lending's impact from recorded rows, with exact numbers: the measured side, the replay
without links, the totals, the sentence, the time budget and the rows a node hands over."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from lending.impact import (
    IMPACT_DECISION_COLUMNS,
    IMPACT_REQUEST_COLUMNS,
    impact_compute,
    impact_minutes,
    impact_window,
    merge_rows,
    plain_summary,
)
from lending.settings_store import EffectiveSettings
from lending.whatif import replay_settings
from routerproject.errors import RouterError

T = 1_000.0  # seconds
SETTINGS = EffectiveSettings.from_values({"scheduling_min_samples": "2"})
WINDOW = (T - 1, T + 60)


def req(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "node_id": "o",
        "model_id": "A",
        "config_filename": "A.kcpps",
        "lane": "text",
        "borrowed": False,
        "success": True,
        "duration_ms": 200.0,
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "output_tokens": 10,
        "image_width": 0,
        "image_height": 0,
        "image_steps": 0,
        "image_count": 0,
        "request_id": None,
    }
    row.update(fields)
    return row


def decision(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "kind": "dispatch",
        "outcome": "lent",
        "node_id": "o",
        "lane": "text",
        "owner_node_id": "o",
        "owner_model_id": "A",
        "helper_node_id": "h",
        "helper_model_id": "B",
        "wait_ms": 0.0,
        "request_id": None,
    }
    row.update(fields)
    return row


def columns(rows: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, list[Any]]:
    return {name: [r.get(name) for r in rows] for name in names}


def answer(requests: list[dict[str, Any]], decisions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "truncated": False,
        "requests": columns(requests, IMPACT_REQUEST_COLUMNS),
        "loads": {
            "node_id": [],
            "config_filename": [],
            "success": [],
            "duration_ms": [],
            "finished_at": [],
        },
        "decisions": columns(decisions, IMPACT_DECISION_COLUMNS),
    }


def three_at_once() -> list[dict[str, Any]]:
    """Two requests the owner ran (200 ms each, answered 0.2 s and 0.4 s after arriving) and a
    third, arriving with them, lent 50 ms later and answered by the helper 100 ms after it came.
    The owner answers the node of its own rows; the helper's row is on the helper's node."""
    owner = answer(
        [
            req(started_at=T, finished_at=T + 0.2, request_id="r1"),
            req(started_at=T, finished_at=T + 0.4, request_id="r2"),
        ],
        [decision(recorded_at=T + 0.05, wait_ms=50.0, request_id="r3")],
    )
    helper = answer(
        [
            req(
                node_id="h",
                model_id="B",
                borrowed=True,
                started_at=T + 0.05,
                finished_at=T + 0.1,
                duration_ms=50.0,
                request_id="r3",
            )
        ],
        [],
    )
    return [owner, helper]


def compute(answers: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"window": WINDOW, "gap_secs": 2.0, "budget_secs": 5.0, **kwargs}
    return impact_compute(merge_rows(answers), SETTINGS, replay_settings(SETTINGS), **args)


def test_measured_waiting_against_the_owner_alone() -> None:
    doc = compute(three_at_once())
    (owner,) = doc["owners"]
    assert (owner["owner_node_id"], owner["owner_model_id"], owner["helpers"]) == (
        "o",
        "A",
        ["h/B"],
    )
    assert (owner["requests"], owner["lent"], owner["bursts"]) == (3, 1, 1)
    # Measured: 200 + 400 ms for the owner's two, 100 ms for the lent one.
    assert owner["waited_ms"] == pytest.approx(700.0)
    assert owner["makespan_ms"] == pytest.approx(400.0)
    # Alone, the owner runs the three one after another at 200 ms: 200 + 400 + 600.
    assert owner["waited_without_links_ms"] == pytest.approx(1200.0)
    assert owner["makespan_without_links_ms"] == pytest.approx(600.0)
    assert owner["waiting_saved_ms"] == pytest.approx(500.0)
    assert owner["waiting_saved_pct"] == pytest.approx(41.7)
    assert doc["totals"]["waiting_saved_ms"] == pytest.approx(500.0)
    assert doc["not_replayed"] == []


def test_bursts_before_the_window_fit_costs_but_are_not_compared() -> None:
    answers = three_at_once()
    early = answer(
        [req(started_at=T - 100 + i, finished_at=T - 100 + i + 0.2) for i in range(0, 20, 5)],
        [decision(recorded_at=T - 100.0, request_id="old")],
    )
    doc = compute([*answers, early])
    (owner,) = doc["owners"]
    assert (owner["requests"], owner["bursts"]) == (3, 1)
    assert owner["waited_without_links_ms"] == pytest.approx(1200.0)


def test_an_owner_too_few_rows_to_price_is_noted_not_guessed() -> None:
    owner, helper = three_at_once()
    owner["requests"] = columns([req(started_at=T, finished_at=T + 0.2)], IMPACT_REQUEST_COLUMNS)
    (only,) = compute([owner, helper])["owners"]
    assert only["requests"] == 0 and "too few" in only["notes"][0]


def test_owners_past_the_time_budget_are_listed() -> None:
    second = [
        answer(
            [req(node_id="o2", started_at=T, finished_at=T + 0.2)],
            [decision(node_id="o2", owner_node_id="o2", recorded_at=T, request_id="z")],
        )
    ]
    ticks = iter([0.0, 0.0, 10.0])
    doc = compute([*three_at_once(), *second], budget_secs=5.0, clock=lambda: next(ticks))
    assert [o["owner_node_id"] for o in doc["owners"]] == ["o"]
    assert doc["not_replayed"] == ["o2/A"]


def test_cached_prompt_tokens_are_not_priced_as_prefill() -> None:
    from lending.whatif import work_of

    rows = pd.DataFrame([req(prompt_tokens=100, cached_tokens=80, output_tokens=5)])
    assert work_of(rows, "text").tolist() == [[20.0, 5.0]]
    # An export without the column prices the whole prompt.
    assert work_of(rows.drop(columns=["cached_tokens"]), "text").tolist() == [[100.0, 5.0]]


def test_the_sentence() -> None:
    totals = {"lent": 5, "waiting_saved_ms": 14 * 60_000.0, "waiting_saved_pct": 38.0}
    assert plain_summary(totals, 60) == "lending saved 14 min of waiting (38 %) over the last hour"
    assert plain_summary(totals, 1440).endswith("over the last day")
    assert plain_summary(totals, 120).endswith("over the last 2 hours")
    assert plain_summary(totals, 90, recent=False).endswith("over the 90 minutes asked for")
    worse = {"lent": 1, "waiting_saved_ms": -2_500.0, "waiting_saved_pct": -10.0}
    assert plain_summary(worse, 15) == (
        "lending cost 2.5 s of waiting (10 %) over the last 15 minutes"
    )
    assert plain_summary({"lent": 0}, 60) == "nothing was lent over the last hour"


def test_windows_are_checked_and_name_the_field() -> None:
    assert impact_minutes({}) == 60 and impact_minutes({"minutes": "1440"}) == 1440
    for bad in ("0", "1441", "x", "-5"):
        with pytest.raises(RouterError) as err:
            impact_minutes({"minutes": bad})
        assert err.value.param == "minutes"
    assert impact_window({"since_ms": "1000", "until_ms": "61000"}) == (1.0, 61.0)
    for query, field in (
        ({"until_ms": "5"}, "since_ms"),
        ({"since_ms": "5", "until_ms": "5"}, "until_ms"),
        ({"since_ms": "0", "until_ms": str(1441 * 60_000)}, "until_ms"),
    ):
        with pytest.raises(RouterError) as err:
            impact_window(query)
        assert err.value.param == field
