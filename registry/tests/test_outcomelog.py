"""A repeating call's outcome is logged when it changes, not on every attempt."""

from __future__ import annotations

import logging

import pytest

from registry.outcomelog import OutcomeLog


def test_a_failure_is_logged_once_until_it_changes_and_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = OutcomeLog(logging.getLogger("registry.tests.outcome"), "key table sync")
    with caplog.at_level(logging.INFO, logger="registry.tests.outcome"):
        for error in ("", "timeout", "timeout", "HTTP 500", "", ""):
            log.note(error)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "key table sync failed: timeout"),
        ("WARNING", "key table sync failed: HTTP 500"),
        ("INFO", "key table sync works again"),
    ]
    assert log.last_error == ""
