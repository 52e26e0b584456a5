"""django-q2 entry points for lending (thin wrappers over services)."""

from __future__ import annotations

import logging
import time

from django.conf import settings

from lending.selectors import settings_effective_load
from lending.services import decisions_prune

logger = logging.getLogger(__name__)

MS_PER_SEC = 1000


def prune_decisions() -> int:
    if settings.ROUTER.cluster.role == "slave":
        # A slave runs its master's retention, which only its router process knows: the
        # lending ticker prunes there (lending/ticker.py).
        return 0
    retention_secs = settings_effective_load().decisions_retention_secs
    deleted = decisions_prune(
        now_ms=int(time.time() * MS_PER_SEC), retention_ms=int(retention_secs * MS_PER_SEC)
    )
    logger.info("decision log prune: %d rows deleted", deleted)
    return deleted
