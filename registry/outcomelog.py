"""One log line when a repeating call's outcome changes, not one per attempt.

A sync loop or a push to a dead slave fails on every tick; the operator needs to hear when it
starts failing (and why) and when it works again, not the same warning every second.
"""

from __future__ import annotations

import logging


class OutcomeLog:
    """The last outcome of one repeating call (`""` = it worked), logged when it changes."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self.last_error = ""

    def note(self, error: str) -> None:
        if error == self.last_error:
            return
        if error:
            self.logger.warning("%s failed: %s", self.what, error)
        else:
            self.logger.info("%s works again", self.what)
        self.last_error = error
