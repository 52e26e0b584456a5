"""The router's YAML configuration: schema, validation with file lines, env overrides.

The grammar is the reference router's (operators keep their ``config.yaml``), so keys,
defaults and rules follow the reference notes. Every problem is reported as a
``ConfigError`` that names the dotted key and, where the key is in the file, its line:
a node that refuses to start must say exactly what to fix.

Loading is two-staged: the YAML node tree is walked to plain Python values while the
line of every key is remembered, then each section is validated by a pydantic model and
the rules that span keys or sections run over the validated sections. Collecting all
section errors before raising lets one start attempt report every mistake at once.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from lending.keys import KEYS_BY_NAME, LENDING_KEYS, LendingSettingError, canonical_value
from routerproject.durations import NS_PER_SEC, format_duration, parse_duration_ns

__all__ = [
    "AnalyticsConfig",
    "AuthConfig",
    "BackendConfig",
    "ClusterConfig",
    "ConfigError",
    "DatabaseConfig",
    "FamilyConfig",
    "ModelsConfig",
    "RouterConfig",
    "SecurityConfig",
    "ServerConfig",
    "config_to_dict",
    "load_config",
    "resolve_config_path",
]

ENV_CONFIG_PATH = "ROUTER_CONFIG"
ENV_CLUSTER_TOKEN = "ROUTER_CLUSTER_TOKEN"
ENV_CLUSTER_TOKEN_FILE = "ROUTER_CLUSTER_TOKEN_FILE"
ENV_DATABASE_URL = "DATABASE_URL"

DEFAULT_CONFIG_FILENAME = "config.yaml"
DEFAULT_DATABASE_FILENAME = "router.sqlite3"
REPO_DIR = Path(__file__).resolve().parent.parent
BUILTIN_MODELS_CONFIG_DIR = REPO_DIR / "demo" / "kcpps"

DEFAULT_MAX_BODY_BYTES = 33_554_432
MAX_BODY_BYTES_LIMIT = 2**31
# A body slower than this (bytes per second, on top of server.body_timeout) is a client holding
# a connection open, not one uploading.
DEFAULT_BODY_MIN_RATE = 4096
# Enough for a master's pooled connections or a busy client; a single address past it is
# holding connections, not using them.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 1024
MAX_PORT = 65_535
NODE_ID_MAX_CHARS = 64
SYNC_CONCURRENCY_MAX = 128
# A token file holds one short secret; refusing big files avoids reading a wrong path
# (a log, an image) into memory and into an error message.
TOKEN_FILE_MAX_BYTES = 64 * 1024
# Deep enough for any real config; stops a self-referencing YAML alias from recursing.
YAML_MAX_DEPTH = 32

REDACTED = "***"
PLACEHOLDER_SECRETS = frozenset({"change-me", "changeme", "replace-me", "replace_me"})
DURATION_HINT = "use a duration like 500ms, 1.5s, 2m"

_NODE_ID_RE = re.compile(r"[A-Za-z0-9._-]+")
_HOSTNAME_RE = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_PORT_RE = re.compile(r"[0-9]{1,5}")

# Validation context keys. ``from_yaml`` tightens types to what a YAML file must hold
# (durations as strings); ``base_dir`` anchors relative paths at the config file.
_CTX_FROM_YAML = "from_yaml"
_CTX_BASE_DIR = "base_dir"


# --------------------------------------------------------------------------- errors


class ConfigError(Exception):
    """An invalid configuration, naming the dotted key and file line where known.

    When several problems were found, this error describes the first one (by file line)
    and ``problems`` holds all of them; ``str()`` prints one per line.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        line: int | None = None,
        path: Path | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.line = line
        self.path = path
        self.problems: tuple[ConfigError, ...] = (self,)

    def describe(self) -> str:
        """This single problem as ``file:line: key: message``."""
        if self.path is not None:
            location = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        elif self.line:
            location = f"line {self.line}: "
        else:
            location = ""
        key = f"{self.key}: " if self.key else ""
        return f"{location}{key}{self.message}"

    def __str__(self) -> str:
        return "\n".join(problem.describe() for problem in self.problems)


def _combine(problems: list[ConfigError]) -> ConfigError:
    # Report in file order so "the first error" is the one a reader meets first.
    ordered = sorted(problems, key=lambda p: (p.line is None, p.line or 0))
    first = ordered[0]
    first.problems = tuple(ordered)
    return first


# ----------------------------------------------------------------- value helpers


def _type_name(value: Any) -> str:
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
    return bool(info.context and info.context.get(_CTX_FROM_YAML))


def _base_dir(info: ValidationInfo) -> Path:
    if info.context and isinstance(info.context.get(_CTX_BASE_DIR), Path):
        base: Path = info.context[_CTX_BASE_DIR]
        return base
    return Path.cwd()


def _require_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string (got {_type_name(value)})")
    return value


def _is_placeholder(value: str) -> bool:
    return value.strip().lower() in PLACEHOLDER_SECRETS


def _choice(literal: Any) -> BeforeValidator:
    """Validator giving a readable message for a value outside a ``Literal``'s choices."""
    choices: tuple[str, ...] = get_args(literal)

    def check(value: Any) -> Any:
        if not isinstance(value, str) or value not in choices:
            shown = repr(value) if isinstance(value, str | int | float) else _type_name(value)
            raise ValueError(f"must be one of {', '.join(choices)} (got {shown})")
        return value

    return BeforeValidator(check)


class _DurationMarker:
    """Annotation marking a float-seconds field that YAML spells as a Go duration."""


_DURATION = _DurationMarker()


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
            raise ValueError(f"{DURATION_HINT} (got {_type_name(value)} {value!r})")
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


def _resolve_path(text: str, base: Path) -> Path:
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = base / path
    return path.resolve()


def _validate_path(value: Any, info: ValidationInfo) -> Path:
    if isinstance(value, Path) and not _from_yaml(info):
        text = str(value)
    else:
        text = _require_str(value).strip()
    if not text:
        raise ValueError("must not be empty")
    return _resolve_path(text, _base_dir(info))


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
    return _check_http_url(_require_str(value).strip())


def _validate_optional_url(value: Any) -> str:
    text = _require_str(value).strip()
    return _check_http_url(text) if text else ""


RequiredUrl = Annotated[str, BeforeValidator(_validate_required_url)]
OptionalUrl = Annotated[str, BeforeValidator(_validate_optional_url)]


def _validate_secret_key(value: Any) -> str:
    text = _require_str(value).strip()
    if not text:
        raise ValueError("must not be blank")
    if _is_placeholder(text):
        raise ValueError("is a placeholder value; set a real secret")
    return text


SecretKey = Annotated[str, BeforeValidator(_validate_secret_key)]


def _validate_arg(value: Any) -> str:
    # Command-line arguments are text; a YAML "8" after "--threads" is meant as "8".
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return _require_str(value)


CommandArg = Annotated[str, BeforeValidator(_validate_arg)]


def _validate_cidr(value: Any) -> str:
    text = _require_str(value).strip()
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
    text = _require_str(value).strip()
    if text == "*":
        return text
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if not (_is_ip_address(bare) or _HOSTNAME_RE.fullmatch(bare)):
        raise ValueError(
            f"must be a host name or IP address without port, or * for any (got {text!r})"
        )
    return bare


AllowedHost = Annotated[str, BeforeValidator(_validate_allowed_host)]


def _split_bind(text: str) -> tuple[str, int]:
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


def _is_loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _validate_bind(value: Any) -> str:
    text = _require_str(value).strip()
    _split_bind(text)
    return text


def _check_database_url(text: str, base: Path | None) -> str:
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
    return f"sqlite:///{_resolve_path(rest[1:], base)}"


def _validate_database_url(value: Any, info: ValidationInfo) -> str:
    text = _require_str(value).strip()
    if not text:
        return ""
    return _check_database_url(text, _base_dir(info))


def _validate_lending_value(value: Any, info: ValidationInfo) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int | float | str):
        text = str(value)
    else:
        raise ValueError(f"must be a string, number or boolean (got {_type_name(value)})")
    field = info.field_name or ""
    try:
        return canonical_value(field, text)
    except LendingSettingError as exc:
        raise ValueError(exc.reason) from None


LendingValue = Annotated[str | None, BeforeValidator(_validate_lending_value)]


# ----------------------------------------------------------------------- sections


def _yaml_default(value: str) -> Any:
    """A default spelled as it would be in the YAML file; validate_default turns it into
    the field's type (seconds, a resolved path) exactly like a value from the file."""
    return Field(default=value)


class _Section(BaseModel):
    # validate_default: defaults go through the same validators, so default paths are
    # resolved against the config file's directory and default durations parsed.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ServerConfig(_Section):
    bind: Annotated[str, BeforeValidator(_validate_bind)] = "127.0.0.1:8080"
    allowed_cidrs: list[Cidr] = Field(default_factory=list)
    # Peers whose X-Forwarded-For names the client (a reverse proxy); none by default, so a
    # client cannot pick its own address with a header.
    trusted_proxies: list[Cidr] = Field(default_factory=list)
    # Host names a browser may reach the management API, WebUI and admin under; empty means
    # the defaults of `browser_hosts`.
    allowed_hosts: list[AllowedHost] = Field(default_factory=list)
    max_body_bytes: Annotated[StrictInt, Field(ge=1, le=MAX_BODY_BYTES_LIMIT)] = (
        DEFAULT_MAX_BODY_BYTES
    )
    header_timeout: PositiveDuration = _yaml_default("10s")
    body_timeout: PositiveDuration = _yaml_default("30s")
    body_min_rate: Annotated[StrictInt, Field(ge=0)] = DEFAULT_BODY_MIN_RATE
    idle_timeout: PositiveDuration = _yaml_default("2m")
    max_connections_per_client: Annotated[StrictInt, Field(ge=0)] = (
        DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    )
    shutdown_grace: NonNegativeDuration = _yaml_default("10s")

    @property
    def host(self) -> str:
        """Listen host; ``:8080`` (Go's every-interface form) becomes ``0.0.0.0``."""
        host = _split_bind(self.bind)[0]
        return host or "0.0.0.0"

    @property
    def port(self) -> int:
        return _split_bind(self.bind)[1]

    @property
    def is_loopback(self) -> bool:
        return _is_loopback_host(_split_bind(self.bind)[0])

    @property
    def allowed_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in self.allowed_cidrs)

    @property
    def proxy_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in self.trusted_proxies)

    def browser_hosts(self, public_url: str = "") -> tuple[str, ...] | None:
        """Host names (lower case, no port) a browser may use; ``None`` means any host.

        Unset, they are the loopback names, the bind host and the public URL's host, and any
        host when the bind address is a wildcard (the operator cannot have listed every name
        the machine answers to).
        """
        if self.allowed_hosts:
            if "*" in self.allowed_hosts:
                return None
            return tuple(host.lower() for host in self.allowed_hosts)
        host = _split_bind(self.bind)[0]
        if host in ("", "0.0.0.0", "::"):
            return None
        names = ["localhost", "127.0.0.1", "::1", host.lower()]
        public_host = urlsplit(public_url).hostname if public_url else None
        if public_host:
            names.append(public_host.lower())
        return tuple(dict.fromkeys(names))


class AuthConfig(_Section):
    inference_keys: list[SecretKey] = Field(default_factory=list, repr=False)
    admin_keys: list[SecretKey] = Field(default_factory=list, repr=False)


SecurityProfile = Literal["secure", "trusted_lan"]


class SecurityConfig(_Section):
    profile: Annotated[SecurityProfile, _choice(SecurityProfile)] = "secure"


ClusterRole = Literal["standalone", "master", "slave"]


def _validate_node_id(value: Any) -> str:
    text = _require_str(value).strip()
    if not text:
        raise ValueError("must not be blank")
    if len(text) > NODE_ID_MAX_CHARS:
        raise ValueError(f"must be at most {NODE_ID_MAX_CHARS} characters")
    if not _NODE_ID_RE.fullmatch(text):
        raise ValueError(f"may contain only letters, digits, '.', '_' and '-' (got {text!r})")
    return text


def _validate_token(value: Any) -> str:
    # Never echo the value: it is a secret even when it is wrong.
    text = _require_str(value).strip()
    if _is_placeholder(text):
        raise ValueError("is a placeholder value; set a real secret")
    return text


class ClusterConfig(_Section):
    role: Annotated[ClusterRole, _choice(ClusterRole)] = "standalone"
    node_id: Annotated[str, BeforeValidator(_validate_node_id)] = "local"
    token: Annotated[str, BeforeValidator(_validate_token)] = Field(default="", repr=False)
    public_url: OptionalUrl = ""
    master_url: OptionalUrl = ""
    slave_urls: list[RequiredUrl] = Field(default_factory=list)
    store_dir: ResolvedPath = _yaml_default("./router-store")
    sync_interval: PositiveDuration = _yaml_default("60s")
    health_interval: PositiveDuration = _yaml_default("15s")
    control_timeout: PositiveDuration = _yaml_default("30s")
    health_timeout: PositiveDuration = _yaml_default("3s")
    """How long one health poll of one node may take: a node that misses it is suspect."""
    sync_concurrency: Annotated[StrictInt, Field(ge=1, le=SYNC_CONCURRENCY_MAX)] = 4
    routing_cache_affinity: StrictBool = False
    """Send a request to the replica that holds its prompt prefix when that pays
    (registry/affinity.py); off keeps the plain rotation of replicas."""
    routing_affinity_entries: Annotated[StrictInt, Field(ge=1)] = 10000
    routing_affinity_ttl: PositiveDuration = _yaml_default("10m")
    # The lending timers of this node (not lending settings: the master pushes none of them).
    lending_status_timeout: PositiveDuration = _yaml_default("500ms")
    """How long a plan waits for a node's runtime status, and the stall check for its answer:
    a plan sits on an owner's request path, so a slower node is treated as not answering."""
    lending_reprobe_interval: PositiveDuration = _yaml_default("1s")
    """How often the master asks a silent node again in the background."""
    lending_reprobe_timeout: PositiveDuration = _yaml_default("10s")
    """How long one background re-probe waits: a stopped process answers nothing until it
    resumes, and then at once, so a short wait would only reconnect more often."""
    lending_stall_check_interval: PositiveDuration = _yaml_default("5s")
    """The longest wait between two stall checks (they run every quarter of
    `offload_lent_stall_timeout`, at most this far apart)."""
    lending_event_timeout: PositiveDuration = _yaml_default("10s")
    """How long an owner waits for the master's answer to a queue event."""

    # Lending settings (lending.keys.LENDING_KEYS): None when the file does not set them.
    scheduling_refresh_interval: LendingValue = None
    scheduling_sample_window: LendingValue = None
    scheduling_min_samples: LendingValue = None
    scheduling_backend_depth: LendingValue = None
    scheduling_grant_ttl: LendingValue = None
    scheduling_context_reserve: LendingValue = None
    offload_restore_delay: LendingValue = None
    offload_probe_idle: LendingValue = None
    offload_faster_helper_slots: LendingValue = None
    offload_slower_helper_slots: LendingValue = None
    offload_probe_helper_slots: LendingValue = None
    offload_hold_for_faster_helper: LendingValue = None
    offload_decisions_retention: LendingValue = None
    offload_lent_stall_timeout: LendingValue = None

    def lending_file_values(self) -> dict[str, str]:
        """Canonical values of the lending settings set in the file, in declared order."""
        values: dict[str, str] = {}
        for key in LENDING_KEYS:
            value = getattr(self, key.name)
            if value is not None:
                values[key.name] = value
        return values


# The lending table and the schema above must not drift apart: a key added to the table
# has to be accepted in config files too.
_LENDING_FIELDS_MISSING = [name for name in KEYS_BY_NAME if name not in ClusterConfig.model_fields]
if _LENDING_FIELDS_MISSING:  # pragma: no cover - guards future edits
    raise RuntimeError(f"ClusterConfig lacks lending keys: {_LENDING_FIELDS_MISSING}")


class ModelsConfig(_Section):
    config_dir: ResolvedPath = _yaml_default("./kcpps")
    startup_model: Annotated[str, BeforeValidator(_require_str)] = ""
    shared_dir: str = ""
    hash_workers: Annotated[StrictInt, Field(ge=1)] = 1
    concurrent_asset_transfers: Annotated[StrictInt, Field(ge=1)] = 2
    file_roots: list[ResolvedPath] = Field(default_factory=list)
    # One deadline shared by a whole peer lookup (the master's fan-out included): past it the
    # answer is "no sources", never a hang.
    asset_lookup_timeout: PositiveDuration = _yaml_default("10s")
    # Bytes per second this node serves one asset stream at; 0 is unlimited. Keeps a copy
    # between nodes from taking the whole link from inference traffic.
    asset_serve_rate: Annotated[StrictInt, Field(ge=0)] = 0

    @field_validator("config_dir")
    @classmethod
    def _config_dir_exists(cls, value: Path) -> Path:
        if not value.exists():
            raise ValueError(f"directory {value} does not exist")
        if not value.is_dir():
            raise ValueError(f"{value} is not a directory")
        return value

    @field_validator("shared_dir", mode="before")
    @classmethod
    def _resolve_shared_dir(cls, value: Any, info: ValidationInfo) -> str:
        # Empty keeps its meaning ("<store_dir>/model-assets"), so it stays a string.
        text = _require_str(value).strip()
        return str(_resolve_path(text, _base_dir(info))) if text else ""


BackendMode = Literal["kobold", "llama_sdcpp", "vllm", "sim"]


def _validate_listen_host(value: Any) -> str:
    text = _require_str(value).strip()
    if not text or any(ch.isspace() for ch in text):
        raise ValueError("must be a host name or IP address")
    return text


class BackendConfig(_Section):
    mode: Annotated[BackendMode, _choice(BackendMode)] = "kobold"
    load_timeout: PositiveDuration = _yaml_default("10m")
    request_timeout: PositiveDuration = _yaml_default("30m")
    host: Annotated[str, BeforeValidator(_validate_listen_host)] = "127.0.0.1"


class FamilyConfig(_Section):
    """One backend family (``llama``, ``sdcpp``, ``whispercpp``, ``kobold``, ``vllm``)."""

    binary_path: Annotated[str, BeforeValidator(_require_str)] = ""
    backend_url: OptionalUrl = ""
    extra_args: list[CommandArg] = Field(default_factory=list)


class DatabaseConfig(_Section):
    url: Annotated[str, BeforeValidator(_validate_database_url)] = Field(default="", repr=False)


class AnalyticsConfig(_Section):
    enabled: StrictBool = True
    retention: PositiveDuration = _yaml_default("720h")


LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
BACKEND_LOG_MAX_BYTES_LIMIT = 1 << 40


class LoggingConfig(_Section):
    # json: one object per line (python-json-logger), for log shippers.
    format: Annotated[LogFormat, _choice(LogFormat)] = "text"
    level: Annotated[LogLevel, _choice(LogLevel)] = "INFO"
    # Backend and worker output files are cut at this size (kept: `backend_log_backups`).
    backend_log_max_bytes: Annotated[StrictInt, Field(ge=1024, le=BACKEND_LOG_MAX_BYTES_LIMIT)] = (
        64 * 1024 * 1024
    )
    backend_log_backups: Annotated[StrictInt, Field(ge=1, le=100)] = 3


# ------------------------------------------------------------------- cross checks


def _duplicate_problems(prefix: str, values: list[str]) -> list[tuple[str, str]]:
    seen: dict[str, int] = {}
    problems: list[tuple[str, str]] = []
    for index, value in enumerate(values):
        if value in seen:
            problems.append((f"{prefix}[{index}]", f"duplicate of {prefix}[{seen[value]}]"))
        else:
            seen[value] = index
    return problems


def _cross_problems(
    server: ServerConfig | None,
    auth: AuthConfig | None,
    security: SecurityConfig | None,
    cluster: ClusterConfig | None,
) -> list[tuple[str, str]]:
    """Rules spanning keys or sections, over whichever sections validated on their own."""
    problems: list[tuple[str, str]] = []
    if auth is not None:
        problems += _duplicate_problems("auth.inference_keys", auth.inference_keys)
        problems += _duplicate_problems("auth.admin_keys", auth.admin_keys)
        # One secret in two roles blurs who may do what (reference: fails to load).
        inference = set(auth.inference_keys)
        for index, value in enumerate(auth.admin_keys):
            if value in inference:
                problems.append(
                    (f"auth.admin_keys[{index}]", "is also listed in auth.inference_keys")
                )
    if (
        server is not None
        and auth is not None
        and security is not None
        and security.profile == "secure"
        and not server.is_loopback
    ):
        for name in ("inference_keys", "admin_keys"):
            if not getattr(auth, name):
                problems.append(
                    (
                        f"auth.{name}",
                        f"must not be empty when server.bind ({server.bind}) is not a "
                        "loopback address and security.profile is secure "
                        "(set keys, or security.profile: trusted_lan)",
                    )
                )
    if cluster is not None:
        if cluster.role != "standalone" and not cluster.token:
            problems.append(("cluster.token", f"is required when cluster.role is {cluster.role}"))
        if cluster.role == "slave":
            for name in ("master_url", "public_url"):
                if not getattr(cluster, name):
                    problems.append((f"cluster.{name}", "is required when cluster.role is slave"))
        problems += _duplicate_problems("cluster.slave_urls", cluster.slave_urls)
    if cluster is not None and auth is not None and cluster.token:
        for name in ("inference_keys", "admin_keys"):
            if cluster.token in getattr(auth, name):
                problems.append(("cluster.token", f"must not reuse a value from auth.{name}"))
    return problems


# ---------------------------------------------------------------------- top level


class RouterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    models: ModelsConfig = Field(default_factory=ModelsConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    llama: FamilyConfig = Field(default_factory=FamilyConfig)
    sdcpp: FamilyConfig = Field(default_factory=FamilyConfig)
    whispercpp: FamilyConfig = Field(default_factory=FamilyConfig)
    kobold: FamilyConfig = Field(default_factory=FamilyConfig)
    vllm: FamilyConfig = Field(default_factory=FamilyConfig)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    analytics: AnalyticsConfig = Field(default_factory=AnalyticsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    # Where the config came from; set by load_config, never read from YAML.
    source_path: Path | None = None

    @model_validator(mode="after")
    def _check_cross_rules(self) -> RouterConfig:
        problems = _cross_problems(self.server, self.auth, self.security, self.cluster)
        if problems:
            raise ValueError("; ".join(f"{key}: {message}" for key, message in problems))
        return self

    def database_url(self, environ: Mapping[str, str] | None = None) -> str:
        """The database to use: ``$DATABASE_URL``, else ``database.url``, else sqlite
        in ``cluster.store_dir``."""
        env = os.environ if environ is None else environ
        from_env = env.get(ENV_DATABASE_URL, "").strip()
        if from_env:
            try:
                return _check_database_url(from_env, None)
            except ValueError as exc:
                raise ConfigError(str(exc), key=ENV_DATABASE_URL) from None
        if self.database.url:
            return self.database.url
        return f"sqlite:///{self.cluster.store_dir / DEFAULT_DATABASE_FILENAME}"

    def lending_file_values(self) -> dict[str, str]:
        return self.cluster.lending_file_values()

    @property
    def shared_dir_path(self) -> Path:
        """Where shared asset transfers land (``<store_dir>/model-assets`` by default)."""
        if self.models.shared_dir:
            return Path(self.models.shared_dir)
        return self.cluster.store_dir / "model-assets"


SECTION_MODELS: dict[str, type[_Section]] = {
    "server": ServerConfig,
    "auth": AuthConfig,
    "security": SecurityConfig,
    "cluster": ClusterConfig,
    "models": ModelsConfig,
    "backend": BackendConfig,
    "llama": FamilyConfig,
    "sdcpp": FamilyConfig,
    "whispercpp": FamilyConfig,
    "kobold": FamilyConfig,
    "vllm": FamilyConfig,
    "database": DatabaseConfig,
    "analytics": AnalyticsConfig,
    "logging": LoggingConfig,
}


# -------------------------------------------------------------------------- YAML


class _YamlTree:
    """Turns a composed YAML node tree into plain values, remembering key lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: dict[str, int] = {}
        self._constructor = SafeConstructor()

    def _error(self, message: str, node: Node, key: str | None) -> ConfigError:
        return ConfigError(message, key=key or None, line=node.start_mark.line + 1, path=self.path)

    def convert(self, node: Node, key: str, depth: int = 0) -> Any:
        if depth > YAML_MAX_DEPTH:
            raise self._error("nested too deeply", node, key)
        if isinstance(node, MappingNode):
            return self._mapping(node, key, depth)
        if isinstance(node, SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                child = f"{key}[{index}]"
                self.lines[child] = item.start_mark.line + 1
                items.append(self.convert(item, child, depth + 1))
            return items
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise self._error(f"invalid value: {exc.problem}", node, key) from None

    def _mapping(self, node: MappingNode, key: str, depth: int) -> dict[str, Any]:
        try:
            self._constructor.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            raise self._error(f"invalid merge: {exc.problem}", node, key) from None
        result: dict[str, Any] = {}
        seen: set[str] = set()
        for key_node, value_node in node.value:
            name = (
                self._constructor.construct_object(key_node)
                if isinstance(key_node, ScalarNode)
                else None
            )
            if not isinstance(name, str):
                raise self._error("keys must be plain names", key_node, key)
            child = f"{key}.{name}" if key else name
            if name in seen:
                raise self._error("duplicate key", key_node, child)
            seen.add(name)
            self.lines[child] = key_node.start_mark.line + 1
            value = self.convert(value_node, child, depth + 1)
            # "key:" with nothing after it means "not set" (as in the Go reference),
            # which also makes an empty section mean all defaults.
            if value is not None:
                result[name] = value
        return result


def _parse_yaml(text: str, path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        detail = exc.problem or exc.context or "syntax error"
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"invalid YAML: {detail}", line=line, path=path) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path=path) from None
    if root is None:
        return {}, {}
    if not isinstance(root, MappingNode):
        raise ConfigError(
            "the top level must be a mapping of sections (server:, cluster:, models:, ...)",
            line=root.start_mark.line + 1,
            path=path,
        )
    tree = _YamlTree(path)
    data = tree.convert(root, "")
    return data, tree.lines


def _read_config_text(path: Path) -> str:
    try:
        # utf-8-sig: editors on some systems prepend a byte-order mark.
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError("config file does not exist", path=path) from None
    except UnicodeDecodeError:
        raise ConfigError("config file is not valid UTF-8 text", path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", path=path) from None


# --------------------------------------------------------------------- env, paths


def _token_from_env(env: Mapping[str, str], path: Path | None) -> str | None:
    direct = env.get(ENV_CLUSTER_TOKEN, "")
    file_name = env.get(ENV_CLUSTER_TOKEN_FILE, "")
    if direct and file_name:
        raise ConfigError(
            f"set ${ENV_CLUSTER_TOKEN} or ${ENV_CLUSTER_TOKEN_FILE}, not both",
            key="cluster.token",
            path=path,
        )
    if direct:
        return direct
    if not file_name:
        return None

    def fail(reason: str) -> ConfigError:
        return ConfigError(
            f"${ENV_CLUSTER_TOKEN_FILE} ({file_name}) {reason}", key="cluster.token", path=path
        )

    secret_path = Path(file_name).expanduser()
    try:
        info = secret_path.stat()
    except OSError as exc:
        raise fail(f"cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise fail("is not a regular file")
    if info.st_size > TOKEN_FILE_MAX_BYTES:
        raise fail(f"is larger than {TOKEN_FILE_MAX_BYTES} bytes")
    try:
        value = secret_path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise fail("is not UTF-8 text") from None
    except OSError as exc:
        raise fail(f"cannot be read: {exc.strerror}") from None
    if not value:
        raise fail("is empty")
    if "\n" in value or "\r" in value:
        raise fail("must hold a single value on one line")
    return value


def resolve_config_path(
    explicit: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Path | None:
    """Which config file to use: ``--config``, then ``$ROUTER_CONFIG``, then
    ``./config.yaml`` if present; ``None`` means the built-in default."""
    env = os.environ if environ is None else environ
    base = Path.cwd() if cwd is None else cwd
    if explicit:
        candidate, source = Path(explicit), "--config"
    elif env.get(ENV_CONFIG_PATH):
        candidate, source = Path(env[ENV_CONFIG_PATH]), f"${ENV_CONFIG_PATH}"
    else:
        default = base / DEFAULT_CONFIG_FILENAME
        return default if default.exists() else None
    candidate = candidate.expanduser()
    if not candidate.is_absolute():
        candidate = base / candidate
    if not candidate.exists():
        raise ConfigError(f"config file given by {source} does not exist", path=candidate)
    if not candidate.is_file():
        raise ConfigError(f"config file given by {source} is not a file", path=candidate)
    return candidate


# ---------------------------------------------------------------------- loading


def _parent_key(key: str) -> str:
    if key.endswith("]"):
        return key[: key.rfind("[")]
    return key.rpartition(".")[0]


def _line_for(key: str, lines: Mapping[str, int]) -> int | None:
    """Line of ``key``, else of its nearest enclosing key present in the file."""
    while key:
        if key in lines:
            return lines[key]
        key = _parent_key(key)
    return None


def _key_from_loc(section: str, loc: Iterable[int | str]) -> str:
    key = section
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key


def _message_for(error: ErrorDetails, model: type[BaseModel]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "value_error" and "error" in ctx:
        return str(ctx["error"])
    if kind == "extra_forbidden":
        name = str(error["loc"][-1]) if error["loc"] else ""
        close = difflib.get_close_matches(name, list(model.model_fields), n=1)
        return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"
    if kind == "string_type":
        return f"must be a string (got {_type_name(value)})"
    if kind == "int_type":
        return f"must be a whole number (got {_type_name(value)})"
    if kind == "bool_type":
        return f"must be true or false (got {_type_name(value)})"
    if kind == "list_type":
        return f"must be a list (got {_type_name(value)})"
    if kind in ("model_type", "dict_type"):
        return f"must be a mapping of keys (got {_type_name(value)})"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')} (got {value!r})"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')} (got {value!r})"
    return str(error["msg"])


def _validate_sections(
    raw: Mapping[str, Any],
    lines: Mapping[str, int],
    base_dir: Path,
    path: Path | None,
    env_keys: Mapping[str, str],
    env: Mapping[str, str],
) -> RouterConfig:
    problems: list[ConfigError] = []

    def add(key: str, message: str) -> None:
        if key in env_keys:
            # The value came from the environment, so a file line would mislead.
            problems.append(
                ConfigError(f"{message} (value from {env_keys[key]})", key=key, path=path)
            )
        else:
            problems.append(ConfigError(message, key=key, line=_line_for(key, lines), path=path))

    for name in raw:
        if name not in SECTION_MODELS:
            close = difflib.get_close_matches(name, list(SECTION_MODELS), n=1)
            add(name, f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key")

    context = {_CTX_FROM_YAML: path is not None, _CTX_BASE_DIR: base_dir}
    sections: dict[str, Any] = {}
    for name, model in SECTION_MODELS.items():
        data = raw.get(name, {})
        if not isinstance(data, dict):
            add(name, f"must be a mapping of keys (got {_type_name(data)})")
            continue
        try:
            sections[name] = model.model_validate(data, context=context)
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                add(_key_from_loc(name, error["loc"]), _message_for(error, model))

    for key, message in _cross_problems(
        sections.get("server"),
        sections.get("auth"),
        sections.get("security"),
        sections.get("cluster"),
    ):
        add(key, message)

    env_database_url = env.get(ENV_DATABASE_URL, "").strip()
    if env_database_url:
        try:
            _check_database_url(env_database_url, None)
        except ValueError as exc:
            problems.append(ConfigError(str(exc), key=ENV_DATABASE_URL))

    if problems:
        raise _combine(problems)
    return RouterConfig(**sections, source_path=path)


def load_config(path: Path | None, *, environ: Mapping[str, str] | None = None) -> RouterConfig:
    """Load, validate and resolve the configuration; ``None`` gives the built-in default.

    Raises ``ConfigError`` naming the key (and file line) of every problem found.
    """
    env = os.environ if environ is None else environ
    raw: dict[str, Any]
    if path is None:
        # A standalone node that runs out of the box: simulated backend, demo models.
        raw = {"backend": {"mode": "sim"}, "models": {"config_dir": str(BUILTIN_MODELS_CONFIG_DIR)}}
        lines: dict[str, int] = {}
        base_dir = Path.cwd()
    else:
        path = Path(path)
        if path.exists() and not path.is_file():
            raise ConfigError("config path is not a file", path=path)
        raw, lines = _parse_yaml(_read_config_text(path), path)
        base_dir = path.absolute().parent

    env_keys: dict[str, str] = {}
    token = _token_from_env(env, path)
    if token is not None:
        cluster = raw.setdefault("cluster", {})
        if isinstance(cluster, dict):
            cluster["token"] = token
            source = ENV_CLUSTER_TOKEN if env.get(ENV_CLUSTER_TOKEN) else ENV_CLUSTER_TOKEN_FILE
            env_keys["cluster.token"] = f"${source}"
    return _validate_sections(raw, lines, base_dir, path, env_keys, env)


# ------------------------------------------------------------------- diagnostics


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
        if any(isinstance(meta, _DurationMarker) for meta in field.metadata):
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
    out["auth"]["inference_keys"] = [REDACTED for _ in cfg.auth.inference_keys]
    out["auth"]["admin_keys"] = [REDACTED for _ in cfg.auth.admin_keys]
    out["database"]["url"] = _redact_url(cfg.database.url)
    out["source_path"] = str(cfg.source_path) if cfg.source_path is not None else None
    return out
