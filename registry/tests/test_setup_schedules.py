"""`manage.py setup_schedules`: the node's django-q2 Schedule rows match the declared jobs."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django_q.models import Schedule

from registry.schedules import declared_jobs

pytestmark = pytest.mark.django_db

PREFIX = "router:"


def run(*args: str) -> str:
    out = StringIO()
    call_command("setup_schedules", *args, stdout=out)
    return out.getvalue()


def rows() -> list[dict[str, Any]]:
    return list(
        Schedule.objects.order_by("name").values(
            "name", "func", "schedule_type", "minutes", "repeats"
        )
    )


def expected_rows() -> list[dict[str, Any]]:
    return sorted(
        (
            {
                "name": PREFIX + job.name,
                "func": job.func,
                "schedule_type": Schedule.MINUTES,
                "minutes": job.minutes,
                "repeats": -1,
            }
            for job in declared_jobs()
        ),
        key=lambda row: row["name"],
    )


def test_it_creates_one_router_schedule_per_declared_job() -> None:
    assert declared_jobs(), "nothing is declared, so this test would prove nothing"
    run()
    assert rows() == expected_rows()
    assert all(row["name"].startswith(PREFIX) for row in rows())


def test_running_it_twice_leaves_the_same_rows() -> None:
    run()
    first = list(Schedule.objects.order_by("name").values("id", "name", "func", "minutes"))
    output = run()
    second = list(Schedule.objects.order_by("name").values("id", "name", "func", "minutes"))
    assert second == first
    assert Schedule.objects.count() == len(declared_jobs())
    assert f"0 created, {len(declared_jobs())} kept" in output


def test_it_restores_a_declared_schedule_that_was_edited_by_hand() -> None:
    run()
    job = declared_jobs()[0]
    Schedule.objects.filter(name=PREFIX + job.name).update(
        func="somewhere.else", minutes=job.minutes + 7, repeats=0
    )
    run()
    assert rows() == expected_rows()


def test_a_dry_run_writes_nothing() -> None:
    Schedule.objects.create(
        name=PREFIX + "retired-job", func="math.floor", schedule_type=Schedule.MINUTES, minutes=5
    )
    output = run("--dry-run")
    assert [row["name"] for row in rows()] == [PREFIX + "retired-job"]
    assert f"{len(declared_jobs())} schedules declared, 1 stale" in output
    for job in declared_jobs():
        assert f"would ensure {PREFIX}{job.name} every {job.minutes} min" in output


def test_stale_router_schedules_are_deleted_and_other_schedules_kept() -> None:
    Schedule.objects.create(
        name=PREFIX + "retired-job", func="math.floor", schedule_type=Schedule.MINUTES, minutes=5
    )
    Schedule.objects.create(
        name="operator-backup", func="math.ceil", schedule_type=Schedule.MINUTES, minutes=60
    )
    Schedule.objects.create(
        name="notrouter:job", func="math.ceil", schedule_type=Schedule.MINUTES, minutes=60
    )
    run()
    names = [row["name"] for row in rows()]
    assert PREFIX + "retired-job" not in names
    assert "operator-backup" in names and "notrouter:job" in names
    router_rows = [row for row in rows() if row["name"].startswith(PREFIX)]
    assert router_rows == expected_rows()
