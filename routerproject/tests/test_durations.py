from __future__ import annotations

import pytest

from routerproject.durations import (
    format_duration,
    format_duration_ns,
    parse_duration,
    parse_duration_ns,
)

NS = 1
US = 1_000
MS = 1_000_000
SEC = 1_000_000_000
MIN = 60 * SEC
HOUR = 60 * MIN


@pytest.mark.parametrize(
    ("text", "expected_ns"),
    [
        ("500ms", 500 * MS),
        ("1.5s", 1_500_000_000),
        ("2m", 2 * MIN),
        ("1h30m", HOUR + 30 * MIN),
        ("1m0s", MIN),
        ("250us", 250 * US),
        ("250\u00b5s", 250 * US),
        ("250\u03bcs", 250 * US),
        ("10ns", 10 * NS),
        ("+5s", 5 * SEC),
        ("0", 0),
        ("+0", 0),
        ("0s", 0),
        (".5s", 500 * MS),
        ("1.s", SEC),
        ("1.5h", HOUR + 30 * MIN),
        ("1h1m1.5s", HOUR + MIN + 1_500_000_000),
        ("720h", 720 * HOUR),
        ("2h45m30.25s", 2 * HOUR + 45 * MIN + 30_250_000_000),
        ("0.000000001s", 1),
        ("1.0000000001s", SEC),
        ("1.9ns", 1),
        ("9223372036.854775807s", 2**63 - 1),
    ],
)
def test_it_parses_go_durations_to_exact_nanoseconds(text: str, expected_ns: int) -> None:
    assert parse_duration_ns(text) == expected_ns


@pytest.mark.parametrize(
    "text",
    [
        "30d",
        "5",
        "1.5",
        "s",
        "",
        "+",
        ".s",
        ".",
        "-1s",
        " 1s",
        "1s ",
        "1 s",
        "1.5.5s",
        "1sm",
        "1S",
        "1h-30m",
        "1_000ms",
        "\u0663s",
        "9223372036.854775808s",
        "3000000h",
    ],
)
def test_it_rejects_anything_that_is_not_a_go_duration(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration_ns(text)


def test_its_error_message_quotes_the_input_and_shows_the_accepted_forms() -> None:
    with pytest.raises(ValueError) as info:
        parse_duration_ns("30d")
    assert str(info.value) == 'invalid duration "30d": use forms like 500ms, 1.5s, 2m, 1h30m'


def test_it_refuses_a_value_that_is_not_a_string() -> None:
    with pytest.raises(TypeError):
        parse_duration_ns(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ns", "expected"),
    [
        (0, "0s"),
        (1, "1ns"),
        (999, "999ns"),
        (US, "1\u00b5s"),
        (1_500, "1.5\u00b5s"),
        (MS, "1ms"),
        (1_500 * US, "1.5ms"),
        (1_234_567, "1.234567ms"),
        (500 * MS, "500ms"),
        (SEC, "1s"),
        (1_500 * MS, "1.5s"),
        (SEC + 1, "1.000000001s"),
        (60 * SEC, "1m0s"),
        (90 * MIN, "1h30m0s"),
        (3 * MIN, "3m0s"),
        (24 * HOUR, "24h0m0s"),
        (720 * HOUR, "720h0m0s"),
        (HOUR + 1_500 * MS, "1h0m1.5s"),
        (-1_500 * MS, "-1.5s"),
        (-500 * MS, "-500ms"),
        (2**63 - 1, "2562047h47m16.854775807s"),
    ],
)
def test_it_formats_nanoseconds_in_gos_canonical_form(ns: int, expected: str) -> None:
    assert format_duration_ns(ns) == expected


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1500ms", "1.5s"),
        ("60s", "1m0s"),
        ("0.5s", "500ms"),
        ("24h", "24h0m0s"),
        ("720h", "720h0m0s"),
        ("90m", "1h30m0s"),
        ("0", "0s"),
        ("1500us", "1.5ms"),
        ("1h30m", "1h30m0s"),
    ],
)
def test_equal_durations_spelled_differently_print_the_same(text: str, canonical: str) -> None:
    assert format_duration_ns(parse_duration_ns(text)) == canonical


@pytest.mark.parametrize(
    "ns",
    [
        1,
        999,
        1_000,
        1_001,
        123_456_789,
        SEC,
        SEC + 1,
        59 * SEC,
        61 * SEC,
        3_599 * SEC,
        86_399 * SEC,
    ],
)
def test_a_formatted_duration_parses_back_to_the_same_nanoseconds(ns: int) -> None:
    assert parse_duration_ns(format_duration_ns(ns)) == ns


def test_it_converts_to_and_from_float_seconds() -> None:
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("250ms") == 0.25
    assert parse_duration("2h") == 7200.0
    assert format_duration(1.5) == "1.5s"
    assert format_duration(0.1) == "100ms"
    assert format_duration(2592000.0) == "720h0m0s"
    assert format_duration(0) == "0s"
