"""Danube's ``wal_cloud`` section, key for key as its docs give them: the WAL (``wal``), the
uploader (``uploader``), object storage (``cloud``: one model per OpenDAL backend, chosen by
``backend``) and the metadata store (``metadata``: etcd). Units are in the key names (``_ms``,
``_bytes``, ``_mb``). The rest of ``danube.yml`` is :mod:`danube.config.model`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, model_validator

from danube.config.section import Credentials, MiB, Section

# --- wal_cloud.wal -------------------------------------------------------------------


class FileSyncConfig(Section):
    """When the WAL writer flushes: Danube's periodic cadence and the group-commit size."""

    interval_ms: Annotated[int, Field(ge=1, le=3_600_000)] = 5000
    max_batch_bytes: Annotated[int, Field(ge=4096, le=1024 * MiB)] = 10 * MiB
    # An append that finds the WAL's writer idle is written and synced by the event loop
    # itself, sparing two thread wake-ups (docs/wal.md, "A lone append on the loop").
    inline_lone_appends: bool = True


class RotationConfig(Section):
    """When a WAL segment is sealed and a new one started (whichever comes first)."""

    max_bytes: Annotated[int, Field(ge=4096)] = 512 * MiB
    max_hours: Annotated[int, Field(ge=1)] | None = None


class WalRetentionConfig(Section):
    """How long uploaded WAL segments stay on local disk."""

    time_minutes: Annotated[int, Field(ge=1)] = 2880
    size_mb: Annotated[int, Field(ge=1)] = 20480
    check_interval_minutes: Annotated[int, Field(ge=1)] = 5


class WalConfig(Section):
    """The local write-ahead log of each topic partition."""

    dir: Path = Path("./danube-data/wal")
    file_name: str = Field(default="wal.log", min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    cache_capacity: Annotated[int, Field(ge=0, le=10_000_000)] = 1024
    file_sync: FileSyncConfig = FileSyncConfig()
    rotation: RotationConfig = RotationConfig()
    retention: WalRetentionConfig = WalRetentionConfig()


# --- wal_cloud.uploader --------------------------------------------------------------


class UploaderConfig(Section):
    """How WAL frames move to object storage: cadence and object size cap."""

    enabled: bool = True
    interval_seconds: Annotated[int, Field(ge=1, le=86_400)] = 300
    root_prefix: str = "/danube-data"
    max_object_mb: Annotated[int, Field(ge=1, le=5 * 1024 * 1024)] = 1024


# --- wal_cloud.cloud: one model per OpenDAL backend, chosen by `backend` --------------


class S3Cloud(Section):
    """Amazon S3 or an S3-compatible server (MinIO); credentials fall back to the AWS chain."""

    backend: Literal["s3"]
    root: str  # "s3://bucket/prefix" or "bucket/prefix"
    region: str = "us-east-1"
    endpoint: str | None = None
    access_key: str | None = None
    secret_key: SecretStr | None = None
    profile: str | None = None
    role_arn: str | None = None
    session_token: SecretStr | None = None
    anonymous: bool = False
    virtual_host_style: bool = False


class GcsCloud(Section):
    """Google Cloud Storage; credentials inline (JSON), from a file, or the default chain."""

    backend: Literal["gcs"]
    root: str  # "gcs://bucket/prefix" or "bucket/prefix"
    project: str | None = None
    credentials_json: SecretStr | None = None
    credentials_path: str | None = None
    endpoint: str | None = None


class AzblobCloud(Section):
    """Azure Blob Storage (or Azurite)."""

    backend: Literal["azblob"]
    root: str  # "container/prefix"
    endpoint: str
    account_name: str | None = None
    account_key: SecretStr | None = None


class FsCloud(Section):
    """A local directory: the default, for one machine and tests."""

    backend: Literal["fs"]
    root: str = "./danube-data/objects"


class MemoryCloud(Section):
    """In-process memory: lost on exit; for tests only."""

    backend: Literal["memory"]
    root: str = "danube"


CloudConfig = Annotated[
    S3Cloud | GcsCloud | AzblobCloud | FsCloud | MemoryCloud, Field(discriminator="backend")
]


ETCD_ENDPOINTS_MAX = 16
_HOST_PORT = r"[^\s:/,]+:\d{1,5}"
ETCD_ENDPOINT_LIST_PATTERN = rf"^{_HOST_PORT}(\s*,\s*{_HOST_PORT})*$"
EtcdEndpoint = Annotated[str, Field(pattern=rf"^{_HOST_PORT}$")]


class MetadataConfig(Credentials):
    """Where the metadata store (etcd) is, and how to log in to it.

    ``user`` with ``password``/``password_file``: etcd authentication (docs/security.md).
    ``ca_file``: talk TLS, checking etcd's certificate against this CA; ``cert_file`` and
    ``key_file`` add a client certificate (etcd's ``--client-cert-auth``)."""

    # The members of the etcd cluster, tried in this order (danube.meta.client fails over
    # between them). Danube's own key, ``etcd_endpoint``, is accepted too: one ``host:port``
    # or several separated by commas (handy in one environment variable); set one or the
    # other. Read ``etcd_endpoints``: it holds the members whichever key named them.
    etcd_endpoints: list[EtcdEndpoint] = Field(
        default_factory=lambda: ["127.0.0.1:2379"], min_length=1, max_length=ETCD_ENDPOINTS_MAX
    )
    etcd_endpoint: str | None = Field(default=None, pattern=ETCD_ENDPOINT_LIST_PATTERN)
    in_memory: bool = False  # accepted for Danube compatibility; the mesh always uses etcd
    prefix: str = Field(default="/danube", pattern=r"^/[A-Za-z0-9_/-]*[A-Za-z0-9_-]$")
    request_timeout_s: Annotated[float, Field(gt=0, le=60)] = 5.0
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @model_validator(mode="after")
    def _one_endpoint_key(self) -> MetadataConfig:
        if self.etcd_endpoint is None:
            return self
        members = [part.strip() for part in self.etcd_endpoint.split(",")]
        if "etcd_endpoints" in self.model_fields_set and self.etcd_endpoints != members:
            raise ValueError(
                "set etcd_endpoints or etcd_endpoint (Danube's key), not both: "
                f"{self.etcd_endpoints} vs {self.etcd_endpoint!r}"
            )
        if len(members) > ETCD_ENDPOINTS_MAX:
            raise ValueError(f"etcd_endpoint: at most {ETCD_ENDPOINTS_MAX} members")
        # The model is frozen; this is its own validator settling its one derived field.
        object.__setattr__(self, "etcd_endpoints", members)
        return self

    @model_validator(mode="after")
    def _tls_files_together(self) -> MetadataConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.cert_file is not None and self.ca_file is None:
            raise ValueError("a client certificate (cert_file) needs ca_file: TLS")
        return self


class WalCloudConfig(Section):
    """Danube's ``wal_cloud`` section, key for key."""

    wal: WalConfig = WalConfig()
    uploader: UploaderConfig = UploaderConfig()
    cloud: CloudConfig = FsCloud(backend="fs")
    metadata: MetadataConfig = MetadataConfig()
