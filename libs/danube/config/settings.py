"""``DanubeSettings``: every setting of a mesh process, and where each value comes from.

Precedence, lowest to highest: the defaults in :mod:`danube.config.model` (and
:mod:`danube.config.wal_cloud`), the YAML file, then ``DANUBE_<SECTION>__<KEY>``
environment variables. The merge is pydantic-settings' own
(``settings_customise_sources``); this module only supplies two sources: a YAML
source that reads strictly and interpolates ``${VAR}``, and an environment source
that reads a given mapping instead of ``os.environ`` so callers and tests can pass
their own.

Build settings through :func:`danube.config.load_settings`, which turns every
failure into a :class:`~danube.config.errors.ConfigError`. Nothing here reads
the environment or a file at import time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)
from pydantic_settings.sources.utils import parse_env_vars

from danube.config.errors import ConfigError, KeyPath
from danube.config.interpolate import interpolate_document
from danube.config.model import (
    BusConfig,
    CloudReaderConfig,
    DiscoveryConfig,
    DispatcherConfig,
    IngestConfig,
    MetricsConfig,
    RetentionServiceConfig,
    SecurityConfig,
    UploaderServiceConfig,
)
from danube.config.wal_cloud import WalCloudConfig
from danube.config.yamlfile import read_yaml_file

__all__ = [
    "CLIENT_VARIABLES",
    "CONFIG_PATH_ENV",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "PROCESS_VARIABLES",
    "DanubeSettings",
    "InterpolatingYamlSource",
    "LoadRequest",
    "MappingEnvSource",
    "loading",
    "resolve_config_path",
]

ENV_PREFIX = "DANUBE_"
ENV_NESTED_DELIMITER = "__"
# Names the YAML file when no path is given; it is not a setting itself.
CONFIG_PATH_ENV = "DANUBE_CONFIG"
# The other DANUBE_* variables that are not settings: read by a service's process entry
# (danube.runtime.service, .slots, .healthcheck) before or beside the settings.
# DANUBE_LOG_LEVEL: the service's log level (debug, info, warning, error), read once at start
# by the process entry (danube.runtime.service), before any setting is.
PROCESS_VARIABLES = frozenset(
    {
        CONFIG_PATH_ENV,
        "DANUBE_NODE_ID",
        "DANUBE_NODE_SLOTS",
        "DANUBE_HEALTH_FILE",
        "DANUBE_LOG_LEVEL",
    }
)
# The `danube` command's own variables (docs/cli.md): a shell that exports them for the CLI
# may also run `danube up`, whose services must not warn that they match no setting.
CLIENT_VARIABLES = frozenset(
    {
        "DANUBE_SERVICE_ADDR",
        "DANUBE_TOKEN",
        "DANUBE_CA_FILE",
        "DANUBE_CERT_FILE",
        "DANUBE_KEY_FILE",
        "DANUBE_API_KEY",
    }
)


def resolve_config_path(path: Path | None, environ: Mapping[str, str]) -> Path | None:
    """The file to read: ``path`` if given, else ``$DANUBE_CONFIG`` if set, else none."""
    if path is not None:
        return path
    named = environ.get(CONFIG_PATH_ENV, "")
    return Path(named) if named else None


@dataclass
class LoadRequest:
    """What one construction of :class:`DanubeSettings` reads.

    ``key_lines`` is filled by the YAML source so an error can cite the line.
    """

    path: Path | None
    environ: Mapping[str, str]
    key_lines: dict[KeyPath, int] = field(default_factory=dict)


# settings_customise_sources is a classmethod called from BaseSettings.__init__,
# so the per-call path and environment travel in a ContextVar: safe across
# threads and asyncio tasks, unlike patching os.environ or class attributes.
_REQUEST: ContextVar[LoadRequest | None] = ContextVar("danube_config_request", default=None)


@contextmanager
def loading(request: LoadRequest) -> Iterator[None]:
    """Make ``request`` the source of the next ``DanubeSettings()`` built in this context."""
    token = _REQUEST.set(request)
    try:
        yield
    finally:
        _REQUEST.reset(token)


class MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, reading a given mapping.

    ``_load_env_vars`` is the hook pydantic-settings' own dotenv source
    overrides; everything else (prefix, ``__`` nesting, case folding, JSON for
    lists) is the library's unchanged behaviour.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ  # set before super().__init__, which loads the variables
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


class InterpolatingYamlSource(YamlConfigSettingsSource):
    """pydantic-settings' YAML source with a strict reader and ``${VAR}`` interpolation."""

    def __init__(self, settings_cls: type[BaseSettings], request: LoadRequest) -> None:
        if request.path is None:
            raise ValueError("InterpolatingYamlSource needs a path")
        self._request = request
        self._path = request.path
        # The base class silently skips a file that does not exist; a config file
        # someone named but that is missing must stop the process instead.
        if not request.path.is_file():
            what = "is not a file" if request.path.exists() else "not found"
            raise ConfigError(f"config file {what}: {request.path}", source=request.path)
        super().__init__(settings_cls, yaml_file=request.path)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        parsed = read_yaml_file(Path(file_path))
        self._request.key_lines.update(parsed.key_lines)
        data, problems = interpolate_document(parsed.data, self._request.environ, parsed.key_lines)
        if problems:
            raise ConfigError.from_problems(problems, source=self._path)
        _yield_endpoints_to_environment(data, self._request.environ)
        return data


# Two keys name the etcd members (the mesh's list and Danube's single key); they are one
# setting, so a variable setting either replaces what the file says with both.
_ETCD_ENDPOINT_KEYS = ("etcd_endpoints", "etcd_endpoint")
_ETCD_ENDPOINT_VARIABLES = frozenset(
    f"{ENV_PREFIX}WAL_CLOUD{ENV_NESTED_DELIMITER}METADATA{ENV_NESTED_DELIMITER}{key.upper()}"
    for key in _ETCD_ENDPOINT_KEYS
)


def _yield_endpoints_to_environment(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    if not any(name.upper() in _ETCD_ENDPOINT_VARIABLES for name in environ):
        return
    wal_cloud = data.get("wal_cloud") if isinstance(data, dict) else None
    metadata = wal_cloud.get("metadata") if isinstance(wal_cloud, dict) else None
    if isinstance(metadata, dict):
        for key in _ETCD_ENDPOINT_KEYS:
            metadata.pop(key, None)


class DanubeSettings(BaseSettings):
    """The whole configuration: Danube's ``wal_cloud`` keys plus the mesh's sections."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        case_sensitive=False,
        extra="forbid",
        frozen=True,
    )

    cluster_name: str = Field(default="danube", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    wal_cloud: WalCloudConfig = WalCloudConfig()
    bus: BusConfig = BusConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    ingest: IngestConfig = IngestConfig()
    uploader: UploaderServiceConfig = UploaderServiceConfig()
    retention: RetentionServiceConfig = RetentionServiceConfig()
    cloud_reader: CloudReaderConfig = CloudReaderConfig()
    dispatcher: DispatcherConfig = DispatcherConfig()
    metrics: MetricsConfig = MetricsConfig()
    security: SecurityConfig = SecurityConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then the environment, then the YAML file (first wins).

        Built directly (``DanubeSettings()``), the settings read ``os.environ``
        and ``$DANUBE_CONFIG``; :func:`~danube.config.load_settings` passes its own.
        """
        request = _REQUEST.get()
        if request is None:
            request = LoadRequest(path=resolve_config_path(None, os.environ), environ=os.environ)
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            MappingEnvSource(settings_cls, request.environ),
        ]
        if request.path is not None:
            sources.append(InterpolatingYamlSource(settings_cls, request))
        return tuple(sources)
