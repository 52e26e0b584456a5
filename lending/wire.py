"""Reading fields of a JSON document another node sent: a wrong type reads as absent.

Pure: no Django, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["wire_bool", "wire_int", "wire_ms", "wire_str"]


def wire_str(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    return value if isinstance(value, str) else ""


def wire_bool(doc: Mapping[str, Any], key: str) -> bool:
    value = doc.get(key)
    return value if isinstance(value, bool) else False


def wire_int(doc: Mapping[str, Any], key: str, default: int) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    if not math.isfinite(value):
        return default
    return int(value)


def wire_ms(doc: Mapping[str, Any], key: str) -> float | None:
    value = doc.get(key)
    # bool is an int subclass, but true/false is never a measurement.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    result = float(value)
    return result if math.isfinite(result) and result >= 0 else None
