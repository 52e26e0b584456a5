"""The database state's one line per change, Django's error answers, and echoed names."""

from __future__ import annotations

import logging

import orjson
import pytest
from django.db import OperationalError
from django.test import RequestFactory

from routerproject.dbhealth import DatabaseState, is_database_error
from routerproject.errors import ECHO_MAX_CHARS, echo
from routerproject.views import server_error


def test_an_outage_is_one_line_down_and_one_line_up(caplog: pytest.LogCaptureFixture) -> None:
    now = [10.0]
    state = DatabaseState(logging.getLogger("test.db"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.db"):
        state.succeeded()  # up and staying up: nothing to say
        for _ in range(30):
            state.failed("analytics flush", OperationalError("could not\n connect"))
            now[0] += 1.0
        assert state.down
        state.succeeded()
        state.succeeded()
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "database unavailable (analytics flush): OperationalError: could not connect",
        "database available again after 30.0 s (30 failed attempts)",
    ]
    assert not state.down and state.failures == 0


def test_only_database_errors_count() -> None:
    assert is_database_error(OperationalError("down"))
    assert not is_database_error(ValueError("bad"))


def _raised(exc: Exception) -> tuple[int, dict[str, object], str | None]:
    request = RequestFactory().get("/router/v1/site/analytics")
    try:
        raise exc
    except Exception:
        response = server_error(request)
    return response.status_code, orjson.loads(response.content), response.get("Retry-After")


def test_a_database_error_in_a_view_is_a_503_envelope() -> None:
    status, body, retry = _raised(OperationalError("connection refused"))
    assert status == 503 and retry == "5"
    assert body == {
        "error": {
            "message": "database unavailable",
            "type": "server_error",
            "code": "database_unavailable",
        }
    }


def test_any_other_error_in_a_view_is_a_500_envelope() -> None:
    status, body, _ = _raised(RuntimeError("boom"))
    assert status == 500
    assert body == {"error": {"message": "internal server error", "type": "server_error"}}


def test_echo_cuts_long_names_and_says_how_long_they_were() -> None:
    short = "m" * ECHO_MAX_CHARS
    assert echo(short) == short
    long = "m" * (ECHO_MAX_CHARS + 1)
    assert echo(long) == "m" * ECHO_MAX_CHARS + f"... ({ECHO_MAX_CHARS + 1} characters)"
    assert ECHO_MAX_CHARS == 200
