"""Go-style durations (``500ms``, ``1.5s``, ``1h30m``) with exact nanosecond arithmetic.

Operators move their ``config.yaml`` over from the reference router, which is written in
Go, so the accepted grammar and the canonical printing follow Go's ``time.ParseDuration``
and ``time.Duration.String``. Canonical printing matters beyond looks: lending settings
are fingerprinted over their canonical strings, so two spellings of one value must print
identically.
"""

from __future__ import annotations

import re

__all__ = [
    "format_duration",
    "format_duration_ns",
    "parse_duration",
    "parse_duration_ns",
]

NS_PER_US = 1_000
NS_PER_MS = 1_000_000
NS_PER_SEC = 1_000_000_000
NS_PER_MIN = 60 * NS_PER_SEC
NS_PER_HOUR = 60 * NS_PER_MIN

# Go's Duration is an int64; anything larger is a typo, not a real interval.
MAX_DURATION_NS = 2**63 - 1

# Both the micro sign (U+00B5) and the Greek mu (U+03BC) are accepted, as in Go.
_UNIT_NS: dict[str, int] = {
    "ns": 1,
    "us": NS_PER_US,
    "\u00b5s": NS_PER_US,
    "\u03bcs": NS_PER_US,
    "ms": NS_PER_MS,
    "s": NS_PER_SEC,
    "m": NS_PER_MIN,
    "h": NS_PER_HOUR,
}

# A unit is whatever follows the number up to the next digit or dot (Go's rule), so an
# unknown unit such as "d" is reported as such instead of silently splitting oddly.
_COMPONENT_RE = re.compile(r"(?P<whole>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<unit>[^0-9.]*)")

_HINT = "use forms like 500ms, 1.5s, 2m, 1h30m"


def _invalid(text: str) -> ValueError:
    return ValueError(f'invalid duration "{text}": {_HINT}')


def parse_duration_ns(text: str) -> int:
    """Parse a Go duration string into whole nanoseconds.

    Fractions are truncated toward zero at nanosecond precision, computed with
    integers so that ``1.5s`` is exactly 1_500_000_000.
    """
    if not isinstance(text, str):
        raise TypeError(f"duration must be a string, not {type(text).__name__}")
    body = text[1:] if text.startswith("+") else text
    if body == "0":
        return 0
    if not body:
        raise _invalid(text)
    total_ns = 0
    pos = 0
    while pos < len(body):
        match = _COMPONENT_RE.match(body, pos)
        if match is None or match.end() == pos:
            raise _invalid(text)
        whole = match.group("whole")
        frac = match.group("frac") or ""
        unit = match.group("unit")
        # Go accepts "1." and ".5" but not a lone "." or a unit with no number.
        if not whole and not frac:
            raise _invalid(text)
        unit_ns = _UNIT_NS.get(unit)
        if unit_ns is None:
            raise _invalid(text)
        total_ns += int(whole or "0") * unit_ns
        if frac:
            total_ns += int(frac) * unit_ns // 10 ** len(frac)
        if total_ns > MAX_DURATION_NS:
            raise ValueError(f'invalid duration "{text}": out of range')
        pos = match.end()
    return total_ns


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds."""
    return parse_duration_ns(text) / NS_PER_SEC


def _fraction(value: int, digits: int) -> str:
    """Render ``value`` (< 10**digits) as ``.ddd`` with trailing zeros dropped."""
    if value == 0:
        return ""
    return "." + str(value).rjust(digits, "0").rstrip("0")


def format_duration_ns(ns: int) -> str:
    """Print nanoseconds the way Go's ``Duration.String`` does (``1h30m0s``, ``1.5ms``)."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    magnitude = abs(ns)
    if magnitude < NS_PER_SEC:
        # Below one second Go switches to the largest sub-second unit that fits.
        if magnitude < NS_PER_US:
            return f"{sign}{magnitude}ns"
        if magnitude < NS_PER_MS:
            whole, rest = divmod(magnitude, NS_PER_US)
            return f"{sign}{whole}{_fraction(rest, 3)}\u00b5s"
        whole, rest = divmod(magnitude, NS_PER_MS)
        return f"{sign}{whole}{_fraction(rest, 6)}ms"
    seconds, rest_ns = divmod(magnitude, NS_PER_SEC)
    minutes, seconds = divmod(seconds, 60)
    text = f"{seconds}{_fraction(rest_ns, 9)}s"
    if minutes:
        hours, minutes = divmod(minutes, 60)
        text = f"{minutes}m{text}"
        if hours:
            text = f"{hours}h{text}"
    return sign + text


def format_duration(seconds: float) -> str:
    """Print seconds in Go's canonical duration form, rounded to the nanosecond."""
    return format_duration_ns(round(seconds * NS_PER_SEC))
