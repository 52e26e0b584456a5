"""The router's YAML configuration: schema, validation with file lines, env overrides."""

from routerproject.config.schema import (
    AnalyticsConfig,
    AuthConfig,
    BackendConfig,
    ClusterConfig,
    ConfigError,
    DatabaseConfig,
    FamilyConfig,
    ModelsConfig,
    RouterConfig,
    SecurityConfig,
    ServerConfig,
    config_to_dict,
    load_config,
    resolve_config_path,
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
