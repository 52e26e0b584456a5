"""`manage.py lending_replay --since 1h [--set key=value …] [--input FILE …] [--plot FILE.png]`.

Replays the recorded bursts of one owner/helper pair through the lending planner on a
simulated clock (lending/replay.py), once with the settings this node runs and once with
those settings changed by `--set`, and prints per burst the predicted makespan, lent count and
the helper's own delay beside the measured ones. Rows come from this node's database plus any
`--input` files written by `analytics_export --format jsonl` on the other nodes (the owner's
and helper's rows live on their own nodes). Prints a table, then one JSON line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from django.core.management.base import BaseCommand, CommandError, CommandParser

from analytics.frames import TABLES, frames, read_jsonl, since_datetime
from lending.keys import LendingSettingError, canonical_value
from lending.replay import BurstResult, replay
from lending.selectors import settings_effective_load
from lending.settings_store import EffectiveSettings
from lending.whatif import Burst, Selection, bursts, pick_pair, replay_settings
from routerproject.durations import parse_duration

MS = 1000.0


def parse_sets(items: list[str], base: EffectiveSettings) -> EffectiveSettings:
    values = dict(base.values)
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise CommandError(f"--set {item!r}: expected key=value")
        try:
            values[key.strip()] = canonical_value(key.strip(), raw)
        except LendingSettingError as exc:
            raise CommandError(f"--set {key.strip()}: {exc}") from exc
    return EffectiveSettings.from_values(values)


def _merge(local: dict[str, pd.DataFrame], extra: dict[str, pd.DataFrame]) -> dict[str, Any]:
    out: dict[str, pd.DataFrame] = {}
    for table in TABLES:
        parts = [f for f in (local.get(table), extra.get(table)) if f is not None and len(f)]
        if not parts:
            out[table] = local.get(table, pd.DataFrame())
            continue
        merged = pd.concat(parts, ignore_index=True)
        key = [c for c in ("node_id", "id") if c in merged.columns]
        out[table] = merged.drop_duplicates(subset=key or None).reset_index(drop=True)
    return out


def _fmt(value: float) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.0f}"
    )


class Command(BaseCommand):
    help = "Replay recorded lending bursts through the planner with other settings."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", default="1h", help="how far back (a duration)")
        parser.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a lending setting to change for the proposed run (repeatable)",
        )
        parser.add_argument(
            "--input", action="append", default=[], help="analytics_export jsonl of another node"
        )
        parser.add_argument(
            "--owner", help="NODE/MODEL of the owner (default: the pair that lent most)"
        )
        parser.add_argument("--helper", help="NODE/MODEL of the helper")
        parser.add_argument("--lane", choices=("text", "image"), default="text")
        parser.add_argument("--gap", default="2s", help="a quiet gap this long ends a burst")
        parser.add_argument(
            "--min-burst",
            type=int,
            default=2,
            help="replay only bursts of at least this many requests (a lone request never queues)",
        )
        parser.add_argument("--plot", help="write a PNG of held depth and lending over time")
        parser.add_argument("--config", help="config file (read by manage.py)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            since = since_datetime(parse_duration(options["since"]))
            gap = parse_duration(options["gap"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        recorded = settings_effective_load()
        proposed = parse_sets(options["set"], recorded)
        paths = [Path(p) for p in options["input"]]
        for path in paths:
            if not path.is_file():
                raise CommandError(f"--input {path}: no such file")
        try:
            extra = read_jsonl(paths)
        except ValueError as exc:
            raise CommandError(f"--input: {exc}") from exc
        data = _merge(frames(since), extra)
        requests, decisions, loads = data["requests"], data["decisions"], data["loads"]
        if len(requests):
            requests = requests[requests["finished_at"] >= since.timestamp()]
        pick = self._pick(options, decisions)
        if requests.empty or pick is None:
            raise CommandError("no lending recorded in this window: nothing to replay")
        try:
            found = bursts(requests, decisions, loads, pick, recorded, gap)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        found = [b for b in found if len(b.requests) >= max(1, options["min_burst"])]
        if not found:
            raise CommandError(f"no burst of {pick.owner_node}/{pick.owner_model} to replay")
        rows = self._replay(found, recorded, proposed)
        self._print(pick, rows, options["set"])
        if options["plot"]:
            self._plot(Path(options["plot"]), rows)

    @staticmethod
    def _pick(options: dict[str, Any], decisions: pd.DataFrame) -> Selection | None:
        if options["owner"] or options["helper"]:
            if not (options["owner"] and options["helper"]):
                raise CommandError("--owner and --helper go together")
            try:
                owner_node, owner_model = options["owner"].split("/", 1)
                helper_node, helper_model = options["helper"].split("/", 1)
            except ValueError as exc:
                raise CommandError("--owner and --helper take NODE/MODEL") from exc
            return Selection(options["lane"], owner_node, owner_model, helper_node, helper_model)
        return pick_pair(decisions)

    @staticmethod
    def _replay(
        found: list[Burst], recorded: EffectiveSettings, proposed: EffectiveSettings
    ) -> list[tuple[Burst, BurstResult, BurstResult]]:
        out = []
        for burst in found:
            results = [
                replay(burst.pair, replay_settings(s), burst.requests, burst.helper_own)[0]
                for s in (recorded, proposed)
            ]
            out.append((burst, results[0], results[1]))
        return out

    def _print(
        self, pick: Selection, rows: list[tuple[Burst, BurstResult, BurstResult]], sets: list[str]
    ) -> None:
        w = self.stdout.write
        w(
            f"lending replay: {pick.owner_node}/{pick.owner_model} -> "
            f"{pick.helper_node}/{pick.helper_model} ({pick.lane}); proposed: "
            f"{', '.join(sets) or 'the recorded settings'}"
        )
        header = (
            f"{'burst':>5} {'reqs':>5} | {'makespan ms: actual':>20} {'recorded':>9} "
            f"{'proposed':>9} | {'lent: actual':>12} {'rec':>4} {'prop':>4} | "
            f"{'helper delay ms: actual':>23} {'rec':>6} {'prop':>6}"
        )
        w(header)
        w("-" * len(header))
        doc: list[dict[str, Any]] = []
        for burst, rec, prop in rows:
            w(
                f"{burst.index:>5} {len(burst.requests):>5} | "
                f"{_fmt(burst.actual_makespan_ms):>20} {_fmt(rec.makespan_ms):>9} "
                f"{_fmt(prop.makespan_ms):>9} | {burst.actual_lent:>12} {rec.lent:>4} "
                f"{prop.lent:>4} | {_fmt(burst.actual_helper_delay_ms):>23} "
                f"{_fmt(rec.helper_own_delay_ms):>6} {_fmt(prop.helper_own_delay_ms):>6}"
            )

            def num(value: float) -> float | None:
                return None if math.isnan(value) else round(value, 1)

            doc.append(
                {
                    "burst": burst.index,
                    "requests": len(burst.requests),
                    "actual": {
                        "makespan_ms": num(burst.actual_makespan_ms),
                        "lent": burst.actual_lent,
                        "helper_own_delay_ms": num(burst.actual_helper_delay_ms),
                    },
                    "recorded": {
                        "makespan_ms": round(rec.makespan_ms, 1),
                        "lent": rec.lent,
                        "helper_own_delay_ms": round(rec.helper_own_delay_ms, 1),
                    },
                    "proposed": {
                        "makespan_ms": round(prop.makespan_ms, 1),
                        "lent": prop.lent,
                        "helper_own_delay_ms": round(prop.helper_own_delay_ms, 1),
                    },
                }
            )
        w(json.dumps({"replay": "lending", "set": sets, "bursts": doc}))

    @staticmethod
    def _plot(path: Path, rows: list[tuple[Burst, BurstResult, BurstResult]]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        offset = 0.0
        for _, rec, prop in rows:
            for ax, result, label in ((axes[0], rec, "recorded"), (axes[1], prop, "proposed")):
                if not result.timeline:
                    continue
                times = [(t - result.first_arrival_ms + offset) / MS for t, _, _ in result.timeline]
                ax.step(times, [h for _, h, _ in result.timeline], where="post", color="tab:blue")
                ax.step(times, [o for _, _, o in result.timeline], where="post", color="tab:orange")
                ax.set_title(f"{label} settings")
            offset += max(rec.makespan_ms, prop.makespan_ms) + 500.0
        for ax in axes:
            ax.set_ylabel("requests")
            ax.legend(["held", "lent out"], loc="upper right")
        axes[1].set_xlabel("seconds (bursts laid end to end)")
        fig.tight_layout()
        fig.savefig(path, format="png")
        plt.close(fig)
        Command.stderr_note(path)

    @staticmethod
    def stderr_note(path: Path) -> None:
        import sys

        print(f"wrote {path}", file=sys.stderr)
