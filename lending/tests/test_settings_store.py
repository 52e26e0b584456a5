"""Lending settings: layering (override → config → default), the DB store, the typed view."""

from __future__ import annotations

import pytest

from lending.keys import LENDING_KEYS, LendingSettingError, default_values, fingerprint
from lending.models import OffloadSetting
from lending.settings_store import (
    EffectiveSettings,
    SettingEntry,
    overrides_load,
    settings_clear,
    settings_effective,
    settings_fingerprint,
    settings_resolve,
    settings_save,
)
from lending.tests.factories import OffloadSettingFactory

NOW_MS = 1_750_000_000_000
DEPTH = "scheduling_backend_depth"
PROBE_IDLE = "offload_probe_idle"
HOLD = "offload_hold_for_faster_helper"


def entry(entries: list[SettingEntry], key: str) -> SettingEntry:
    return next(e for e in entries if e.key == key)


def stored() -> dict[str, tuple[str, int]]:
    return {row.key: (row.value, row.updated_at) for row in OffloadSetting.objects.all()}


# -- resolution ------------------------------------------------------------------------------


def test_with_no_layers_every_key_runs_its_default_in_declared_order() -> None:
    entries = settings_resolve(file_values={}, overrides={})
    assert [e.key for e in entries] == [k.name for k in LENDING_KEYS]
    assert all(e.source == "default" and e.effective == e.default for e in entries)
    assert settings_effective(entries) == default_values()


def test_a_config_value_beats_the_default() -> None:
    depth = entry(settings_resolve(file_values={DEPTH: "3"}, overrides={}), DEPTH)
    assert (depth.config, depth.override, depth.effective, depth.source) == (
        "3",
        None,
        "3",
        "config",
    )


def test_a_stored_override_beats_the_config_value() -> None:
    depth = entry(settings_resolve(file_values={DEPTH: "3"}, overrides={DEPTH: "5"}), DEPTH)
    assert (depth.effective, depth.source) == ("5", "db")
    assert depth.config == "3"


def test_a_stored_override_that_no_longer_validates_is_shown_but_the_config_wins() -> None:
    depth = entry(settings_resolve(file_values={DEPTH: "3"}, overrides={DEPTH: "0"}), DEPTH)
    assert (depth.override, depth.effective, depth.source) == ("0", "3", "config")


def test_an_invalid_config_value_is_shown_but_the_default_applies() -> None:
    idle = entry(settings_resolve(file_values={PROBE_IDLE: "30d"}, overrides={}), PROBE_IDLE)
    assert (idle.config, idle.effective, idle.source) == ("30d", "5s", "default")


def test_an_override_is_applied_in_its_canonical_form() -> None:
    idle = entry(settings_resolve(file_values={}, overrides={PROBE_IDLE: " 1500ms "}), PROBE_IDLE)
    assert (idle.effective, idle.source) == ("1.5s", "db")


def test_overrides_for_keys_this_build_does_not_know_are_ignored() -> None:
    entries = settings_resolve(file_values={}, overrides={"offload_future_knob": "7"})
    assert "offload_future_knob" not in settings_effective(entries)
    assert len(entries) == len(LENDING_KEYS)


def test_as_dict_omits_the_absent_layers_and_keeps_the_present_ones() -> None:
    entries = settings_resolve(file_values={DEPTH: "3"}, overrides={HOLD: "false"})
    assert entry(entries, PROBE_IDLE).as_dict() == {
        "key": PROBE_IDLE,
        "kind": "duration",
        "description": entry(entries, PROBE_IDLE).description,
        "default": "5s",
        "effective": "5s",
        "source": "default",
    }
    assert entry(entries, DEPTH).as_dict()["config"] == "3"
    assert "override" not in entry(entries, DEPTH).as_dict()
    assert entry(entries, HOLD).as_dict()["override"] == "false"
    assert "config" not in entry(entries, HOLD).as_dict()


def test_the_fingerprint_hashes_the_effective_values() -> None:
    defaults = settings_resolve(file_values={}, overrides={})
    changed = settings_resolve(file_values={DEPTH: "3"}, overrides={})
    assert settings_fingerprint(defaults) == fingerprint(default_values())
    assert settings_fingerprint(changed) != settings_fingerprint(defaults)


def test_two_spellings_of_the_same_value_fingerprint_equal() -> None:
    spelled = settings_resolve(file_values={}, overrides={"scheduling_refresh_interval": "60s"})
    assert settings_fingerprint(spelled) == settings_fingerprint(
        settings_resolve(file_values={}, overrides={})
    )


# -- database store --------------------------------------------------------------------------


@pytest.mark.django_db
def test_saving_stores_canonical_strings_with_the_time() -> None:
    settings_save(values={PROBE_IDLE: "1500ms", DEPTH: " 4 ", HOLD: " FALSE "}, now_ms=NOW_MS)
    assert stored() == {
        PROBE_IDLE: ("1.5s", NOW_MS),
        DEPTH: ("4", NOW_MS),
        HOLD: ("false", NOW_MS),
    }
    assert overrides_load() == {PROBE_IDLE: "1.5s", DEPTH: "4", HOLD: "false"}


@pytest.mark.django_db
def test_saving_again_replaces_the_stored_value() -> None:
    settings_save(values={DEPTH: "4"}, now_ms=NOW_MS)
    settings_save(values={DEPTH: "6"}, now_ms=NOW_MS + 1)
    assert stored() == {DEPTH: ("6", NOW_MS + 1)}


@pytest.mark.django_db
def test_yaml_style_booleans_and_numbers_are_accepted() -> None:
    settings_save(values={HOLD: False, DEPTH: 8}, now_ms=NOW_MS)
    assert overrides_load() == {HOLD: "false", DEPTH: "8"}


@pytest.mark.django_db
def test_one_bad_value_in_a_batch_writes_nothing_and_names_the_key() -> None:
    settings_save(values={DEPTH: "4"}, now_ms=NOW_MS)
    with pytest.raises(LendingSettingError) as caught:
        settings_save(values={DEPTH: "5", PROBE_IDLE: "soon"}, now_ms=NOW_MS + 1)
    assert caught.value.key == PROBE_IDLE
    assert PROBE_IDLE in str(caught.value)
    assert stored() == {DEPTH: ("4", NOW_MS)}


@pytest.mark.django_db
def test_an_unknown_key_is_refused_and_nothing_is_written() -> None:
    with pytest.raises(LendingSettingError, match="unknown lending setting") as caught:
        settings_save(values={DEPTH: "5", "offload_turbo": "true"}, now_ms=NOW_MS)
    assert caught.value.key == "offload_turbo"
    assert stored() == {}


@pytest.mark.django_db
def test_a_value_of_the_wrong_type_is_refused_naming_the_key() -> None:
    with pytest.raises(LendingSettingError) as caught:
        settings_save(values={DEPTH: [4]}, now_ms=NOW_MS)
    assert caught.value.key == DEPTH
    assert stored() == {}


@pytest.mark.django_db
def test_clearing_one_key_leaves_the_others() -> None:
    settings_save(values={DEPTH: "4", HOLD: "false"}, now_ms=NOW_MS)
    assert settings_clear(key=DEPTH) == 1
    assert overrides_load() == {HOLD: "false"}
    assert settings_clear(key=DEPTH) == 0


@pytest.mark.django_db
def test_clearing_without_a_key_removes_every_override() -> None:
    settings_save(values={DEPTH: "4", HOLD: "false"}, now_ms=NOW_MS)
    OffloadSettingFactory(key="offload_from_a_newer_build", value="x", updated_at=1)
    assert settings_clear(key=None) == 3
    assert overrides_load() == {}


@pytest.mark.django_db
def test_clearing_an_unknown_key_is_refused() -> None:
    with pytest.raises(LendingSettingError, match="unknown lending setting"):
        settings_clear(key="offload_turbo")


@pytest.mark.django_db
def test_a_stored_value_that_no_longer_validates_loads_as_it_is() -> None:
    OffloadSettingFactory(key=DEPTH, value="0", updated_at=NOW_MS)
    assert overrides_load() == {DEPTH: "0"}


# -- typed view ------------------------------------------------------------------------------


def test_effective_settings_from_defaults_parse_every_key() -> None:
    s = EffectiveSettings.from_values({})
    assert (s.refresh_interval_secs, s.sample_window_secs) == (60.0, 86_400.0)
    assert (s.min_samples, s.backend_depth, s.context_reserve) == (20, 2, 256)
    assert (s.grant_ttl_secs, s.restore_delay_secs, s.probe_idle_secs) == (30.0, 1.5, 5.0)
    assert (s.faster_slots, s.slower_slots, s.probe_slots) == (2, 1, 1)
    assert s.hold_for_faster_helper is True
    assert s.decisions_retention_secs == 720 * 3600.0
    assert s.lent_stall_timeout_secs == 180.0
    assert s.fingerprint == fingerprint(default_values())


def test_effective_settings_take_given_values_and_drop_unknown_keys() -> None:
    s = EffectiveSettings.from_values(
        {DEPTH: "7", HOLD: "false", PROBE_IDLE: "250ms", "offload_future_knob": "1"}
    )
    assert (s.backend_depth, s.hold_for_faster_helper, s.probe_idle_secs) == (7, False, 0.25)
    assert s.values[PROBE_IDLE] == "250ms"
    assert "offload_future_knob" not in s.values


def test_effective_settings_refuse_an_invalid_value_naming_the_key() -> None:
    with pytest.raises(LendingSettingError) as caught:
        EffectiveSettings.from_values({DEPTH: "0"})
    assert caught.value.key == DEPTH
