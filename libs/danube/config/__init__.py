"""Typed settings for every mesh process: one YAML file plus ``DANUBE_*`` overrides.

Public surface::

    load_settings(path=None, *, environ=None) -> DanubeSettings
    DanubeSettings                  the whole configuration (frozen)
    ConfigError, ConfigProblem      what a bad configuration raises
    WalCloudConfig, BusConfig, ...  the sections (see danube.config.model, danube.config.wal_cloud)

See docs/configuration.md for every key, its unit and default.
"""

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
