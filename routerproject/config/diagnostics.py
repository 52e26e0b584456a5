"""The loaded config as JSON-able data for logs and diagnostics, secrets redacted."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
)

from routerproject.config.schema import SECTION_MODELS, RouterConfig
from routerproject.config.values import DurationMarker
from routerproject.durations import format_duration

REDACTED = "***"


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))


def _section_to_dict(section: BaseModel) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        if value is None:
            continue
        if any(isinstance(meta, DurationMarker) for meta in field.metadata):
            out[name] = format_duration(value)
        elif isinstance(value, Path):
            out[name] = str(value)
        elif isinstance(value, list):
            out[name] = [str(item) if isinstance(item, Path) else item for item in value]
        else:
            out[name] = value
    return out


def config_to_dict(cfg: RouterConfig) -> dict[str, Any]:
    """The configuration as JSON-able data for logs and diagnostics, secrets redacted.

    Durations are printed in their canonical Go form, so apart from the redactions and
    ``source_path`` the result reads like a config file.
    """
    out: dict[str, Any] = {name: _section_to_dict(getattr(cfg, name)) for name in SECTION_MODELS}
    out["cluster"]["token"] = REDACTED if cfg.cluster.token else ""
    out["cluster"]["previous_tokens"] = [REDACTED for _ in cfg.cluster.previous_tokens]
    out["auth"]["inference_keys"] = [REDACTED for _ in cfg.auth.inference_keys]
    out["auth"]["admin_keys"] = [REDACTED for _ in cfg.auth.admin_keys]
    out["database"]["url"] = _redact_url(cfg.database.url)
    out["source_path"] = str(cfg.source_path) if cfg.source_path is not None else None
    return out
