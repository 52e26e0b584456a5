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


# Where OpenAI-compatible servers say what a model reads, in `/v1/models` entries: a list of
# input modalities (OpenRouter-style, at the top or under `architecture`), a `modalities` list
# or `{"vision": true}` map (llama-server's shape), or a capabilities list (Ollama's words).
_VISION_WORDS = frozenset({"image", "vision", "multimodal"})


def _says_vision(entry: dict[str, Any]) -> bool | None:
    found: bool | None = None
    architecture = entry.get("architecture")
    holders = [entry, architecture] if isinstance(architecture, dict) else [entry]
    for holder in holders:
        for key in ("input_modalities", "modalities", "capabilities"):
            value = holder.get(key)
            if isinstance(value, list):
                words = {str(v).lower() for v in value}
                found = bool(found) or bool(words & _VISION_WORDS)
            elif isinstance(value, dict):
                found = bool(found) or any(value.get(word) is True for word in ("vision", "image"))
    return found


def reported_vision(body: bytes, model: str) -> bool | None:
    """Whether a server's `/v1/models` says `model` reads images; None when it does not say.

    The entry is the one named `model`, or the only one listed.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    entries = doc.get("data", doc.get("models")) if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        return None
    listed = [e for e in entries if isinstance(e, dict)]
    named = [e for e in listed if model in (e.get("id"), e.get("name"), e.get("model"))]
    chosen = named or (listed if len(listed) == 1 else [])
    return _says_vision(chosen[0]) if chosen else None
