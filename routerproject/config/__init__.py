"""The router's YAML configuration, checked with the key and file line of every problem.

`errors` the error; `values` single values; `schema` the sections and the rules across them;
`yamlfile` the file with key lines; `loading` the file, env and validation; `diagnostics` the
redacted dump. Importers take the public names below from here.
"""

from routerproject.config.diagnostics import config_to_dict
from routerproject.config.errors import ConfigError
from routerproject.config.loading import load_config, resolve_config_path
from routerproject.config.schema import (
    AnalyticsConfig,
    AuthConfig,
    BackendConfig,
    ClusterConfig,
    DatabaseConfig,
    FamilyConfig,
    ModelsConfig,
    RouterConfig,
    SecurityConfig,
    ServerConfig,
)

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
