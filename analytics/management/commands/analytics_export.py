"""`manage.py analytics_export --since 1h --format csv|jsonl [--table …] [--output FILE]`.

Writes this node's rows for analysis elsewhere: jsonl writes every table asked (default: all
three, each row carrying its `table`), csv one table (default `requests`). Times are Unix
seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser

from analytics.frames import TABLES, frames, since_datetime
from routerproject.durations import parse_duration


class Command(BaseCommand):
    help = "Export this node's request, load and decision rows as CSV or JSON lines."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", default="1h", help="how far back (a duration: 1h, 30m)")
        parser.add_argument("--format", choices=("csv", "jsonl"), default="jsonl")
        parser.add_argument(
            "--table",
            action="append",
            choices=TABLES,
            help="table to export (repeatable; csv takes one; default: requests for csv, all "
            "for jsonl)",
        )
        parser.add_argument("--output", help="file to write (default: standard output)")
        parser.add_argument("--config", help="config file (read by manage.py)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            since = since_datetime(parse_duration(options["since"]))
        except ValueError as exc:
            raise CommandError(f"--since: {exc}") from exc
        fmt = options["format"]
        tables = options["table"] or (["requests"] if fmt == "csv" else list(TABLES))
        if fmt == "csv" and len(tables) != 1:
            raise CommandError("--format csv writes one table: give one --table")
        data = frames(since, tables)
        out_path = options["output"]
        stream: TextIO = open(out_path, "w", encoding="utf-8") if out_path else sys.stdout  # noqa: SIM115
        try:
            if fmt == "csv":
                data[tables[0]].to_csv(stream, index=False)
            else:
                for table in tables:
                    frame = data[table]
                    if len(frame):
                        text = frame.assign(table=table).to_json(orient="records", lines=True)
                        stream.write(text if text.endswith("\n") else text + "\n")
        finally:
            if out_path:
                stream.close()
        if out_path:
            counts = ", ".join(f"{t}={len(data[t])}" for t in tables)
            self.stderr.write(f"wrote {Path(out_path)} ({counts})")
