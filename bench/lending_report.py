"""Rows of the lending benchmark's table: one per measured quantity, PASS/FAIL per target."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One table row; ``passed`` is None for a row that is reported without a target."""

    label: str
    with_link: str = "-"
    alone: str = "-"
    optimum: str = "-"
    ratio: str = "-"
    helper_own: str = "-"
    lent: str = "-"
    overhead: str = "-"
    """The router's own overhead per lent job (bench/lending_overhead.py)."""
    target: str = "report only"
    passed: bool | None = None
    decisions: str = ""


@dataclass
class Result:
    """What one scenario measured: its table rows and the details for the JSON line."""

    rows: list[Row]
    detail: dict[str, Any] = field(default_factory=dict)


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def ratio_row(
    label: str,
    *,
    with_ms: float,
    spread: tuple[float, float] | None = None,
    alone_ms: float | None,
    optimum_ms: float | None,
    basis: str,
    limit: float | None,
    lent: int | None,
    decisions: str,
    helper_own: str = "-",
    also: str = "",
    overhead: str = "-",
) -> Row:
    """A makespan row: the ratio to working alone (``basis`` "alone") or else to the given
    optimum (``basis`` names which), checked against ``limit`` when there is one. ``spread``
    is the range over repeated runs, ``with_ms`` the one reported; ``also`` adds a second
    condition to the target's text."""
    denominator = alone_ms if basis == "alone" else optimum_ms
    ratio = with_ms / denominator if denominator else None
    passed = None if limit is None or ratio is None else ratio <= limit
    target = "report only" if limit is None else f"<= {limit:.2f}x {basis}"
    shown = "-" if ratio is None else f"{ratio:.2f}x {basis}"
    if basis == "alone" and ratio is not None and optimum_ms:
        # Judged against working alone, but the distance to the optimum is always shown.
        shown += f" ({with_ms / optimum_ms:.2f}x opt)"
    with_link = fmt_ms(with_ms)
    if spread is not None:
        with_link += f" [{spread[0]:.0f}-{spread[1]:.0f}]"
    return Row(
        label=label,
        with_link=with_link,
        alone=fmt_ms(alone_ms),
        optimum=fmt_ms(optimum_ms),
        ratio=shown,
        helper_own=helper_own,
        lent="-" if lent is None else str(lent),
        overhead=overhead,
        target=target + (f", {also}" if also else ""),
        passed=passed,
        decisions=decisions,
    )


def verdict(passed: bool | None) -> str:
    return "-" if passed is None else "PASS" if passed else "FAIL"


HEADER = (
    "scenario",
    "with link",
    "alone",
    "optimum",
    "ratio",
    "helper own",
    "lent",
    "per lent job: idle (to / back; job)",
    "target",
    "pass",
    "decisions",
)


def print_table(rows: Sequence[Row]) -> None:
    cells = [HEADER] + [
        (
            r.label,
            r.with_link,
            r.alone,
            r.optimum,
            r.ratio,
            r.helper_own,
            r.lent,
            r.overhead,
            r.target,
            verdict(r.passed),
            r.decisions,
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER))]
    for row in cells:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(line.rstrip(), flush=True)
