"""Checks and annotated types of single config values: durations, paths, URLs, secrets,
CIDRs, hosts, bind addresses and database URLs.

A message never echoes a value that may be a secret or carry credentials.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, get_args
from urllib.parse import urlsplit

from pydantic import (
    BeforeValidator,
    ValidationInfo,
)

from routerproject.durations import NS_PER_SEC, parse_duration_ns

MAX_PORT = 65_535

PLACEHOLDER_SECRETS = frozenset({"change-me", "changeme", "replace-me", "replace_me"})
DURATION_HINT = "use a duration like 500ms, 1.5s, 2m"

_HOSTNAME_RE = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_PORT_RE = re.compile(r"[0-9]{1,5}")

# Validation context keys. ``from_yaml`` tightens types to what a YAML file must hold
# (durations as strings); ``base_dir`` anchors relative paths at the config file.
CTX_FROM_YAML = "from_yaml"
CTX_BASE_DIR = "base_dir"


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def _from_yaml(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get(CTX_FROM_YAML))


def base_dir_of(info: ValidationInfo) -> Path:
    if info.context and isinstance(info.context.get(CTX_BASE_DIR), Path):
        base: Path = info.context[CTX_BASE_DIR]
        return base
    return Path.cwd()


def require_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string (got {type_name(value)})")
    return value


def is_placeholder(value: str) -> bool:
    return value.strip().lower() in PLACEHOLDER_SECRETS


def choice(literal: Any) -> BeforeValidator:
    """Validator giving a readable message for a value outside a ``Literal``'s choices."""
    choices: tuple[str, ...] = get_args(literal)

    def check(value: Any) -> Any:
        if not isinstance(value, str) or value not in choices:
            shown = repr(value) if isinstance(value, str | int | float) else type_name(value)
            raise ValueError(f"must be one of {', '.join(choices)} (got {shown})")
        return value

    return BeforeValidator(check)


class DurationMarker:
    """Annotation marking a float-seconds field that YAML spells as a Go duration."""


_DURATION = DurationMarker()


def _duration_validator(*, allow_zero: bool) -> Callable[[Any, ValidationInfo], float]:
    def validate(value: Any, info: ValidationInfo) -> float:
        if isinstance(value, str):
            try:
                ns = parse_duration_ns(value.strip())
            except ValueError as exc:
                raise ValueError(str(exc)) from None
        elif (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and not _from_yaml(info)
            and math.isfinite(value)
        ):
            # Python callers may pass seconds; a YAML file must spell the unit out.
            ns = round(value * NS_PER_SEC)
        else:
            raise ValueError(f"{DURATION_HINT} (got {type_name(value)} {value!r})")
        if ns < 0 or (ns == 0 and not allow_zero):
            raise ValueError(f"must be greater than 0 ({DURATION_HINT})")
        return ns / NS_PER_SEC

    return validate


PositiveDuration = Annotated[
    float, BeforeValidator(_duration_validator(allow_zero=False)), _DURATION
]
NonNegativeDuration = Annotated[
    float, BeforeValidator(_duration_validator(allow_zero=True)), _DURATION
]


def resolve_path(text: str, base: Path) -> Path:
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = base / path
    return path.resolve()


def _validate_path(value: Any, info: ValidationInfo) -> Path:
    if isinstance(value, Path) and not _from_yaml(info):
        text = str(value)
    else:
        text = require_str(value).strip()
    if not text:
        raise ValueError("must not be empty")
    return resolve_path(text, base_dir_of(info))


ResolvedPath = Annotated[Path, BeforeValidator(_validate_path)]


def _check_http_url(text: str) -> str:
    # Messages never echo the URL: a rejected one may carry credentials.
    if any(ch.isspace() for ch in text):
        raise ValueError("must be a URL without spaces")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an absolute http:// or https:// URL")
    if "@" in parts.netloc:
        raise ValueError("must not contain a user name or password")
    if not parts.hostname:
        raise ValueError("must name a host, e.g. http://10.0.0.2:8080")
    try:
        _ = parts.port
    except ValueError:
        raise ValueError("has an invalid port") from None
    return text


def _validate_required_url(value: Any) -> str:
    return _check_http_url(require_str(value).strip())


def _validate_optional_url(value: Any) -> str:
    text = require_str(value).strip()
    return _check_http_url(text) if text else ""


RequiredUrl = Annotated[str, BeforeValidator(_validate_required_url)]
OptionalUrl = Annotated[str, BeforeValidator(_validate_optional_url)]


def _validate_secret_key(value: Any) -> str:
    text = require_str(value).strip()
    if not text:
        raise ValueError("must not be blank")
    if is_placeholder(text):
        raise ValueError("is a placeholder value; set a real secret")
    return text


SecretKey = Annotated[str, BeforeValidator(_validate_secret_key)]


def _validate_arg(value: Any) -> str:
    # Command-line arguments are text; a YAML "8" after "--threads" is meant as "8".
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return require_str(value)


CommandArg = Annotated[str, BeforeValidator(_validate_arg)]


def _validate_cidr(value: Any) -> str:
    text = require_str(value).strip()
    if "/" not in text:
        raise ValueError(f"must be a CIDR such as 10.0.0.0/8 or 192.168.1.0/24 (got {text!r})")
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(
            f"must be a CIDR such as 10.0.0.0/8 or 192.168.1.0/24 (got {text!r})"
        ) from None
    return text


Cidr = Annotated[str, BeforeValidator(_validate_cidr)]


def _validate_allowed_host(value: Any) -> str:
    text = require_str(value).strip()
    if text == "*":
        return text
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if not (_is_ip_address(bare) or _HOSTNAME_RE.fullmatch(bare)):
        raise ValueError(
            f"must be a host name or IP address without port, or * for any (got {text!r})"
        )
    return bare


AllowedHost = Annotated[str, BeforeValidator(_validate_allowed_host)]


def split_bind(text: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port``; an empty host means every interface."""
    hint = "must be host:port, e.g. 127.0.0.1:8080, 0.0.0.0:8080 or [::1]:8080"
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError(f"{hint} (got {text!r})")
        host, port_text = text[1:end], text[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{hint}; brackets hold an IPv6 address (got {text!r})") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"{hint} (got {text!r})")
        if ":" in host:
            raise ValueError(f"an IPv6 address must be in brackets, e.g. [::1]:8080 (got {text!r})")
        if host and not (_is_ip_address(host) or _HOSTNAME_RE.fullmatch(host)):
            raise ValueError(f"{hint}; {host!r} is not a host name or IP address")
    if not _PORT_RE.fullmatch(port_text) or not 1 <= int(port_text) <= MAX_PORT:
        raise ValueError(f"port must be a number from 1 to {MAX_PORT} (got {port_text!r})")
    return host, int(port_text)


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate_bind(value: Any) -> str:
    text = require_str(value).strip()
    split_bind(text)
    return text


def check_database_url(text: str, base: Path | None) -> str:
    """Validate a database URL; with ``base``, anchor a relative sqlite path there.

    ``sqlite:///rel/path`` is relative and ``sqlite:////abs/path`` absolute, the
    convention of dj-database-url and SQLAlchemy.
    """
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("sqlite", "postgres", "postgresql"):
        shown = f" (got scheme {scheme!r})" if sep else ""
        raise ValueError(f"must start with sqlite:///, postgres:// or postgresql://{shown}")
    if scheme != "sqlite":
        if not rest:
            raise ValueError("must name a server or database after postgres://")
        return text
    if rest == ":memory:":
        return text
    if not rest.startswith("/") or rest == "/":
        raise ValueError("a sqlite URL looks like sqlite:///path/to/router.sqlite3")
    if base is None:
        return text
    return f"sqlite:///{resolve_path(rest[1:], base)}"


def validate_database_url(value: Any, info: ValidationInfo) -> str:
    text = require_str(value).strip()
    if not text:
        return ""
    return check_database_url(text, base_dir_of(info))
