"""The database as the router sees it: up or down, said once per change.

While the database is down, every periodic writer (the analytics flush, the lending tick) and
every management request that reads it fails; logging each failure with its traceback buried
the one fact an operator needs under a traceback a second. `DATABASE` keeps one state per
process: the first failure logs one line naming what failed and why, the first success after
it logs one line saying how long it lasted. A management request that meets the outage answers
503 "database unavailable" in the router's envelope instead of Django's HTML error page.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError
from django.http import HttpResponse, JsonResponse

from routerproject.errors import error_envelope

logger = logging.getLogger("router.database")

UNAVAILABLE_MESSAGE = "database unavailable"
RETRY_AFTER_SECS = 5
# A driver's message can be long (a whole connection string's worth of hints); one line suffices.
REASON_MAX_CHARS = 200


def database_name() -> str:
    """The database this process uses, as an operator would name it (no password)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    engine = str(db["ENGINE"]).rsplit(".", 1)[-1]
    if engine == "sqlite3":
        return f"database sqlite {db['NAME']}"
    host = db.get("HOST") or "localhost"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"database {engine} {host}{port}/{db['NAME']}"


def one_line(exc: BaseException) -> str:
    """An error as one short line: its type and its message, whitespace collapsed."""
    reason = " ".join(str(exc).split())[:REASON_MAX_CHARS]
    return f"{type(exc).__name__}: {reason or '-'}"


def is_database_error(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseError | InterfaceError)


class DatabaseState:
    """Up or down, with one log line per change."""

    def __init__(
        self, log: logging.Logger = logger, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = log
        self.clock = clock
        self.down_since: float | None = None
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, where: str, exc: BaseException) -> None:
        self.failures += 1
        if self.down_since is not None:
            return
        self.down_since = self.clock()
        reason = " ".join(str(exc).split())[:REASON_MAX_CHARS]
        self.log.error(
            "%s (%s): %s: %s", UNAVAILABLE_MESSAGE, where, type(exc).__name__, reason or "-"
        )

    def succeeded(self) -> None:
        if self.down_since is None:
            return
        lasted = self.clock() - self.down_since
        self.log.warning(
            "database available again after %.1f s (%d failed attempts)", lasted, self.failures
        )
        self.down_since = None
        self.failures = 0


DATABASE = DatabaseState()


def unavailable_response() -> HttpResponse:
    response = JsonResponse(
        error_envelope(UNAVAILABLE_MESSAGE, type="server_error", code="database_unavailable"),
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_SECS)},
    )
    # The outage is logged once by DATABASE; Django would log every such answer again.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
