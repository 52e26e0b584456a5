"""Read-side queries over analytics rows."""

from __future__ import annotations

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
