"""Read-side queries for lending: the settings a node runs, and the decision log."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from lending.decisions import decisions_query
from lending.ports import LendingNode
from lending.settings_store import (
    EffectiveSettings,
    SettingEntry,
    overrides_load,
    settings_effective,
    settings_fingerprint,
    settings_resolve,
)

__all__ = [
    "decisions_query",
    "lending_summary",
    "settings_document",
    "settings_effective_load",
    "settings_entries",
    "settings_file_values",
]


def settings_file_values() -> dict[str, str]:
    """The lending settings this node's config file sets (already canonical)."""
    return settings.ROUTER.lending_file_values()


def settings_entries() -> list[SettingEntry]:
    """Every lending setting with its layers, reading the database overrides."""
    return settings_resolve(file_values=settings_file_values(), overrides=overrides_load())


def settings_effective_load() -> EffectiveSettings:
    """What this node runs when it reads its own layers (a master or standalone node)."""
    return EffectiveSettings.from_values(settings_effective(settings_entries()))


def settings_document(entries: list[SettingEntry]) -> dict[str, Any]:
    """The settings API's answer for ``entries``."""
    return {
        "entries": [entry.as_dict() for entry in entries],
        "fingerprint": settings_fingerprint(entries),
        # This router always has its database store; the field stays for the reference's
        # WebUI, which disables the form when it is false.
        "editable": True,
    }


def lending_summary(*, node: LendingNode) -> dict[str, Any]:
    """This node's entry of the lending summary: its build, settings and held requests."""
    return {
        "node_id": node.node_id,
        "build_version": settings.ROUTER_VERSION,
        **node.lending.summary(),
    }
