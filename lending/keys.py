"""The table of lending settings: names, kinds, defaults, ranges and canonical values.

Pure data plus validation, shared by the config loader (``cluster.<key>`` in YAML) and
the settings store (database overrides and the settings API). Every value is kept as a
canonical string so that equal settings compare and fingerprint equal across nodes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from routerproject.durations import format_duration_ns, parse_duration_ns

__all__ = [
    "KEYS_BY_NAME",
    "LENDING_KEYS",
    "LendingKey",
    "LendingKind",
    "LendingSettingError",
    "canonical_value",
    "default_values",
    "fingerprint",
]

LendingKind = Literal["duration", "integer", "boolean"]

FINGERPRINT_HEX_CHARS = 12

_SLOTS_MIN = 1
_SLOTS_MAX = 64

# Go's strconv.ParseBool set, which the reference accepts; anything else is rejected.
_TRUE_WORDS = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE_WORDS = frozenset({"0", "f", "F", "FALSE", "false", "False"})

# ASCII digits only: Python's int() would also take "1_000" and non-ASCII digits.
_WHOLE_NUMBER_RE = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class LendingKey:
    name: str
    kind: LendingKind
    default: str
    minimum: int | None
    maximum: int | None
    description: str


class LendingSettingError(ValueError):
    """A lending setting name or value was refused; ``key`` names the setting."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


# Declared order matters: the fingerprint hashes the keys in exactly this order.
LENDING_KEYS: tuple[LendingKey, ...] = (
    LendingKey(
        name="scheduling_refresh_interval",
        kind="duration",
        default="1m0s",
        minimum=None,
        maximum=None,
        description=(
            "How often every node refits its own cost model and the master replans all "
            "leases even when nothing else triggered a plan."
        ),
    ),
    LendingKey(
        name="scheduling_sample_window",
        kind="duration",
        default="24h0m0s",
        minimum=None,
        maximum=None,
        description=("How far back finished requests and model loads are used when fitting costs."),
    ),
    LendingKey(
        name="scheduling_min_samples",
        kind="integer",
        default="20",
        minimum=2,
        maximum=100000,
        description=(
            "How many measured requests a model needs on a node before it gets a price; "
            "until then it only receives probes."
        ),
    ),
    LendingKey(
        name="scheduling_backend_depth",
        kind="integer",
        default="2",
        minimum=1,
        maximum=64,
        description=(
            "How many requests per lane are passed to the backend at once; the rest wait "
            "in the router, where they can be lent."
        ),
    ),
    LendingKey(
        name="scheduling_grant_ttl",
        kind="duration",
        default="30s",
        minimum=None,
        maximum=None,
        description="How long a lease lasts unless a later plan renews it.",
    ),
    LendingKey(
        name="scheduling_context_reserve",
        kind="integer",
        default="256",
        minimum=0,
        maximum=1048576,
        description=(
            "The least number of tokens kept free for the answer when estimating whether "
            "a text request fits a helper's context window."
        ),
    ),
    LendingKey(
        name="offload_restore_delay",
        kind="duration",
        default="1.5s",
        minimum=None,
        maximum=None,
        description=(
            "How long a helper stays quiet before reloading the model that borrowed work "
            "displaced, and how often it retries while busy."
        ),
    ),
    LendingKey(
        name="offload_probe_idle",
        kind="duration",
        default="5s",
        minimum=None,
        maximum=None,
        description=(
            "How long a loaded helper must be idle with its own work before it may get a "
            "single probe request (twelve times longer if it would have to switch models)."
        ),
    ),
    LendingKey(
        name="offload_faster_helper_slots",
        kind="integer",
        default="2",
        minimum=_SLOTS_MIN,
        maximum=_SLOTS_MAX,
        description=(
            "How many requests a lease may carry at once when the helper finishes a job "
            "no slower than the owner."
        ),
    ),
    LendingKey(
        name="offload_slower_helper_slots",
        kind="integer",
        default="1",
        minimum=_SLOTS_MIN,
        maximum=_SLOTS_MAX,
        description=(
            "How many requests a lease may carry at once when the helper is slower per "
            "job but still shortens the owner's backlog."
        ),
    ),
    LendingKey(
        name="offload_probe_helper_slots",
        kind="integer",
        default="1",
        minimum=_SLOTS_MIN,
        maximum=_SLOTS_MAX,
        description="How many requests a probe lease may carry at once.",
    ),
    LendingKey(
        name="offload_hold_for_faster_helper",
        kind="boolean",
        default="true",
        minimum=None,
        maximum=None,
        description=(
            "Whether an owner may keep its next waiting request back for a faster helper "
            "that is busy right now instead of starting it locally."
        ),
    ),
    LendingKey(
        name="offload_decisions_retention",
        kind="duration",
        default="720h0m0s",
        minimum=None,
        maximum=None,
        description="How old a row in the lending decision log gets before it is deleted.",
    ),
    LendingKey(
        name="offload_lent_stall_timeout",
        kind="duration",
        default="3m0s",
        minimum=None,
        maximum=None,
        description=(
            "How long a helper's set of lent requests may stay unchanged before the master "
            "asks the helper whether it is still running that borrowed work."
        ),
    ),
)

KEYS_BY_NAME: dict[str, LendingKey] = {key.name: key for key in LENDING_KEYS}


def _canonical_duration(key: LendingKey, text: str) -> str:
    try:
        ns = parse_duration_ns(text)
    except ValueError as exc:
        raise LendingSettingError(key.name, str(exc)) from None
    if ns <= 0:
        raise LendingSettingError(key.name, f'must be a duration greater than 0 (got "{text}")')
    return format_duration_ns(ns)


def _canonical_integer(key: LendingKey, text: str) -> str:
    if not _WHOLE_NUMBER_RE.fullmatch(text):
        raise LendingSettingError(key.name, f'must be a whole number (got "{text}")')
    number = int(text)
    low = key.minimum
    high = key.maximum
    if (low is not None and number < low) or (high is not None and number > high):
        raise LendingSettingError(key.name, f"must be between {low} and {high} (got {number})")
    return str(number)


def _canonical_boolean(key: LendingKey, text: str) -> str:
    if text in _TRUE_WORDS:
        return "true"
    if text in _FALSE_WORDS:
        return "false"
    raise LendingSettingError(key.name, f'must be true or false (got "{text}")')


def canonical_value(key: str, raw: str) -> str:
    """Validate ``raw`` for the lending setting ``key`` and return its canonical string.

    Raises ``LendingSettingError`` (a ``ValueError``) naming the key when the key is
    unknown or the value is not acceptable.
    """
    spec = KEYS_BY_NAME.get(key)
    if spec is None:
        raise LendingSettingError(key, "unknown lending setting")
    if not isinstance(raw, str):
        raise LendingSettingError(key, f"value must be a string (got {type(raw).__name__})")
    # Surrounding whitespace is never meaningful and easily pasted into a form field.
    text = raw.strip()
    if spec.kind == "duration":
        return _canonical_duration(spec, text)
    if spec.kind == "integer":
        return _canonical_integer(spec, text)
    return _canonical_boolean(spec, text)


def default_values() -> dict[str, str]:
    """Every lending setting at its built-in default, in declared order."""
    return {key.name: key.default for key in LENDING_KEYS}


def fingerprint(effective: Mapping[str, str]) -> str:
    """Short hash that is equal exactly when two nodes run the same lending settings.

    Hashes ``key=value\\n`` for every key of ``LENDING_KEYS`` in declared order. A key
    missing from ``effective`` counts as its default (that is what a node would run);
    keys not in the table are ignored. Values are hashed as given, so pass canonical
    strings.
    """
    digest = hashlib.sha256()
    for key in LENDING_KEYS:
        value = effective.get(key.name, key.default)
        digest.update(f"{key.name}={value}\n".encode())
    return digest.hexdigest()[:FINGERPRINT_HEX_CHARS]
