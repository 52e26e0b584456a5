"""This node's analytics and decision rows as pandas frames, for export and offline analysis.

Times become Unix seconds (float) in every frame, so rows from several nodes and files line
up on one axis. The decision log (`offload_decisions`, lending's table and part of the public
surface for SQL) is read by its table name: analytics sits below lending and never imports it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from analytics.models import LoadRecord, RequestRecord
from analytics.selectors import LOAD_FIELDS, REQUEST_FIELDS

TABLES = ("requests", "loads", "decisions")
DECISIONS_TABLE = "offload_decisions"
MS_PER_SEC = 1000.0


def _seconds(column: pd.Series) -> pd.Series:
    stamps = pd.to_datetime(column, utc=True)
    return (stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds()


def requests_frame(since: datetime) -> pd.DataFrame:
    rows = RequestRecord.objects.filter(finished_at__gte=since).order_by("id")
    frame = pd.DataFrame.from_records(list(rows.values(*REQUEST_FIELDS)), columns=REQUEST_FIELDS)
    for name in ("started_at", "finished_at"):
        frame[name] = _seconds(frame[name]) if len(frame) else pd.Series(dtype=float)
    return frame


def loads_frame(since: datetime) -> pd.DataFrame:
    rows = LoadRecord.objects.filter(finished_at__gte=since).order_by("id")
    frame = pd.DataFrame.from_records(list(rows.values(*LOAD_FIELDS)), columns=LOAD_FIELDS)
    frame["finished_at"] = _seconds(frame["finished_at"]) if len(frame) else pd.Series(dtype=float)
    return frame


def decisions_frame(since: datetime) -> pd.DataFrame:
    """Decision rows with `recorded_at` in Unix seconds (the table keeps milliseconds)."""
    from django.db import connection

    since_ms = int(since.timestamp() * MS_PER_SEC)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT * FROM {DECISIONS_TABLE} WHERE recorded_at >= %s ORDER BY id",
            [since_ms],
        )
        columns = [col[0] for col in cursor.description]
        frame = pd.DataFrame.from_records(cursor.fetchall(), columns=columns)
    frame["recorded_at"] = frame["recorded_at"].astype(float) / MS_PER_SEC
    return frame


def frames(since: datetime, tables: Iterable[str] = TABLES) -> dict[str, pd.DataFrame]:
    builders = {"requests": requests_frame, "loads": loads_frame, "decisions": decisions_frame}
    return {table: builders[table](since) for table in tables}


def read_jsonl(paths: Iterable[Path]) -> dict[str, pd.DataFrame]:
    """Frames from `analytics_export --format jsonl` files, by the `table` of each row."""
    # Read as plain JSON so times stay Unix seconds (pandas' reader would take `*_at` columns
    # for dates).
    records: list[dict[str, object]] = []
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from exc
    if not records:
        return {}
    rows = pd.DataFrame.from_records(records)
    if "table" not in rows.columns:
        raise ValueError("rows carry no `table` field: not an analytics_export jsonl file")
    return {
        str(table): group.drop(columns=["table"]).dropna(axis=1, how="all").reset_index(drop=True)
        for table, group in rows.groupby("table")
    }


def since_datetime(seconds: float, now: float | None = None) -> datetime:
    base = datetime.now(tz=UTC).timestamp() if now is None else now
    return datetime.fromtimestamp(base - seconds, tz=UTC)
