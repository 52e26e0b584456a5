"""Loading the config: which file, the environment's overrides, and every section
validated with each problem reported at its key and file line.

Loading is two-staged: the YAML node tree is walked to plain Python values while the
line of every key is remembered, then each section is validated by a pydantic model and
the rules that span keys or sections run over the validated sections. Collecting all
section errors before raising lets one start attempt report every mistake at once.
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)
from pydantic_core import ErrorDetails

from routerproject.config.errors import ConfigError, combine
from routerproject.config.schema import (
    ENV_DATABASE_URL,
    SECTION_MODELS,
    RouterConfig,
    cross_problems,
)
from routerproject.config.values import CTX_BASE_DIR, CTX_FROM_YAML, check_database_url, type_name
from routerproject.config.yamlfile import parse_yaml, read_config_text

ENV_CONFIG_PATH = "ROUTER_CONFIG"
ENV_CLUSTER_TOKEN = "ROUTER_CLUSTER_TOKEN"
ENV_CLUSTER_TOKEN_FILE = "ROUTER_CLUSTER_TOKEN_FILE"

DEFAULT_CONFIG_FILENAME = "config.yaml"
REPO_DIR = Path(__file__).resolve().parents[2]
BUILTIN_MODELS_CONFIG_DIR = REPO_DIR / "demo" / "kcpps"
# A token file holds one short secret; refusing big files avoids reading a wrong path
# (a log, an image) into memory and into an error message.
TOKEN_FILE_MAX_BYTES = 64 * 1024


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
        return f"must be a string (got {type_name(value)})"
    if kind == "int_type":
        return f"must be a whole number (got {type_name(value)})"
    if kind == "bool_type":
        return f"must be true or false (got {type_name(value)})"
    if kind == "list_type":
        return f"must be a list (got {type_name(value)})"
    if kind in ("model_type", "dict_type"):
        return f"must be a mapping of keys (got {type_name(value)})"
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

    context = {CTX_FROM_YAML: path is not None, CTX_BASE_DIR: base_dir}
    sections: dict[str, Any] = {}
    for name, model in SECTION_MODELS.items():
        data = raw.get(name, {})
        if not isinstance(data, dict):
            add(name, f"must be a mapping of keys (got {type_name(data)})")
            continue
        try:
            sections[name] = model.model_validate(data, context=context)
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                add(_key_from_loc(name, error["loc"]), _message_for(error, model))

    for key, message in cross_problems(
        sections.get("server"),
        sections.get("auth"),
        sections.get("security"),
        sections.get("cluster"),
    ):
        add(key, message)

    env_database_url = env.get(ENV_DATABASE_URL, "").strip()
    if env_database_url:
        try:
            check_database_url(env_database_url, None)
        except ValueError as exc:
            problems.append(ConfigError(str(exc), key=ENV_DATABASE_URL))

    if problems:
        raise combine(problems)
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
        raw, lines = parse_yaml(read_config_text(path), path)
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
