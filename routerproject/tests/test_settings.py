"""Settings that tune the processes beside the router."""

from __future__ import annotations

from django.conf import settings


def test_the_workers_wake_rarely_since_nothing_is_enqueued() -> None:
    # Only schedules run there, and the scheduler looks every 30 s: a poll or guard cycle of a
    # fraction of a second would only wake a process on the router's cores.
    assert settings.Q_CLUSTER["poll"] == 5.0
    assert settings.Q_CLUSTER["guard_cycle"] == 2.0
    assert settings.Q_CLUSTER["poll"] < 30 and settings.Q_CLUSTER["guard_cycle"] < 30
