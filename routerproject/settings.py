"""Django settings, built from the node's YAML config (see routerproject/config/).

The config file is chosen by `--config` (manage.py copies it into ROUTER_CONFIG before Django
starts), then ROUTER_CONFIG, then ./config.yaml, then the built-in standalone default.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url

from routerproject.config import load_config, resolve_config_path

BASE_DIR = Path(__file__).resolve().parent.parent

ROUTER = load_config(resolve_config_path(None))
"""The validated node config. Everything node-specific is read from here, never from YAML again."""

ROUTER_VERSION = "0.1.0"

STORE_DIR = Path(ROUTER.cluster.store_dir)
STORE_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY_FILENAME = "secret_key"


def stored_secret_key(path: Path) -> str:
    """The node's secret key from `path`, made there (readable by its owner only) if missing.

    Sessions, CSRF tokens and password resets are signed with it: it must be unguessable, and
    kept across restarts so admin logins survive them. The router and its workers both load
    these settings: the key is written whole to a private file, then linked into place, so
    whichever process comes second reads a complete key instead of making its own.
    """
    if not path.exists():
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(48) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise RuntimeError(f"{path} is empty: delete it and the node makes a new secret key")
    return key


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or stored_secret_key(
    STORE_DIR / SECRET_KEY_FILENAME
)
DEBUG = os.environ.get("ROUTER_DEBUG") == "1"
_BROWSER_HOSTS = ROUTER.server.browser_hosts(ROUTER.cluster.public_url)
# The front door refuses other hosts first (proxy.edge.gate), with the router's envelope; Django's
# own check is the second guard for its views. Django writes IPv6 hosts in brackets.
ALLOWED_HOSTS = (
    ["*"]
    if _BROWSER_HOSTS is None
    else [f"[{host}]" if ":" in host else host for host in _BROWSER_HOSTS]
)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "axes",
    "access",
    "registry",
    "proxy",
    "lending",
    "guardians",
    "analytics",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a lockout into its answer.
    "axes.middleware.AxesMiddleware",
]

# Admin logins are throttled (django-axes): after AXES_FAILURE_LIMIT wrong passwords for one
# user name from one address, that pair is refused (429) for AXES_COOLOFF_TIME. Keyed on the
# pair, so neither a guesser behind a shared address nor one trying many names locks out
# everyone else.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True

ROOT_URLCONF = "routerproject.urls"
ASGI_APPLICATION = "routerproject.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database(url: str) -> dict[str, Any]:
    db: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    if db["ENGINE"] == "django.db.backends.sqlite3":
        # The router process and the django-q2 workers share one SQLite file: WAL lets readers
        # run beside the writer, and the busy timeout turns a short lock into a wait instead of
        # "database is locked". IMMEDIATE transactions take the write lock up front, which is
        # what stops two writers deadlocking on a lock upgrade.
        db["OPTIONS"] = {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        db["TEST"] = {"NAME": str(STORE_DIR / "test_router.sqlite3")}
    return db


DATABASES = {"default": _database(ROUTER.database_url(os.environ))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = STORE_DIR / "static"

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

REST_FRAMEWORK = {
    # The admin key is checked at the ASGI edge (proxy.edge.app), before Django reads the body.
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "routerproject.api.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["routerproject.api_formats.JSONBodyRenderer"],
    "DEFAULT_PARSER_CLASSES": ["routerproject.api_formats.JSONBodyParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "routerproject.api_formats.FirstChoiceNegotiation",
    "DEFAULT_SCHEMA_CLASS": "routerproject.api.RouterAutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Cluster router",
    "DESCRIPTION": (
        "The client inference API (OpenAI, Ollama and Kobold paths, answered with the model ID "
        "the client asked for) and the management API under /router/v1/. The node protocol "
        "under /router/v1/node/ is internal to a cluster and not described."
    ),
    "VERSION": ROUTER_VERSION,
    "OAS_VERSION": "3.1.0",
    "DEFAULT_GENERATOR_CLASS": "routerproject.api.RouterSchemaGenerator",
    # Request bodies get their own components, so only they carry minLength for required text.
    "COMPONENT_SPLIT_REQUEST": True,
    # Enums stay inline where they are used: no generated *Enum components to name or collide.
    "POSTPROCESSING_HOOKS": [],
    "ENUM_GENERATE_CHOICE_DESCRIPTION": False,
    "TAGS": [
        {"name": "Management", "description": "This node's models (admin keys)."},
        {
            "name": "Site",
            "description": "Site route: served by a master or a standalone node; a slave "
            "answers 404, as if the route did not exist. The document is the same on every "
            "role.",
        },
        {"name": "Schema", "description": "This document and Swagger UI for it."},
    ],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
}

WORKER_POLL_SECS = 5.0
WORKER_GUARD_CYCLE_SECS = 2.0
Q_CLUSTER = {
    "name": "router",
    "orm": "default",
    # Two cores per machine: one worker keeps the router's event loop responsive.
    "workers": 1,
    "recycle": 500,
    "timeout": 120,
    "retry": 180,
    "catch_up": False,
    "max_attempts": 1,
    "ack_failures": True,
    "save_limit": 200,
    # Nothing is enqueued, only schedules (the scheduler looks every 30 s whatever these
    # are): a worker process that wakes less often takes less from the router's two cores.
    # Twice a second each, they showed in the router's p99 on a 2-core machine.
    "poll": WORKER_POLL_SECS,
    "guard_cycle": WORKER_GUARD_CYCLE_SECS,
    "label": "Tasks",
    "sync": os.environ.get("ROUTER_Q_SYNC") == "1",
}

_LOG_LEVEL = os.environ.get("ROUTER_LOG_LEVEL", ROUTER.logging.level).upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Every line names the request it was logged for (`-` outside one): see request_ids.py.
    "filters": {"request_id": {"()": "routerproject.request_ids.RequestIdLogFilter"}},
    "formatters": {
        # Client text in a message cannot forge or hide a line: see logsafe.py.
        "text": {
            "()": "routerproject.logsafe.TextFormatter",
            "format": "%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s",
        },
        # Every `extra` field of a record (the access line's request_id, status, ms...)
        # becomes a key of its object; so does the request ID the filter adds to every record.
        "json": {
            "()": "routerproject.logsafe.SafeJsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {
        # stderr, a loop turn's lines in one write: see logstream.py.
        "console": {
            "class": "routerproject.logstream.LoopTurnStreamHandler",
            "formatter": ROUTER.logging.format,
            "filters": ["request_id"],
        }
    },
    "root": {
        "handlers": ["console"],
        "level": _LOG_LEVEL,
    },
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        # uvicorn logs an app's exception as an error, and each WebSocket handshake at INFO.
        "uvicorn": {"level": "WARNING"},
        "django_q": {"level": "WARNING"},
        # httpx logs every call at INFO: the node protocol's polls, status and registration
        # calls between nodes would bury the access and lending lines. Shown at DEBUG.
        "httpx": {"level": "DEBUG" if _LOG_LEVEL == "DEBUG" else "WARNING"},
        "httpcore": {"level": "DEBUG" if _LOG_LEVEL == "DEBUG" else "WARNING"},
    },
}
