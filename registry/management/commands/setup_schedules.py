"""Create or update every django-q2 schedule this node runs (idempotent).

Scope: the Schedule rows named in registry/schedules.py; other rows named `router:*` that are no
longer declared are deleted. Supports --dry-run.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django_q.models import Schedule

from registry.schedules import declared_jobs

PREFIX = "router:"


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Show what would change.")
        parser.add_argument("--no-input", action="store_true", help="Accepted for uniformity.")

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = declared_jobs()
        names = {PREFIX + job.name for job in jobs}
        stale = Schedule.objects.filter(name__startswith=PREFIX).exclude(name__in=names)
        self.stdout.write(f"{len(jobs)} schedules declared, {stale.count()} stale")
        if options["dry_run"]:
            for job in jobs:
                self.stdout.write(f"would ensure {PREFIX}{job.name} every {job.minutes} min")
            return
        created = 0
        with transaction.atomic():
            for job in jobs:
                _, was_created = Schedule.objects.update_or_create(
                    name=PREFIX + job.name,
                    defaults={
                        "func": job.func,
                        "schedule_type": Schedule.MINUTES,
                        "minutes": job.minutes,
                        "repeats": -1,
                    },
                )
                created += int(was_created)
            stale.delete()
        self.stdout.write(
            self.style.SUCCESS(f"schedules ready: {created} created, {len(jobs) - created} kept")
        )
