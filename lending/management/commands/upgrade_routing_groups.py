"""Convert symmetric routing groups from an earlier release into one-way lending links.

Scope: the groups in ``--from FILE`` (JSON ``{"image": [GROUP], "text": [GROUP]}`` with
``GROUP = {"members": [{"node_id", "model_id", "restore_after_borrow"?}]}``) and every row
of the legacy routing-group table. Each pair of members on different nodes becomes two
links, one per direction, with loading allowed and ``restore_after_borrow`` taken from the
helper member. Links that already exist are skipped and never modified; converted legacy
rows are deleted. Idempotent. ``--dry-run`` reports and writes nothing. It never prompts.

A running router picks the links up when they are next loaded or republished; run this
before starting the master, as part of the upgrade.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from lending.services import GroupMember, routing_groups_parse, routing_groups_upgrade


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--from",
            dest="from_file",
            metavar="FILE",
            help="JSON export of the old routing groups (optional: legacy DB rows are "
            "always converted).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Report, write nothing.")
        parser.add_argument(
            "--no-input", action="store_true", help="Accepted for uniformity; never prompts."
        )
        parser.add_argument(
            "--config", help="The node's config file (read by manage.py, not by this command)."
        )

    def _read(self, path_text: str) -> dict[str, list[list[GroupMember]]]:
        path = Path(path_text)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            doc: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandError(
                f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from exc
        try:
            return routing_groups_parse(doc)
        except ValueError as exc:
            raise CommandError(f"{path}: {exc}") from exc

    def handle(self, *args: Any, **options: Any) -> None:
        from_file: str | None = options["from_file"]
        dry_run: bool = options["dry_run"]
        groups = self._read(from_file) if from_file else {}
        report = routing_groups_upgrade(groups=groups, dry_run=dry_run)
        verb = "would be created" if dry_run else "created"
        for lane in report.lanes.values():
            line = (
                f"{lane.lane}: {_plural(lane.created, 'link')} {verb}, "
                f"{lane.skipped} skipped (already linked)"
            )
            if lane.same_node_pairs:
                line += f", {_plural(lane.same_node_pairs, 'same-node pair')} ignored"
            self.stdout.write(line)
        removed = "would be removed" if dry_run else "converted and removed"
        self.stdout.write(f"legacy routing-group rows: {report.legacy_rows} {removed}")
        if dry_run:
            summary = (
                f"dry run: {_plural(report.created, 'link')} would be created, "
                f"{report.skipped} skipped; nothing was written"
            )
        else:
            summary = (
                f"routing groups upgraded: {_plural(report.created, 'link')} created, "
                f"{report.skipped} skipped"
            )
        self.stdout.write(self.style.SUCCESS(summary))
