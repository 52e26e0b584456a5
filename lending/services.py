"""Write-side operations for lending settings and the decision log."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import transaction

from lending.models import ImageLink, LegacyRoutingGroupMember, OffloadDecision, TextLink
from lending.selectors import settings_entries
from lending.settings_store import (
    SettingEntry,
    settings_clear,
    settings_fingerprint,
    settings_save,
)

__all__ = [
    "PRUNE_BATCH_ROWS",
    "GroupMember",
    "LaneUpgrade",
    "RoutingGroupsUpgrade",
    "decisions_prune",
    "routing_groups_parse",
    "routing_groups_upgrade",
    "settings_changed",
    "settings_reset",
    "settings_update",
]

logger = logging.getLogger(__name__)

# Deleted per statement: on SQLite one huge DELETE would hold the write lock long enough to
# stall the router's own one-second decision flushes.
PRUNE_BATCH_ROWS = 5_000


def settings_update(*, values: Mapping[str, Any], now_ms: int) -> list[SettingEntry]:
    """Store overrides (all or none; ``LendingSettingError`` names a refused key)."""
    settings_save(values=values, now_ms=now_ms)
    return settings_entries()


def settings_reset(*, key: str | None) -> list[SettingEntry]:
    """Clear one override, or all of them when ``key`` is None."""
    settings_clear(key=key)
    return settings_entries()


async def settings_changed(*, entries: Sequence[SettingEntry]) -> None:
    """Called on the router's loop after the stored lending settings changed.

    The place to apply the new values in this process and push them to every slave.
    """
    from lending.ports import running_node
    from lending.propagate import settings_publish

    logger.info("lending settings changed; fingerprint %s", settings_fingerprint(entries))
    # Applies live here (a depth change re-admits at once) and reaches every slave now, not at
    # the next tick.
    errors = await settings_publish(running_node())
    for node_id, error in sorted(errors.items()):
        logger.warning("settings push to %s failed: %s", node_id, error)


def decisions_prune(*, now_ms: int, retention_ms: int) -> int:
    """Delete decision rows recorded before ``now_ms - retention_ms``; returns the count.

    Works in bounded batches, each its own statement, so it is safe to run twice or
    beside the router's writer.
    """
    cutoff = now_ms - retention_ms
    total = 0
    while True:
        ids = list(
            OffloadDecision.objects.filter(recorded_at__lt=cutoff).values_list("id", flat=True)[
                :PRUNE_BATCH_ROWS
            ]
        )
        if not ids:
            return total
        deleted, _ = OffloadDecision.objects.filter(id__in=ids).delete()
        total += deleted
        if len(ids) < PRUNE_BATCH_ROWS:
            return total


# -- upgrade from symmetric routing groups -------------------------------------------------

UPGRADE_LANES = ("image", "text")

LinkKey = tuple[str, str, str, str]
"""(owner_node_id, owner_model_id, helper_node_id, helper_model_id)"""


@dataclass(frozen=True)
class GroupMember:
    node_id: str
    model_id: str
    restore_after_borrow: bool = False


@dataclass
class LaneUpgrade:
    lane: str
    created: int = 0
    skipped: int = 0
    same_node_pairs: int = 0


@dataclass
class RoutingGroupsUpgrade:
    lanes: dict[str, LaneUpgrade] = field(default_factory=dict)
    legacy_rows: int = 0
    dry_run: bool = False

    @property
    def created(self) -> int:
        return sum(lane.created for lane in self.lanes.values())

    @property
    def skipped(self) -> int:
        return sum(lane.skipped for lane in self.lanes.values())


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: must be a non-empty string")
    return value.strip()


def routing_groups_parse(doc: Any) -> dict[str, list[list[GroupMember]]]:
    """Groups from an earlier release's export, ``{"image": [GROUP], "text": [GROUP]}``.

    Raises ``ValueError`` naming the place of the first problem (``text[0].members[2].node_id``)
    so an operator can fix the file; a lane that is absent has no groups.
    """
    if not isinstance(doc, dict):
        raise ValueError('the file must hold a JSON object {"image": [...], "text": [...]}')
    unknown = sorted(set(doc) - set(UPGRADE_LANES))
    if unknown:
        raise ValueError(f"unknown lane {unknown[0]!r} (expected image or text)")
    parsed: dict[str, list[list[GroupMember]]] = {}
    for lane in UPGRADE_LANES:
        groups = doc.get(lane, [])
        if not isinstance(groups, list):
            raise ValueError(f"{lane}: must be a list of groups")
        parsed[lane] = []
        for g, group in enumerate(groups):
            where = f"{lane}[{g}]"
            members = group.get("members") if isinstance(group, dict) else None
            if not isinstance(members, list):
                raise ValueError(f'{where}: must be an object with a "members" list')
            parsed_group: list[GroupMember] = []
            for m, member in enumerate(members):
                at = f"{where}.members[{m}]"
                if not isinstance(member, dict):
                    raise ValueError(f"{at}: must be an object with node_id and model_id")
                restore = member.get("restore_after_borrow", False)
                if not isinstance(restore, bool):
                    raise ValueError(f"{at}.restore_after_borrow: must be true or false")
                parsed_group.append(
                    GroupMember(
                        node_id=_text(member.get("node_id"), f"{at}.node_id"),
                        model_id=_text(member.get("model_id"), f"{at}.model_id"),
                        restore_after_borrow=restore,
                    )
                )
            parsed[lane].append(parsed_group)
    return parsed


def _group_links(
    groups: Iterable[Sequence[GroupMember]], report: LaneUpgrade
) -> dict[LinkKey, bool]:
    """Both one-way links for every cross-node pair; value = the helper's restore flag."""
    links: dict[LinkKey, bool] = {}
    for group in groups:
        for i, owner in enumerate(group):
            for j, helper in enumerate(group):
                if i == j:
                    continue
                if owner.node_id == helper.node_id:
                    # Counted once per unordered pair; a node never lends to itself.
                    report.same_node_pairs += int(i < j)
                    continue
                key = (owner.node_id, owner.model_id, helper.node_id, helper.model_id)
                # A member listed in several groups keeps restore if any group gave it.
                links[key] = links.get(key, False) or helper.restore_after_borrow
    return links


def _legacy_groups() -> tuple[dict[str, list[list[GroupMember]]], list[int]]:
    by_group: dict[tuple[str, str], list[GroupMember]] = {}
    ids: list[int] = []
    rows = LegacyRoutingGroupMember.objects.filter(lane__in=UPGRADE_LANES).order_by("id")
    for row in rows:
        ids.append(row.pk)
        by_group.setdefault((row.lane, row.group_id), []).append(
            GroupMember(row.node_id, row.model_id, row.restore_after_borrow)
        )
    groups: dict[str, list[list[GroupMember]]] = {lane: [] for lane in UPGRADE_LANES}
    for (lane, _), members in by_group.items():
        groups[lane].append(members)
    return groups, ids


_Link = TypeVar("_Link", ImageLink, TextLink)


def _links_create_missing(
    model: type[_Link], wanted: Mapping[LinkKey, bool], *, dry_run: bool
) -> int:
    existing = set(
        model.objects.values_list(
            "owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id"
        )
    )
    new = [
        model(
            owner_node_id=key[0],
            owner_model_id=key[1],
            helper_node_id=key[2],
            helper_model_id=key[3],
            load_if_unloaded=True,
            restore_after_borrow=restore,
        )
        for key, restore in wanted.items()
        if key not in existing
    ]
    if new and not dry_run:
        # ignore_conflicts: a link saved from the API meanwhile wins, untouched.
        model.objects.bulk_create(new, ignore_conflicts=True)
    return len(new)


def routing_groups_upgrade(
    *, groups: Mapping[str, Sequence[Sequence[GroupMember]]], dry_run: bool
) -> RoutingGroupsUpgrade:
    """Turn symmetric groups (``groups`` plus the legacy table) into one-way links.

    Links that already exist are counted as skipped and left exactly as they are, so running
    it again creates nothing. Converted legacy rows are deleted in the same transaction
    (kept on a dry run).
    """
    report = RoutingGroupsUpgrade(dry_run=dry_run)
    with transaction.atomic():
        legacy, legacy_ids = _legacy_groups()
        report.legacy_rows = len(legacy_ids)
        for lane in UPGRADE_LANES:
            lane_report = LaneUpgrade(lane=lane)
            report.lanes[lane] = lane_report
            wanted = _group_links([*groups.get(lane, ()), *legacy[lane]], lane_report)
            if lane == "image":
                created = _links_create_missing(ImageLink, wanted, dry_run=dry_run)
            else:
                created = _links_create_missing(TextLink, wanted, dry_run=dry_run)
            lane_report.created = created
            lane_report.skipped = len(wanted) - lane_report.created
        if legacy_ids and not dry_run:
            LegacyRoutingGroupMember.objects.filter(id__in=legacy_ids).delete()
    return report
