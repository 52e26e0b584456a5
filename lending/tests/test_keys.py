from __future__ import annotations

import hashlib

import pytest

from lending.keys import (
    KEYS_BY_NAME,
    LENDING_KEYS,
    LendingSettingError,
    canonical_value,
    default_values,
    fingerprint,
)

DECLARED_DEFAULTS = [
    ("scheduling_refresh_interval", "duration", "1m0s"),
    ("scheduling_sample_window", "duration", "24h0m0s"),
    ("scheduling_min_samples", "integer", "20"),
    ("scheduling_backend_depth", "integer", "2"),
    ("scheduling_grant_ttl", "duration", "30s"),
    ("scheduling_context_reserve", "integer", "256"),
    ("offload_restore_delay", "duration", "1.5s"),
    ("offload_probe_idle", "duration", "5s"),
    ("offload_faster_helper_slots", "integer", "2"),
    ("offload_slower_helper_slots", "integer", "1"),
    ("offload_probe_helper_slots", "integer", "1"),
    ("offload_hold_for_faster_helper", "boolean", "true"),
    ("offload_decisions_retention", "duration", "720h0m0s"),
    ("offload_lent_stall_timeout", "duration", "3m0s"),
]

INTEGER_RANGES = {
    "scheduling_min_samples": (2, 100000),
    "scheduling_backend_depth": (1, 64),
    "scheduling_context_reserve": (0, 1048576),
    "offload_faster_helper_slots": (1, 64),
    "offload_slower_helper_slots": (1, 64),
    "offload_probe_helper_slots": (1, 64),
}


def test_the_table_lists_every_key_in_declared_order_with_kind_and_default() -> None:
    assert [(k.name, k.kind, k.default) for k in LENDING_KEYS] == DECLARED_DEFAULTS


def test_the_integer_ranges_match_the_reference() -> None:
    ranges = {k.name: (k.minimum, k.maximum) for k in LENDING_KEYS if k.kind == "integer"}
    assert ranges == INTEGER_RANGES


def test_keys_by_name_indexes_the_same_entries() -> None:
    assert list(KEYS_BY_NAME) == [k.name for k in LENDING_KEYS]
    assert all(KEYS_BY_NAME[k.name] is k for k in LENDING_KEYS)


def test_every_default_is_already_canonical() -> None:
    for key in LENDING_KEYS:
        assert canonical_value(key.name, key.default) == key.default


def test_default_values_returns_every_key_at_its_default() -> None:
    assert default_values() == {name: default for name, _, default in DECLARED_DEFAULTS}


def test_every_key_has_a_one_sentence_description() -> None:
    for key in LENDING_KEYS:
        text = key.description
        assert text and text[0].isupper() and text.endswith(".")
        assert "\n" not in text
        assert text.count(". ") == 0, key.name


def test_entries_are_immutable() -> None:
    with pytest.raises(AttributeError):
        LENDING_KEYS[0].default = "2m0s"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("offload_restore_delay", "1500ms", "1.5s"),
        ("scheduling_refresh_interval", "60s", "1m0s"),
        ("scheduling_sample_window", "24h", "24h0m0s"),
        ("offload_decisions_retention", "720h", "720h0m0s"),
        ("offload_probe_idle", " 2s ", "2s"),
        ("scheduling_grant_ttl", "1h30m", "1h30m0s"),
        ("offload_lent_stall_timeout", "180s", "3m0s"),
    ],
)
def test_it_canonicalises_durations(key: str, raw: str, expected: str) -> None:
    assert canonical_value(key, raw) == expected


@pytest.mark.parametrize("raw", ["0", "0s", "30d", "5", "", "fast", "-1s"])
def test_it_rejects_durations_that_are_invalid_or_not_positive(raw: str) -> None:
    with pytest.raises(LendingSettingError) as info:
        canonical_value("scheduling_grant_ttl", raw)
    assert info.value.key == "scheduling_grant_ttl"
    assert "scheduling_grant_ttl" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("20", "20"), (" 20 ", "20"), ("+7", "7"), ("0020", "20"), ("\t100000\n", "100000")],
)
def test_it_canonicalises_integers(raw: str, expected: str) -> None:
    assert canonical_value("scheduling_min_samples", raw) == expected


@pytest.mark.parametrize("raw", ["1.5", "1e3", "1_000", "twenty", "", "2 0", "\u0663"])
def test_it_rejects_integers_that_are_not_whole_decimal_numbers(raw: str) -> None:
    with pytest.raises(LendingSettingError, match="whole number"):
        canonical_value("scheduling_min_samples", raw)


@pytest.mark.parametrize(("key", "bounds"), sorted(INTEGER_RANGES.items()))
def test_it_accepts_integers_at_both_ends_of_the_range_and_nothing_beyond(
    key: str, bounds: tuple[int, int]
) -> None:
    low, high = bounds
    assert canonical_value(key, str(low)) == str(low)
    assert canonical_value(key, str(high)) == str(high)
    for outside in (low - 1, high + 1):
        with pytest.raises(LendingSettingError, match="between"):
            canonical_value(key, str(outside))


@pytest.mark.parametrize("raw", ["1", "t", "T", "TRUE", "true", "True", " true "])
def test_it_reads_go_true_spellings_as_true(raw: str) -> None:
    assert canonical_value("offload_hold_for_faster_helper", raw) == "true"


@pytest.mark.parametrize("raw", ["0", "f", "F", "FALSE", "false", "False", " FALSE "])
def test_it_reads_go_false_spellings_as_false(raw: str) -> None:
    assert canonical_value("offload_hold_for_faster_helper", raw) == "false"


@pytest.mark.parametrize("raw", ["sometimes", "yes", "no", "tRUE", "2", ""])
def test_it_rejects_other_boolean_spellings(raw: str) -> None:
    with pytest.raises(LendingSettingError, match="true or false"):
        canonical_value("offload_hold_for_faster_helper", raw)


def test_it_rejects_an_unknown_key_naming_it() -> None:
    with pytest.raises(ValueError, match="unknown lending setting") as info:
        canonical_value("offload_everything", "1")
    assert "offload_everything" in str(info.value)


def test_its_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        canonical_value("scheduling_backend_depth", "0")


def test_the_fingerprint_is_twelve_hex_chars_of_sha256_over_keys_in_declared_order() -> None:
    values = default_values()
    payload = "".join(f"{name}={values[name]}\n" for name, _, _ in DECLARED_DEFAULTS)
    expected = hashlib.sha256(payload.encode()).hexdigest()[:12]
    assert fingerprint(values) == expected


def test_the_fingerprint_ignores_mapping_order_and_unknown_keys() -> None:
    values = default_values()
    reversed_values = dict(reversed(list(values.items())))
    reversed_values["not_a_setting"] = "x"
    assert fingerprint(reversed_values) == fingerprint(values)


def test_the_fingerprint_changes_when_any_one_value_changes() -> None:
    base = default_values()
    seen = {fingerprint(base)}
    for key in LENDING_KEYS:
        changed = dict(base)
        changed[key.name] = (
            "false" if key.kind == "boolean" else "3" if key.kind == "integer" else "7s"
        )
        seen.add(fingerprint(changed))
    assert len(seen) == len(LENDING_KEYS) + 1


def test_the_fingerprint_counts_a_missing_key_as_its_default() -> None:
    values = default_values()
    del values["offload_probe_idle"]
    assert fingerprint(values) == fingerprint(default_values())
