"""The lending settings as a node runs them: database override → config file → default.

Resolution is pure (``settings_resolve``) so the same code answers the settings API, the
fingerprint a node publishes and the values the scheduler runs. Only a master or a
standalone node reads the database layer; slaves run exactly the map the master sends.

Every value is a canonical string (``lending.keys.canonical_value``): two spellings of one
value must fingerprint equal, and a stored override must read back exactly as saved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from django.db import transaction

from lending.keys import (
    KEYS_BY_NAME,
    LENDING_KEYS,
    LendingKind,
    LendingSettingError,
    canonical_value,
    fingerprint,
)
from lending.models import OffloadSetting
from routerproject.durations import parse_duration

__all__ = [
    "EffectiveSettings",
    "SettingEntry",
    "SettingSource",
    "overrides_load",
    "settings_clear",
    "settings_effective",
    "settings_fingerprint",
    "settings_resolve",
    "settings_save",
    "value_text",
]

SettingSource = Literal["default", "config", "db"]


@dataclass(frozen=True, slots=True)
class SettingEntry:
    """One row of the settings table as the API shows it."""

    key: str
    kind: LendingKind
    description: str
    default: str
    config: str | None
    override: str | None
    effective: str
    source: SettingSource

    def as_dict(self) -> dict[str, str]:
        doc = {
            "key": self.key,
            "kind": self.kind,
            "description": self.description,
            "default": self.default,
        }
        if self.config is not None:
            doc["config"] = self.config
        if self.override is not None:
            doc["override"] = self.override
        doc["effective"] = self.effective
        doc["source"] = self.source
        return doc


def _valid(key: str, raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        return canonical_value(key, raw)
    except LendingSettingError:
        return None


def settings_resolve(
    *, file_values: Mapping[str, str], overrides: Mapping[str, str]
) -> list[SettingEntry]:
    """Every lending setting in declared order with its layers and effective value.

    A layer whose value does not validate is still shown (an operator has to see why a
    stored override has no effect) but the next layer down wins. Keys not in the table,
    such as a row written by a newer build, are ignored.
    """
    entries: list[SettingEntry] = []
    for spec in LENDING_KEYS:
        override = overrides.get(spec.name)
        config = file_values.get(spec.name)
        effective = _valid(spec.name, override)
        source: SettingSource = "db"
        if effective is None:
            effective = _valid(spec.name, config)
            source = "config"
        if effective is None:
            effective = spec.default
            source = "default"
        entries.append(
            SettingEntry(
                key=spec.name,
                kind=spec.kind,
                description=spec.description,
                default=spec.default,
                config=config,
                override=override,
                effective=effective,
                source=source,
            )
        )
    return entries


def settings_effective(entries: Iterable[SettingEntry]) -> dict[str, str]:
    return {entry.key: entry.effective for entry in entries}


def settings_fingerprint(entries: Iterable[SettingEntry]) -> str:
    return fingerprint(settings_effective(entries))


def value_text(key: str, value: Any) -> str:
    """The string form of a value as YAML or JSON may carry it (``true``, ``3``, ``"2s"``)."""
    # bool first: it is an int subclass, and True must read "true", not "1".
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise LendingSettingError(
        key, f"must be a string, number or boolean (got {type(value).__name__})"
    )


# -- database layer ----------------------------------------------------------------------


def overrides_load() -> dict[str, str]:
    """Every stored override as saved, valid or not (resolution decides what applies)."""
    return dict(OffloadSetting.objects.values_list("key", "value"))


def settings_save(*, values: Mapping[str, Any], now_ms: int) -> None:
    """Store overrides for ``values``; all of them or, if any is refused, none.

    Raises ``LendingSettingError`` naming the first refused key, in the order given.
    """
    canonical: dict[str, str] = {}
    # Validate the whole batch before touching the table: a form that sends ten fields
    # with one typo must not leave the other nine half-applied.
    for key, value in values.items():
        if key not in KEYS_BY_NAME:
            raise LendingSettingError(key, "unknown lending setting")
        canonical[key] = canonical_value(key, value_text(key, value))
    if not canonical:
        return
    with transaction.atomic():
        for key, text in canonical.items():
            OffloadSetting.objects.update_or_create(
                key=key, defaults={"value": text, "updated_at": now_ms}
            )


def settings_clear(*, key: str | None) -> int:
    """Remove the override of ``key``, or every override when ``key`` is None.

    Returns how many rows were removed (0 when the key had no override).
    """
    if key is None:
        deleted, _ = OffloadSetting.objects.all().delete()
        return deleted
    if key not in KEYS_BY_NAME:
        raise LendingSettingError(key, "unknown lending setting")
    deleted, _ = OffloadSetting.objects.filter(key=key).delete()
    return deleted


# -- typed view for the scheduler ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EffectiveSettings:
    """The effective lending settings parsed once, for code that reads them on hot paths."""

    values: Mapping[str, str]
    refresh_interval_secs: float
    sample_window_secs: float
    min_samples: int
    backend_depth: int
    grant_ttl_secs: float
    context_reserve: int
    restore_delay_secs: float
    probe_idle_secs: float
    faster_slots: int
    slower_slots: int
    probe_slots: int
    hold_for_faster_helper: bool
    decisions_retention_secs: float
    lent_stall_timeout_secs: float

    @classmethod
    def from_values(cls, values: Mapping[str, str]) -> EffectiveSettings:
        """Build from a ``{key: value}`` map; missing keys take their default.

        Keys this build does not know are dropped (a newer master may send them); a value
        that does not validate raises ``LendingSettingError`` naming its key.
        """
        canon: dict[str, str] = {}
        for spec in LENDING_KEYS:
            raw = values.get(spec.name)
            canon[spec.name] = spec.default if raw is None else canonical_value(spec.name, raw)

        def secs(key: str) -> float:
            return parse_duration(canon[key])

        def whole(key: str) -> int:
            return int(canon[key])

        return cls(
            values=canon,
            refresh_interval_secs=secs("scheduling_refresh_interval"),
            sample_window_secs=secs("scheduling_sample_window"),
            min_samples=whole("scheduling_min_samples"),
            backend_depth=whole("scheduling_backend_depth"),
            grant_ttl_secs=secs("scheduling_grant_ttl"),
            context_reserve=whole("scheduling_context_reserve"),
            restore_delay_secs=secs("offload_restore_delay"),
            probe_idle_secs=secs("offload_probe_idle"),
            faster_slots=whole("offload_faster_helper_slots"),
            slower_slots=whole("offload_slower_helper_slots"),
            probe_slots=whole("offload_probe_helper_slots"),
            hold_for_faster_helper=canon["offload_hold_for_faster_helper"] == "true",
            decisions_retention_secs=secs("offload_decisions_retention"),
            lent_stall_timeout_secs=secs("offload_lent_stall_timeout"),
        )

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.values)
