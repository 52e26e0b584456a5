"""The config's schema: one pydantic model per section, the rules that span keys or
sections, and the whole ``RouterConfig``.

The grammar is the reference router's (operators keep their ``config.yaml``), so keys,
defaults and rules follow the reference notes.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lending.keys import KEYS_BY_NAME, LENDING_KEYS, LendingSettingError, canonical_value
from routerproject.config.errors import ConfigError
from routerproject.config.tls import OptionalFile, tls_problems
from routerproject.config.values import (
    AllowedHost,
    Cidr,
    CommandArg,
    NonNegativeDuration,
    OptionalUrl,
    PositiveDuration,
    RequiredUrl,
    ResolvedPath,
    SecretKey,
    base_dir_of,
    check_database_url,
    choice,
    is_loopback_host,
    is_placeholder,
    require_str,
    resolve_path,
    split_bind,
    type_name,
    validate_bind,
    validate_database_url,
)

ENV_DATABASE_URL = "DATABASE_URL"
DEFAULT_DATABASE_FILENAME = "router.sqlite3"

DEFAULT_MAX_BODY_BYTES = 33_554_432
MAX_BODY_BYTES_LIMIT = 2**31
# A body slower than this (bytes per second, on top of server.body_timeout) is a client holding
# a connection open, not one uploading.
DEFAULT_BODY_MIN_RATE = 4096
# Enough for a master's pooled connections or a busy client; a single address past it is
# holding connections, not using them.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 1024
NODE_ID_MAX_CHARS = 64
SYNC_CONCURRENCY_MAX = 128

_NODE_ID_RE = re.compile(r"[A-Za-z0-9._-]+")


def _validate_lending_value(value: Any, info: ValidationInfo) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int | float | str):
        text = str(value)
    else:
        raise ValueError(f"must be a string, number or boolean (got {type_name(value)})")
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
    bind: Annotated[str, BeforeValidator(validate_bind)] = "127.0.0.1:8080"
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
    # Connections (HTTP and WebSocket) the node holds at once; unset, derived from the
    # open-file limit (proxy/edge/frontdoor.py), 0 for no cap. The last few are kept for
    # health checks and node routes.
    max_connections: Annotated[StrictInt, Field(ge=0)] | None = None
    shutdown_grace: NonNegativeDuration = _yaml_default("10s")
    # HTTPS and WSS on `bind` (both or neither); the client CA asks node routes for a client
    # certificate it signed (routerproject/config/tls.py checks them at start).
    tls_cert_file: OptionalFile = None
    tls_key_file: OptionalFile = None
    tls_client_ca_file: OptionalFile = None
    # A `/v1/realtime` session with no frame either way this long is closed (1001): it holds
    # its lane's runtime, and clients that answer pings would otherwise keep it for hours.
    realtime_idle_timeout: PositiveDuration = _yaml_default("2m")

    @property
    def host(self) -> str:
        """Listen host; ``:8080`` (Go's every-interface form) becomes ``0.0.0.0``."""
        host = split_bind(self.bind)[0]
        return host or "0.0.0.0"

    @property
    def port(self) -> int:
        return split_bind(self.bind)[1]

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(split_bind(self.bind)[0])

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
        host = split_bind(self.bind)[0]
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
    # Every model's requests wait in the router queue, admitted across keys by weighted fair
    # share (lending/fairshare.py); off keeps the spec's flow (only linked models queue there).
    fair_share: StrictBool = False


SecurityProfile = Literal["secure", "trusted_lan"]


class SecurityConfig(_Section):
    profile: Annotated[SecurityProfile, choice(SecurityProfile)] = "secure"


ClusterRole = Literal["standalone", "master", "slave"]
# Which nodes the master polls for an owner's event: every node (the spec's rule), or only the
# nodes a plan for that owner can involve.
EventPoll = Literal["all", "linked"]


def _validate_node_id(value: Any) -> str:
    text = require_str(value).strip()
    if not text:
        raise ValueError("must not be blank")
    if len(text) > NODE_ID_MAX_CHARS:
        raise ValueError(f"must be at most {NODE_ID_MAX_CHARS} characters")
    if not _NODE_ID_RE.fullmatch(text):
        raise ValueError(f"may contain only letters, digits, '.', '_' and '-' (got {text!r})")
    return text


def _validate_token(value: Any) -> str:
    # Never echo the value: it is a secret even when it is wrong.
    text = require_str(value).strip()
    if is_placeholder(text):
        raise ValueError("is a placeholder value; set a real secret")
    return text


class ClusterConfig(_Section):
    role: Annotated[ClusterRole, choice(ClusterRole)] = "standalone"
    node_id: Annotated[str, BeforeValidator(_validate_node_id)] = "local"
    token: Annotated[str, BeforeValidator(_validate_token)] = Field(default="", repr=False)
    public_url: OptionalUrl = ""
    master_url: OptionalUrl = ""
    slave_urls: list[RequiredUrl] = Field(default_factory=list)
    # Older tokens still accepted on node routes while a new `token` rolls out; never sent.
    previous_tokens: list[Annotated[str, BeforeValidator(_validate_token)]] = Field(
        default_factory=list, repr=False
    )
    # What this node trusts for https:// node URLs (None: the system's store), and the
    # certificate it shows them.
    tls_ca_file: OptionalFile = None
    tls_client_cert_file: OptionalFile = None
    tls_client_key_file: OptionalFile = None
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
    """How long a plan waits for a node's runtime status: a plan sits on an owner's request
    path, so a slower node is left out of plans. Its lent work stays unless a question of
    `health_timeout` goes unanswered too (a slow answer is not a "no")."""
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
    lending_event_poll: Annotated[EventPoll, choice(EventPoll)] = "all"
    """`all`: an owner's event polls every node. `linked` (for large clusters): only the owner,
    its helpers and the owners linked to those helpers' nodes; the others keep the status the
    last round saw. The tick and a due probe still poll every node."""

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
    startup_model: Annotated[str, BeforeValidator(require_str)] = ""
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
        text = require_str(value).strip()
        return str(resolve_path(text, base_dir_of(info))) if text else ""


BackendMode = Literal["kobold", "llama_sdcpp", "vllm", "sim"]


def _validate_listen_host(value: Any) -> str:
    text = require_str(value).strip()
    if not text or any(ch.isspace() for ch in text):
        raise ValueError("must be a host name or IP address")
    return text


class BackendConfig(_Section):
    mode: Annotated[BackendMode, choice(BackendMode)] = "kobold"
    load_timeout: PositiveDuration = _yaml_default("10m")
    request_timeout: PositiveDuration = _yaml_default("30m")
    host: Annotated[str, BeforeValidator(_validate_listen_host)] = "127.0.0.1"


class FamilyConfig(_Section):
    """One backend family (``llama``, ``sdcpp``, ``whispercpp``, ``kobold``, ``vllm``)."""

    binary_path: Annotated[str, BeforeValidator(require_str)] = ""
    backend_url: OptionalUrl = ""
    extra_args: list[CommandArg] = Field(default_factory=list)


class DatabaseConfig(_Section):
    url: Annotated[str, BeforeValidator(validate_database_url)] = Field(default="", repr=False)


class AnalyticsConfig(_Section):
    enabled: StrictBool = True
    retention: PositiveDuration = _yaml_default("720h")


LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
BACKEND_LOG_MAX_BYTES_LIMIT = 1 << 40


class LoggingConfig(_Section):
    # json: one object per line (python-json-logger), for log shippers.
    format: Annotated[LogFormat, choice(LogFormat)] = "text"
    level: Annotated[LogLevel, choice(LogLevel)] = "INFO"
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


def cross_problems(
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
    return problems + tls_problems(server, auth, cluster)


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
        problems = cross_problems(self.server, self.auth, self.security, self.cluster)
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
                return check_database_url(from_env, None)
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
