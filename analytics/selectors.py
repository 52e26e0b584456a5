"""Read-side queries over analytics rows."""

from __future__ import annotations

from typing import Any

from analytics.models import LoadRecord, RequestRecord

REQUEST_FIELDS = (
    "id",
    "node_id",
    "model_id",
    "config_filename",
    "lane",
    "path",
    "status",
    "success",
    "borrowed",
    "stream",
    "prompt_bytes",
    "prompt_tokens",
    "output_tokens",
    "image_width",
    "image_height",
    "image_steps",
    "image_count",
    "duration_ms",
    "started_at",
    "finished_at",
)
LOAD_FIELDS = (
    "id",
    "node_id",
    "model_id",
    "config_filename",
    "lane",
    "reason",
    "success",
    "error",
    "duration_ms",
    "finished_at",
)


def analytics_recent(*, kind: str, limit: int) -> list[dict[str, Any]]:
    if kind == "loads":
        return list(LoadRecord.objects.order_by("-id").values(*LOAD_FIELDS)[:limit])
    return list(RequestRecord.objects.order_by("-id").values(*REQUEST_FIELDS)[:limit])
