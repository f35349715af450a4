"""Typed settings for every mesh process: one YAML file plus ``DANUBE_*`` overrides.

Public surface::

    load_settings(path=None, *, environ=None) -> DanubeSettings
    DanubeSettings                  the whole configuration (frozen)
    ConfigError, ConfigProblem      what a bad configuration raises
    WalCloudConfig, BusConfig, ...  the sections (see danube.config.model, danube.config.wal_cloud)

See docs/configuration.md for every key, its unit and default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from danube.lazy import LazyNames

if TYPE_CHECKING:
    from danube.config.errors import ConfigError, ConfigProblem
    from danube.config.loader import load_settings
    from danube.config.model import (
        BusConfig,
        CloudReaderConfig,
        DiscoveryConfig,
        DispatcherConfig,
        IngestConfig,
        MetricsConfig,
        RetentionServiceConfig,
        SecurityConfig,
        ServiceConfig,
        TlsConfig,
        UploaderServiceConfig,
    )
    from danube.config.settings import (
        CLIENT_VARIABLES,
        CONFIG_PATH_ENV,
        ENV_PREFIX,
        PROCESS_VARIABLES,
        DanubeSettings,
    )
    from danube.config.wal_cloud import (
        AzblobCloud,
        CloudConfig,
        FileSyncConfig,
        FsCloud,
        GcsCloud,
        MemoryCloud,
        MetadataConfig,
        RotationConfig,
        S3Cloud,
        UploaderConfig,
        WalCloudConfig,
        WalConfig,
        WalRetentionConfig,
    )

# Each public name and the module that defines it, imported on first use: importing one
# module of the package (danube.config.model, whose names danube.meta.records uses) loads
# that module, not the settings loader.
_HOMES = {
    "ConfigError": "danube.config.errors",
    "ConfigProblem": "danube.config.errors",
    "load_settings": "danube.config.loader",
    "BusConfig": "danube.config.model",
    "CloudReaderConfig": "danube.config.model",
    "DiscoveryConfig": "danube.config.model",
    "DispatcherConfig": "danube.config.model",
    "IngestConfig": "danube.config.model",
    "MetricsConfig": "danube.config.model",
    "RetentionServiceConfig": "danube.config.model",
    "SecurityConfig": "danube.config.model",
    "ServiceConfig": "danube.config.model",
    "TlsConfig": "danube.config.model",
    "UploaderServiceConfig": "danube.config.model",
    "CLIENT_VARIABLES": "danube.config.settings",
    "CONFIG_PATH_ENV": "danube.config.settings",
    "ENV_PREFIX": "danube.config.settings",
    "PROCESS_VARIABLES": "danube.config.settings",
    "DanubeSettings": "danube.config.settings",
    "AzblobCloud": "danube.config.wal_cloud",
    "CloudConfig": "danube.config.wal_cloud",
    "FileSyncConfig": "danube.config.wal_cloud",
    "FsCloud": "danube.config.wal_cloud",
    "GcsCloud": "danube.config.wal_cloud",
    "MemoryCloud": "danube.config.wal_cloud",
    "MetadataConfig": "danube.config.wal_cloud",
    "RotationConfig": "danube.config.wal_cloud",
    "S3Cloud": "danube.config.wal_cloud",
    "UploaderConfig": "danube.config.wal_cloud",
    "WalCloudConfig": "danube.config.wal_cloud",
    "WalConfig": "danube.config.wal_cloud",
    "WalRetentionConfig": "danube.config.wal_cloud",
}


_LAZY = LazyNames(__name__, globals(), _HOMES)


def __getattr__(name: str) -> Any:
    return _LAZY.load(name)


def __dir__() -> list[str]:
    return _LAZY.names()


__all__ = [
    "CLIENT_VARIABLES",
    "CONFIG_PATH_ENV",
    "ENV_PREFIX",
    "PROCESS_VARIABLES",
    "AzblobCloud",
    "BusConfig",
    "CloudConfig",
    "CloudReaderConfig",
    "ConfigError",
    "ConfigProblem",
    "DanubeSettings",
    "DiscoveryConfig",
    "DispatcherConfig",
    "FileSyncConfig",
    "FsCloud",
    "GcsCloud",
    "IngestConfig",
    "MemoryCloud",
    "MetadataConfig",
    "MetricsConfig",
    "RetentionServiceConfig",
    "RotationConfig",
    "S3Cloud",
    "SecurityConfig",
    "ServiceConfig",
    "TlsConfig",
    "UploaderConfig",
    "UploaderServiceConfig",
    "WalCloudConfig",
    "WalConfig",
    "WalRetentionConfig",
    "load_settings",
]
