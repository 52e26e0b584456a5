"""Every periodic job of the node, declared in one place.

`setup_schedules` (run by `runrouter` at every start) makes the django-q2 Schedule rows match
this list exactly: `update_or_create` by name, and jobs no longer listed are removed, so running
it twice, or on every start, changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    name: str
    func: str
    minutes: int


def declared_jobs() -> list[Job]:
    return [
        Job("analytics-prune", "analytics.tasks.prune_analytics", minutes=60),
        Job("offload-decisions-prune", "lending.tasks.prune_decisions", minutes=60),
    ]
