"""Read-side queries over analytics rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from analytics.models import LoadRecord, RequestRecord
from analytics.recorder import LOAD_COLUMNS, REQUEST_COLUMNS

# The columns the recorder writes, plus the id: one list, so the two never drift apart.
REQUEST_FIELDS = ("id", *REQUEST_COLUMNS)
LOAD_FIELDS = ("id", *LOAD_COLUMNS)


def analytics_recent(*, kind: str, limit: int) -> list[dict[str, Any]]:
    if kind == "loads":
        return list(LoadRecord.objects.order_by("-id").values(*LOAD_FIELDS)[:limit])
    return list(RequestRecord.objects.order_by("-id").values(*REQUEST_FIELDS)[:limit])


def benchmark_rows(*, request_ids: list[str]) -> list[dict[str, Any]]:
    """The rows a calibration's requests left (manage.py benchmark_models), by request ID."""
    rows = RequestRecord.objects.filter(request_id__in=request_ids).values(
        "request_id",
        "model_id",
        "status",
        "success",
        "prompt_bytes",
        "prompt_tokens",
        "output_tokens",
        "image_width",
        "image_height",
        "image_steps",
        "duration_ms",
    )
    return [dict(row) for row in rows]


def loads_since(*, config_filename: str, since_ms: float) -> list[dict[str, Any]]:
    """Loads of one config that finished at or after `since_ms` (Unix milliseconds)."""
    since = datetime.fromtimestamp(since_ms / 1000.0, UTC)
    rows = (
        LoadRecord.objects.filter(config_filename=config_filename, finished_at__gte=since)
        .order_by("finished_at")
        .values("model_id", "lane", "success", "duration_ms", "error")
    )
    return [dict(row) for row in rows]
