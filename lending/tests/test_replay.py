"""The what-if replay: the simulation on its own clock, and `lending_replay` /
`analytics_export` over rows recorded as a run with known costs records them.

The recorded run: owner o/big costs 5 ms + 40 ms per output token, helper h/fast 5 ms + 2 ms
per output token (the simulated backend's formula), both warmed up with 30 requests of 5..34
tokens. Then 12 requests of 10 tokens reach o at once. With the default depth of 2, o's backend
takes two at once (405 ms each, one after the other: done at 810 ms) and the other ten are
lent to h under a faster-helper lease (two out at a time, refilled at once) and done after
10 x 25 ms = 250 ms. The run's makespan is 810 ms; with a depth of 1, o runs one (405 ms) and
h the other eleven (275 ms): 405 ms.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from analytics.fitting import CostFit
from analytics.models import LoadRecord, RequestRecord
from lending.models import OffloadDecision
from lending.pricing import CostTable
from lending.replay import Pair, ReplaySettings, Request, replay

OWNER_BASE, OWNER_PER_TOKEN = 5.0, 40.0
HELPER_BASE, HELPER_PER_TOKEN = 5.0, 2.0
BURST, TOKENS, PROMPT = 12, 10, 8
T0 = 1_900_000_000.0  # the burst's start, Unix seconds
ACTUAL_MAKESPAN_MS = 810.0
DEFAULTS = ReplaySettings(
    backend_depth=2,
    probe_idle_ms=5000.0,
    faster_slots=2,
    slower_slots=1,
    probe_slots=1,
    grant_ttl_ms=30_000,
)


def owner_ms(tokens: int) -> float:
    return OWNER_BASE + OWNER_PER_TOKEN * tokens


def helper_ms(tokens: int) -> float:
    return HELPER_BASE + HELPER_PER_TOKEN * tokens


def fit(base: float, per_token: float) -> CostFit:
    return CostFit(
        base_ms=base, slopes_ms=(0.0, per_token), samples=30, constant_work=(PROMPT, None)
    )


def pair(*, known: bool = True) -> Pair:
    fits = (
        {
            ("o", "big", "llm"): fit(OWNER_BASE, OWNER_PER_TOKEN),
            ("h", "fast", "llm"): fit(HELPER_BASE, HELPER_PER_TOKEN),
        }
        if known
        else {}
    )
    return Pair(
        lane="text",
        owner_node="o",
        owner_model="big",
        owner_config="big.kcpps",
        helper_node="h",
        helper_model="fast",
        helper_config="fast.kcpps",
        known=CostTable(fits=fits, loads={}),
        owner_truth=fit(OWNER_BASE, OWNER_PER_TOKEN),
        helper_truth=fit(HELPER_BASE, HELPER_PER_TOKEN),
    )


def burst_requests() -> list[Request]:
    return [Request(0.0, (float(PROMPT), float(TOKENS))) for _ in range(BURST)]


# -- the simulation --------------------------------------------------------------------------


def test_a_priced_faster_helper_takes_the_held_requests() -> None:
    (result,) = replay(pair(), DEFAULTS, burst_requests())
    assert result.requests == BURST
    assert result.lent == BURST - 2
    assert result.makespan_ms == pytest.approx(2 * owner_ms(TOKENS))
    assert result.leases >= 1


def test_a_depth_of_one_lends_one_more() -> None:
    depth_one = ReplaySettings(**{**DEFAULTS.__dict__, "backend_depth": 1})
    (result,) = replay(pair(), depth_one, burst_requests())
    assert result.lent == BURST - 1
    assert result.makespan_ms == pytest.approx(owner_ms(TOKENS))


def test_the_owner_holds_a_request_the_busy_helper_still_finishes_sooner() -> None:
    # A helper at 60 ms a job: ten lent jobs take it 600 ms. When the owner's first job ends
    # at 405 ms, two requests are still held: the owner would finish a third one at 1215 ms,
    # the helper (two out) well before, so the owner holds it and the helper drains the
    # backlog while the owner's second job runs to 810 ms.
    slower = Pair(
        **{
            **pair().__dict__,
            "helper_truth": fit(HELPER_BASE, 5.5),
            "known": CostTable(
                fits={
                    ("o", "big", "llm"): fit(OWNER_BASE, OWNER_PER_TOKEN),
                    ("h", "fast", "llm"): fit(HELPER_BASE, 5.5),
                },
                loads={},
            ),
        }
    )
    (held,) = replay(slower, DEFAULTS, burst_requests())
    no_hold = ReplaySettings(**{**DEFAULTS.__dict__, "hold_for_faster_helper": False})
    (admitted,) = replay(slower, no_hold, burst_requests())
    assert held.lent == BURST - 2
    assert held.makespan_ms == pytest.approx(2 * owner_ms(TOKENS))
    assert admitted.lent == BURST - 3
    assert admitted.makespan_ms == pytest.approx(3 * owner_ms(TOKENS))


def test_without_prices_and_an_idle_helper_below_the_probe_bar_nothing_is_lent() -> None:
    busy_recently = Pair(**{**pair(known=False).__dict__, "helper_idle_ms": 0.0})
    slow_probe = ReplaySettings(**{**DEFAULTS.__dict__, "probe_idle_ms": 1e9})
    (result,) = replay(busy_recently, slow_probe, burst_requests())
    assert result.lent == 0
    assert result.makespan_ms == pytest.approx(BURST * owner_ms(TOKENS))


def test_an_unpriced_pair_probes_once_the_helper_idled_long_enough() -> None:
    (result,) = replay(pair(known=False), DEFAULTS, burst_requests())
    # The helper had been idle for ever: a one-request probe goes out at once.
    assert result.lent >= 1
    assert result.makespan_ms < BURST * owner_ms(TOKENS)


def test_the_helpers_own_request_takes_back_borrowed_work_and_waits_for_the_running_one() -> None:
    own = [Request(10.0, (100.0,))]
    (result,) = replay(pair(), DEFAULTS, burst_requests(), own)
    # Lent at 0: the first borrowed job runs 0-25 ms; the own request waits 15 ms behind it.
    assert result.helper_own_delay_ms == pytest.approx(helper_ms(TOKENS) - 10.0)
    assert result.returned >= 1


# -- rows recorded from a run, replayed by the commands ----------------------------------------


def ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def request_row(
    node: str,
    model: str,
    start: float,
    duration_ms: float,
    tokens: int,
    *,
    finish_ms: float | None = None,
    **kw: Any,
) -> None:
    finished = start + (duration_ms if finish_ms is None else finish_ms) / 1000.0
    RequestRecord.objects.create(
        node_id=node,
        model_id=model,
        config_filename=f"{model}.kcpps",
        lane="text",
        path="/v1/chat/completions",
        status=200,
        success=True,
        prompt_bytes=4 * PROMPT,
        prompt_tokens=PROMPT,
        output_tokens=tokens,
        duration_ms=duration_ms,
        started_at=ts(start),
        finished_at=ts(finished),
        **kw,
    )


def decision(recorded_at: float, **fields: Any) -> None:
    OffloadDecision.objects.create(recorded_at=int(recorded_at * 1000), lane="text", **fields)


def record_run() -> None:
    """The rows a real o/h/master run of the scenario leaves (as every node's export joined)."""
    warm = T0 - 600.0
    for i in range(30):
        tokens = 5 + i
        request_row("o", "big", warm + i * 5.0, owner_ms(tokens), tokens)
        request_row("h", "fast", warm + i * 5.0 + 2.0, helper_ms(tokens), tokens)
    LoadRecord.objects.create(
        node_id="h",
        model_id="fast",
        config_filename="fast.kcpps",
        lane="text",
        duration_ms=50.0,
        finished_at=ts(warm - 10.0),
    )
    # The burst: o runs two of them back to back (the second waited in its backend).
    request_row("o", "big", T0, owner_ms(TOKENS), TOKENS)
    request_row("o", "big", T0, owner_ms(TOKENS), TOKENS, finish_ms=2 * owner_ms(TOKENS))
    pairing = {
        "owner_node_id": "o",
        "owner_model_id": "big",
        "helper_node_id": "h",
        "helper_model_id": "fast",
    }
    decision(T0 + 0.002, node_id="master", kind="plan", outcome="granted", slots=2, **pairing)
    for k in range(BURST - 2):
        lent_at = T0 + 0.003 + k * helper_ms(TOKENS) / 1000.0
        decision(
            lent_at,
            node_id="o",
            kind="dispatch",
            outcome="lent",
            wait_ms=int((lent_at - T0) * 1000),
            **pairing,
        )
        request_row("h", "fast", lent_at + 0.001, helper_ms(TOKENS), TOKENS, borrowed=True)


def run(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("lending_replay", "--since", "100000h", *args, stdout=out)
    lines = out.getvalue().strip().splitlines()
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


@pytest.mark.django_db
def test_rows_of_a_recorded_run_replay_to_its_makespan_within_five_percent() -> None:
    record_run()
    doc = run()
    (burst,) = doc["bursts"]
    assert burst["requests"] == BURST
    assert burst["actual"]["makespan_ms"] == pytest.approx(ACTUAL_MAKESPAN_MS, abs=1.0)
    assert burst["actual"]["lent"] == BURST - 2
    predicted = burst["recorded"]["makespan_ms"]
    assert abs(predicted - ACTUAL_MAKESPAN_MS) <= 0.05 * ACTUAL_MAKESPAN_MS, burst
    assert burst["recorded"]["lent"] == BURST - 2
    # No --set: the proposed run is the recorded one.
    assert burst["proposed"] == burst["recorded"]


@pytest.mark.django_db
def test_a_proposed_setting_changes_the_prediction(tmp_path: Path) -> None:
    record_run()
    plot = tmp_path / "replay.png"
    doc = run("--set", "scheduling_backend_depth=1", "--plot", str(plot))
    (burst,) = doc["bursts"]
    assert doc["set"] == ["scheduling_backend_depth=1"]
    assert burst["proposed"]["makespan_ms"] == pytest.approx(owner_ms(TOKENS), rel=0.05)
    assert burst["proposed"]["lent"] == BURST - 1
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--set", "scheduling_backend_depth=zero"), "scheduling_backend_depth"),
        (("--set", "no_such_setting=1"), "no_such_setting"),
        (("--set", "scheduling_backend_depth"), "key=value"),
        (("--owner", "o/big"), "--owner and --helper go together"),
        (("--gap", "soon"), "soon"),
        (("--input", "/nonexistent/rows.jsonl"), "no such file"),
    ],
)
def test_bad_arguments_are_refused_by_name(args: tuple[str, ...], fragment: str) -> None:
    record_run()
    with pytest.raises(CommandError, match=fragment):
        run(*args)


@pytest.mark.django_db
def test_nothing_recorded_is_said_plainly() -> None:
    with pytest.raises(CommandError, match="nothing to replay"):
        run()


@pytest.mark.django_db
def test_export_writes_csv_and_jsonl_that_the_replay_reads_back(tmp_path: Path) -> None:
    record_run()
    csv_path, jsonl_path = tmp_path / "requests.csv", tmp_path / "all.jsonl"
    call_command(
        "analytics_export",
        "--since",
        "100000h",
        "--format",
        "csv",
        "--output",
        str(csv_path),
        stderr=io.StringIO(),
    )
    lines = csv_path.read_text().splitlines()
    assert lines[0].split(",")[:3] == ["id", "node_id", "model_id"]
    assert len(lines) == 1 + RequestRecord.objects.count()
    call_command(
        "analytics_export", "--since", "100000h", "--output", str(jsonl_path), stderr=io.StringIO()
    )
    rows = [json.loads(line) for line in jsonl_path.read_text().splitlines()]
    tables = {row["table"] for row in rows}
    assert tables == {"requests", "loads", "decisions"}
    assert sum(row["table"] == "decisions" for row in rows) == OffloadDecision.objects.count()
    # The same rows from a file alone give the same replay.
    expected = run()
    RequestRecord.objects.all().delete()
    OffloadDecision.objects.all().delete()
    LoadRecord.objects.all().delete()
    assert run("--input", str(jsonl_path)) == expected


@pytest.mark.django_db
def test_export_refuses_two_tables_in_one_csv() -> None:
    with pytest.raises(CommandError, match="one table"):
        call_command(
            "analytics_export", "--format", "csv", "--table", "requests", "--table", "loads"
        )


def test_lent_requests_are_matched_by_request_id() -> None:
    import pandas as pd

    from lending.whatif import Selection, _arrivals

    pick = Selection("text", "o", "big", "h", "fast")

    def req(
        node: str, model: str, rid: str, start: float, tokens: int, borrowed: bool
    ) -> dict[str, Any]:
        return {
            "node_id": node,
            "model_id": model,
            "request_id": rid,
            "borrowed": borrowed,
            "started_at": start,
            "prompt_tokens": PROMPT,
            "output_tokens": tokens,
        }

    requests = pd.DataFrame(
        [
            # b was lent, came back and ran on the owner.
            req("o", "big", "b", 100.0, 7, False),
            # The helper's rows, in the opposite order of lending.
            req("h", "fast", "c", 100.5, 30, True),
            req("h", "fast", "a", 100.6, 20, True),
        ]
    )
    lent = [("a", 100.2, 150), ("b", 100.3, 250), ("c", 100.4, 350)]
    decisions = pd.DataFrame(
        [
            {
                "kind": "dispatch",
                "outcome": "lent",
                "node_id": "o",
                "owner_model_id": "big",
                "lane": "text",
                "request_id": rid,
                "recorded_at": at,
                "wait_ms": wait,
            }
            for rid, at, wait in lent
        ]
        + [
            {
                "kind": "dispatch",
                "outcome": "returned",
                "node_id": "o",
                "owner_model_id": "big",
                "lane": "text",
                "request_id": "b",
                "recorded_at": 100.35,
                "wait_ms": 0,
            }
        ]
    )
    arrivals = sorted(_arrivals(requests, decisions, pick))
    assert arrivals == [
        (pytest.approx(100.0), (PROMPT, 7.0)),  # b: its own row on the owner
        (pytest.approx(100.05), (PROMPT, 20.0)),  # a: arrived 150 ms before it was lent
        (pytest.approx(100.05), (PROMPT, 30.0)),  # c: 350 ms before
    ]


def test_the_request_held_for_the_helper_is_the_next_one_lent() -> None:
    # Recorded on a real cluster: the helper runs a little slower than its fit says, so a
    # request held for it would reach its release time just before a lent slot frees. The
    # owner lends the held request first when a slot frees, so the helper still takes all ten.
    slow_truth = Pair(**{**pair().__dict__, "helper_truth": fit(HELPER_BASE, 2.85)})
    known = CostTable(
        fits={
            ("o", "big", "llm"): fit(OWNER_BASE, OWNER_PER_TOKEN),
            ("h", "fast", "llm"): fit(HELPER_BASE, 2.6),
        },
        loads={},
    )
    recorded = Pair(**{**slow_truth.__dict__, "known": known})
    work = (float(PROMPT), float(TOKENS))
    arrivals = [Request(0.0, work), Request(241.0, work)] + [Request(290.0, work)] * 10
    (result,) = replay(recorded, DEFAULTS, arrivals)
    assert result.lent == 10
    assert result.makespan_ms == pytest.approx(2 * owner_ms(TOKENS))


def test_the_what_if_fit_of_a_text_lane_uses_the_text_floor() -> None:
    import pandas as pd

    from lending.whatif import _fit

    rows = pd.DataFrame(
        [{"success": True, "duration_ms": 400.0, "prompt_tokens": 20, "output_tokens": 8}] * 4
    )

    fit = _fit(rows, "text", 3)

    assert fit is not None
    assert fit.predict((36.0, 8.0)) == 400.0
    assert fit.predict((37.0, 8.0)) is None


def test_the_what_if_fit_of_an_image_lane_has_no_absolute_floor() -> None:
    import pandas as pd

    from lending.whatif import _fit

    one = {"success": True, "duration_ms": 300.0, "image_width": 8, "image_height": 8}
    rows = pd.DataFrame([{**one, "image_steps": 1, "image_count": 1}] * 4)

    fit = _fit(rows, "image", 3)

    assert fit is not None
    assert fit.predict((70.0,)) == 300.0
    assert fit.predict((71.0,)) is None
