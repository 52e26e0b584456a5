"""django-q2 entry points for analytics (thin wrappers over services)."""

from __future__ import annotations

import logging

from django.conf import settings

from analytics.services import analytics_prune

logger = logging.getLogger(__name__)


def prune_analytics() -> int:
    deleted = analytics_prune(retention_secs=settings.ROUTER.analytics.retention)
    logger.info("analytics prune: %d rows deleted", deleted)
    return deleted
