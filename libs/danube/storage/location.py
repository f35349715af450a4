"""Where a ``wal_cloud.cloud`` section points, without how to log in there.

:func:`public_settings` is the section a service records in etcd for the cluster (the
``cluster/object_store`` key, docs/metadata.md) so that a reader given only the etcd endpoint
(the Spark backfills) finds the objects: the backend and where in it, never a credential. A
reader brings its credentials itself, from its environment (``DANUBE_WAL_CLOUD__CLOUD__*``
variables, or the backend's own chain: ``AWS_*``, ``~/.aws``, Google's default credentials).

:func:`describe` is the same place in one line, for error messages ("object not found: 'k'
in s3://bucket/root at http://...").
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, SecretStr

from danube.config.wal_cloud import CloudConfig, FsCloud, MemoryCloud

# Keys that say who the reader is rather than where the data is: never recorded. Every
# SecretStr field is left out as well, whatever its name (a later backend's secret is safe
# before anyone adds it here).
CREDENTIAL_KEYS = frozenset(
    {
        "access_key",
        "secret_key",
        "session_token",
        "profile",
        "role_arn",
        "credentials_json",
        "credentials_path",
        "account_key",
    }
)

PublicValue = str | bool


def public_settings(cloud: CloudConfig) -> dict[str, PublicValue]:
    """The section's keys but credentials and unset ones; an fs root made absolute (a
    reader runs in another directory than the service that records it)."""
    found: dict[str, PublicValue] = {}
    for name, value in _fields(cloud):
        if name in CREDENTIAL_KEYS or isinstance(value, SecretStr) or value is None:
            continue
        if not isinstance(value, str | bool):
            raise TypeError(f"wal_cloud.cloud.{name}: {type(value).__name__} is not recorded")
        found[name] = value
    if isinstance(cloud, FsCloud):
        found["root"] = os.path.abspath(os.path.expanduser(cloud.root))
    return found


def describe(cloud: CloudConfig) -> str:
    """One line naming the backend, root and endpoint: ``fs:/srv/danube/objects``,
    ``s3://bucket/prefix at http://127.0.0.1:9000``, ``memory:danube``."""
    public = public_settings(cloud)
    backend, root = str(public["backend"]), str(public.get("root", ""))
    if isinstance(cloud, FsCloud | MemoryCloud):
        where = f"{backend}:{root}"
    else:
        where = root if "://" in root else f"{backend}://{root}"
    endpoint = public.get("endpoint")
    return where if not endpoint else f"{where} at {endpoint}"


def _fields(model: BaseModel) -> list[tuple[str, Any]]:
    return [(name, getattr(model, name)) for name in type(model).model_fields]
