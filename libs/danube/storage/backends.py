"""From a ``wal_cloud.cloud`` section to an OpenDAL operator: scheme, options and layers.

:func:`operator_options` is pure (no I/O, no environment) so that every backend's mapping is
unit-tested; :func:`open_operator` builds the operator from it. docs/storage.md has the table of
config keys and the OpenDAL options they become.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re

import opendal
from pydantic import SecretStr

from danube.config.wal_cloud import (
    AzblobCloud,
    CloudConfig,
    FsCloud,
    GcsCloud,
    MemoryCloud,
    S3Cloud,
)
from danube.storage.errors import StorageConfigError

PARTIAL_DIR = ".partial"
"""Inside an fs root: where OpenDAL writes an object before renaming it into place."""

# OpenDAL's own retries of temporary errors (5xx, throttling, connection resets), with jitter.
# Every call of ObjectStore also has an overall deadline, which bounds these retries in time.
RETRY_MAX_TIMES = 3
RETRY_MIN_DELAY_S = 0.1
RETRY_MAX_DELAY_S = 2.0

_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TRUE = "true"


def operator_options(cloud: CloudConfig) -> tuple[str, dict[str, str]]:
    """The OpenDAL scheme and service options for a cloud section.

    Raises :class:`StorageConfigError` for a value OpenDAL could not use (a root without a
    bucket, half a key pair, credentials that are not JSON...).
    """
    if isinstance(cloud, S3Cloud):
        return "s3", _s3_options(cloud)
    if isinstance(cloud, GcsCloud):
        return "gcs", _gcs_options(cloud)
    if isinstance(cloud, AzblobCloud):
        return "azblob", _azblob_options(cloud)
    if isinstance(cloud, FsCloud):
        return "fs", _fs_options(cloud)
    if isinstance(cloud, MemoryCloud):
        return "memory", {"root": "/" + _clean_prefix(cloud.root, "root")}
    raise StorageConfigError("backend", f"unknown backend {type(cloud).__name__}")


def open_operator(cloud: CloudConfig) -> opendal.AsyncOperator:
    """An OpenDAL operator for the section, with jittered retries of temporary errors.

    Building it does no I/O: a wrong credential or an unreachable endpoint shows on first use.
    """
    scheme, options = operator_options(cloud)
    try:
        operator = opendal.AsyncOperator(scheme, **options)
    except Exception as exc:  # OpenDAL's errors share no base class but Exception
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StorageConfigError(
            "backend", f"OpenDAL refused the {scheme} config: {reason}"
        ) from exc
    retry = opendal.layers.RetryLayer(
        max_times=RETRY_MAX_TIMES,
        jitter=True,
        min_delay=RETRY_MIN_DELAY_S,
        max_delay=RETRY_MAX_DELAY_S,
    )
    return operator.layer(retry)


def split_root(root: str, schemes: tuple[str, ...], field: str = "root") -> tuple[str, str]:
    """``"s3://bucket/a/b"`` or ``"bucket/a/b"`` → ``("bucket", "/a/b")``; ``"/"`` for no prefix."""
    rest = root.strip()
    for scheme in schemes:
        if rest.startswith(f"{scheme}://"):
            rest = rest[len(scheme) + 3 :]
            break
    else:
        if "://" in rest:
            allowed = ", ".join(f"{s}://" for s in schemes)
            raise StorageConfigError(field, f"{root!r}: expected {allowed} or no scheme")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise StorageConfigError(field, f"{root!r}: {bucket!r} is not a bucket or container name")
    return bucket, "/" + _clean_prefix(prefix, field)


def _s3_options(cloud: S3Cloud) -> dict[str, str]:
    bucket, root = split_root(cloud.root, ("s3",))
    options = {"bucket": bucket, "root": root, "region": cloud.region}
    secret = _secret(cloud.secret_key)
    if (cloud.access_key is None) != (secret is None):
        raise StorageConfigError("secret_key", "access_key and secret_key go together")
    static_keys = cloud.access_key is not None
    if cloud.anonymous and (static_keys or cloud.profile or cloud.role_arn):
        raise StorageConfigError("anonymous", "anonymous access takes no credentials")
    _put(options, "endpoint", cloud.endpoint)
    _put(options, "access_key_id", cloud.access_key)
    _put(options, "secret_access_key", secret)
    _put(options, "session_token", _secret(cloud.session_token))
    _put(options, "profile", cloud.profile)
    _put(options, "role_arn", cloud.role_arn)
    if cloud.anonymous:
        # skip_signature, not allow_anonymous: OpenDAL deprecated the latter, and it would still
        # look for credentials in the environment first.
        options["skip_signature"] = _TRUE
    if cloud.virtual_host_style:
        options["enable_virtual_host_style"] = _TRUE
    if cloud.anonymous or (static_keys and not cloud.profile and not cloud.role_arn):
        # The config says everything: keep AWS_* variables and ~/.aws from mixing in (a stray
        # AWS_SESSION_TOKEN would break signing), and never wait on the EC2 metadata service.
        options["disable_config_load"] = _TRUE
        options["disable_ec2_metadata"] = _TRUE
    return options


def _gcs_options(cloud: GcsCloud) -> dict[str, str]:
    # `project` has no OpenDAL option: object calls name the bucket, which is global in GCS.
    bucket, root = split_root(cloud.root, ("gcs", "gs"))
    options = {"bucket": bucket, "root": root}
    _put(options, "endpoint", cloud.endpoint)
    credentials = _secret(cloud.credentials_json)
    if credentials is not None:
        options["credential"] = _gcs_credential(credentials)
    _put(options, "credential_path", cloud.credentials_path)
    return options


def _gcs_credential(credentials: str) -> str:
    """OpenDAL's GCS ``credential`` is the base64 of the service-account JSON.

    Accept the JSON itself (what a secret manager hands out) or its base64, and check either.
    """
    text = credentials.strip()
    if text.startswith("{"):
        raw = text.encode()
    else:
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise StorageConfigError("credentials_json", "neither JSON nor base64") from exc
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise StorageConfigError("credentials_json", "not a JSON credential") from exc
    if not isinstance(parsed, dict):
        raise StorageConfigError("credentials_json", "not a JSON object")
    return base64.b64encode(raw).decode("ascii")


def _azblob_options(cloud: AzblobCloud) -> dict[str, str]:
    container, root = split_root(cloud.root, ("azblob",))
    options = {"container": container, "root": root, "endpoint": cloud.endpoint}
    _put(options, "account_name", cloud.account_name)
    _put(options, "account_key", _secret(cloud.account_key))
    return options


def _fs_options(cloud: FsCloud) -> dict[str, str]:
    if not cloud.root.strip():
        raise StorageConfigError("root", "an fs root is a directory path")
    # Absolute, so that a service's working directory cannot move its data.
    root = os.path.abspath(os.path.expanduser(cloud.root))
    # Without atomic_write_dir OpenDAL creates the target file at once and fills it in place:
    # a crash would leave a partial object under its final name. With it, a write goes to a
    # temporary file that is renamed into place on close. Inside the root, so the rename never
    # crosses filesystems.
    return {"root": root, "atomic_write_dir": os.path.join(root, PARTIAL_DIR)}


def _clean_prefix(prefix: str, field: str) -> str:
    """``"/a/b/"`` → ``"a/b"``; refuses empty, ``.`` and ``..`` segments."""
    cleaned = prefix.strip().strip("/")
    if not cleaned:
        return ""
    for segment in cleaned.split("/"):
        if segment in ("", ".", ".."):
            raise StorageConfigError(field, f"{prefix!r} has an empty, '.' or '..' segment")
    return cleaned


def _secret(value: SecretStr | str | None) -> str | None:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return value


def _put(options: dict[str, str], name: str, value: str | None) -> None:
    if value is not None and value != "":
        options[name] = value
