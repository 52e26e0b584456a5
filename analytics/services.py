"""Analytics housekeeping."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from analytics.models import LoadRecord, RequestRecord


def analytics_prune(*, retention_secs: float, now: datetime | None = None) -> int:
    """Delete rows older than the retention; safe to run twice or concurrently."""
    cutoff = (now or timezone.now()) - timedelta(seconds=retention_secs)
    deleted, _ = RequestRecord.objects.filter(finished_at__lt=cutoff).delete()
    loads, _ = LoadRecord.objects.filter(finished_at__lt=cutoff).delete()
    return deleted + loads
