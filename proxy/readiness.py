"""Readiness rules per lane (pure): is a backend that answered this probe ready to serve?

The rules follow reference-cluster §3.2 so a real llama-server, sd-server, whisper-server,
KoboldCpp or vLLM is judged the same way the simulated backend is.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

Probe = Literal["models", "sd_models", "health", "kobold_flag"]

INACTIVE = "inactive"


def probe_path(probe: Probe) -> str:
    return {
        "models": "/v1/models",
        "sd_models": "/sdapi/v1/sd-models",
        "health": "/health",
        "kobold_flag": "/api/extra/version",
    }[probe]


def _active(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != "" and value != INACTIVE


def models_ready(status: int, body: bytes) -> bool:
    """`GET /v1/models`: 2xx, non-empty, and (when JSON) at least one model id that is active."""
    if not 200 <= status < 300 or not body.strip():
        return False
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return True
    if isinstance(doc, dict):
        for key in ("model", "id"):
            if doc.get(key) == INACTIVE:
                return False
        entries = doc.get("data", doc.get("models"))
        if isinstance(entries, list):
            return any(isinstance(e, dict) and _active(e.get("id", e.get("name"))) for e in entries)
        return True
    if isinstance(doc, list):
        return any(isinstance(e, dict) and _active(e.get("id")) for e in doc)
    return True


def sd_models_ready(status: int, body: bytes) -> bool:
    """`GET /sdapi/v1/sd-models`: 2xx and an entry naming an active model."""
    if not 200 <= status < 300:
        return False
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    entries = doc.get("data") if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        return False
    return any(
        isinstance(e, dict)
        and any(_active(e.get(k)) for k in ("model_name", "title", "model", "id"))
        for e in entries
    )


def health_ready(status: int, body: bytes) -> bool:
    return 200 <= status < 300


def kobold_flag_ready(status: int, body: bytes, flag: str) -> bool:
    """KoboldCpp capability flags: only a real JSON `true` counts."""
    if not 200 <= status < 300:
        return False
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get(flag) is True


def is_ready(probe: Probe, status: int, body: bytes, *, flag: str = "") -> bool:
    if probe == "models":
        return models_ready(status, body)
    if probe == "sd_models":
        return sd_models_ready(status, body)
    if probe == "health":
        return health_ready(status, body)
    return kobold_flag_ready(status, body, flag)
