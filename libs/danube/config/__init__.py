"""Typed settings for every mesh process: one YAML file plus ``DANUBE_*`` overrides.

Public surface::

    load_settings(path=None, *, environ=None) -> DanubeSettings
    DanubeSettings                  the whole configuration (frozen)
    ConfigError, ConfigProblem      what a bad configuration raises
    WalCloudConfig, BusConfig, ...  the sections (see danube.config.model)

See docs/configuration.md for every key, its unit and default.
"""

from danube.config.errors import ConfigError, ConfigProblem
from danube.config.loader import load_settings
from danube.config.model import (
    AzblobCloud,
    BusConfig,
    CloudConfig,
    CloudReaderConfig,
    DiscoveryConfig,
    DispatcherConfig,
    FileSyncConfig,
    FsCloud,
    GcsCloud,
    IngestConfig,
    MemoryCloud,
    MetadataConfig,
    MetricsConfig,
    RetentionServiceConfig,
    RotationConfig,
    S3Cloud,
    SecurityConfig,
    ServiceConfig,
    TlsConfig,
    UploaderConfig,
    UploaderServiceConfig,
    WalCloudConfig,
    WalConfig,
    WalRetentionConfig,
)
from danube.config.settings import (
    CLIENT_VARIABLES,
    CONFIG_PATH_ENV,
    ENV_PREFIX,
    PROCESS_VARIABLES,
    DanubeSettings,
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
