"""A model config's options as other nodes and the WebUI see them: file names instead of
paths, and no credentials."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from registry.hashing import PATH_FIELDS, looks_like_path, path_base_name

# Credentials that a koboldcpp config may carry; they are dropped from the `options` that
# travel to other nodes and to the WebUI.
SECRET_OPTION_KEYS = frozenset({"password", "hordekey", "api_key", "apikey", "token"})
SECRET_OPTION_SUFFIXES = ("_password", "_api_key", "_apikey", "_token", "_secret")

_URL_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return lowered in SECRET_OPTION_KEYS or lowered.endswith(SECRET_OPTION_SUFFIXES)


def _sanitise_url(value: str) -> str:
    # Userinfo, query and fragment are where URLs carry credentials.
    parts = urlsplit(value)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _sanitise_value(value: Any, *, path_field: bool) -> Any:
    if isinstance(value, Mapping):
        return sanitise_options(value)
    if isinstance(value, list | tuple):
        return [_sanitise_value(item, path_field=path_field) for item in value]
    if isinstance(value, str) and value != "":
        if _URL_SCHEME_RE.match(value) and not path_field:
            return _sanitise_url(value)
        if path_field or looks_like_path(value):
            return path_base_name(value)
    return value


def sanitise_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The config as shown to other nodes: file names instead of paths, and no credentials."""
    return {
        str(key): _sanitise_value(value, path_field=str(key) in PATH_FIELDS)
        for key, value in raw.items()
        if not _is_secret_key(str(key))
    }
