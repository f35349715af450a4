"""``danube up --secure``: credentials for the mesh's own connections, and servers that ask.

Under one directory (``<data dir>/secure/`` for ``danube up --secure``; any directory for
``danube admin security init``, which compose and Kubernetes deployments use), mode 0700,
every secret 0600, made once and reused:

- ``nats-<kind>.password``: one NATS user per service kind, named after the kind, allowed
  only the subjects of :mod:`danube.bus.permissions`; ``nats.conf`` is nats-server's
  ``authorization`` block built from that table (rewritten at every start);
- ``etcd-root.password`` and ``etcd-mesh.password``: etcd's ``root`` user (kept for setup
  and the operator) and the ``danube-mesh`` user the services log in as, whose role may
  read and write only the metadata prefix (``wal_cloud.metadata.prefix``);
- ``pki/``: a local CA, a server certificate for loopback and the names asked for, and the
  admin's client certificate (:func:`danube.security.pki.ensure_local_pki`);
- ``keys/``: the token signing key; ``admin.token``: a token for ``admin`` (a super-admin),
  the one file issued afresh at every run.

:func:`ensure_secure_files` lays that directory out (idempotently) and is all that
``danube admin security init`` does; :func:`service_environment` is what each service gets
from those files; :func:`prepare_secure_mesh` is the one place ``danube up --secure`` is put
together: what each server gets, each service process's environment, and the banner.
Services receive paths only (``*_PASSWORD_FILE``), never a secret in an environment
variable, a command line or a log line.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aetcd
import aetcd.rpc

from danube.bus.permissions import KIND_PERMISSIONS, nats_authorization
from danube.config import DanubeSettings
from danube.config.secrets import read_password
from danube.meta.client import EtcdClient, EtcdLogin
from danube.meta.errors import MetaError
from danube.meta.txn import prefix_range_end
from danube.security.pki import DEFAULT_HOSTS, LocalPki, ensure_local_pki
from danube.security.tokens import ensure_signing_key, issue_token, write_public_keys

__all__ = [
    "ETCD_MESH_ROLE",
    "ETCD_MESH_USER",
    "ETCD_ROOT_USER",
    "SECURE_DIR_NAME",
    "MeshCredentials",
    "SecureFiles",
    "SecureMesh",
    "enable_etcd_auth",
    "ensure_credentials",
    "ensure_credentials_in",
    "ensure_secure_files",
    "prepare_secure_mesh",
    "service_environment",
    "write_nats_config",
]

log = logging.getLogger(__name__)

SECURE_DIR_NAME = "secure"
ETCD_ROOT_USER = "root"  # etcd requires this name for the user that holds the root role
ETCD_MESH_USER = "danube-mesh"
ETCD_MESH_ROLE = "danube-mesh"
_SECRET_BYTES = 32  # of randomness per password (43 URL-safe characters)
_ETCD_SETUP_TIMEOUT_S = 10.0
ADMIN_PRINCIPAL = "admin"  # the super-admin of a secured one-machine mesh
ADMIN_TOKEN_TTL_S = 7 * 24 * 3600  # issued afresh at every start


@dataclass(frozen=True)
class MeshCredentials:
    """Where the secrets of one secured mesh live (see the module docstring)."""

    dir: Path

    def nats_password_file(self, kind: str) -> Path:
        """The password of service kind ``kind``'s NATS user."""
        return self.dir / f"nats-{kind}.password"

    @property
    def nats_config(self) -> Path:
        """nats-server's configuration file (its ``authorization`` block)."""
        return self.dir / "nats.conf"

    @property
    def etcd_root_password_file(self) -> Path:
        """The password of etcd's ``root`` user."""
        return self.dir / "etcd-root.password"

    @property
    def etcd_mesh_password_file(self) -> Path:
        """The password of the ``danube-mesh`` etcd user every service logs in as."""
        return self.dir / "etcd-mesh.password"

    def etcd_files(self) -> list[Path]:
        """The passwords etcd setup needs (``root``'s and the mesh user's)."""
        return [self.etcd_root_password_file, self.etcd_mesh_password_file]

    def all_files(self) -> list[Path]:
        """Every secret file (what a test greps the logs for)."""
        files = [self.nats_password_file(kind) for kind in KIND_PERMISSIONS]
        return [*files, self.etcd_root_password_file, self.etcd_mesh_password_file]


def _read(path: Path) -> str:
    password = read_password(None, path, key=str(path.name))
    assert password is not None  # a file was named
    return password


def _create_secret(path: Path) -> None:
    """Write a fresh random password to ``path`` (0600) unless it exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_urlsafe(_SECRET_BYTES) + "\n")
        file.flush()
        os.fsync(file.fileno())


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, mode 0600 from the first byte (temp file, rename);
    a file that holds ``text`` already is left alone (a second run changes nothing)."""
    try:
        if path.read_text() == text:
            path.chmod(0o600)
            return
    except (OSError, UnicodeDecodeError):
        pass  # missing or unreadable: written below
    temp = path.with_name(path.name + ".tmp")
    temp.unlink(missing_ok=True)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    temp.replace(path)


def ensure_credentials(data_dir: Path) -> MeshCredentials:
    """The credentials of ``danube up --secure``: :func:`ensure_credentials_in`
    ``data_dir/secure``."""
    return ensure_credentials_in(data_dir / SECURE_DIR_NAME)


def ensure_credentials_in(dir: Path) -> MeshCredentials:
    """The credentials under ``dir``, made (0700 directory, 0600 files) where missing;
    existing ones are kept, so a restarted mesh logs in with what etcd knows."""
    credentials = MeshCredentials(dir)
    credentials.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    credentials.dir.chmod(0o700)  # also when it existed with laxer bits
    for path in credentials.all_files():
        _create_secret(path)
        path.chmod(0o600)
    return credentials


def write_nats_config(credentials: MeshCredentials, *, subject_prefix: str) -> Path:
    """Write nats-server's ``authorization`` block (JSON is valid NATS config) and return
    its path. Addresses and ports stay on nats-server's command line."""
    passwords = {kind: _read(credentials.nats_password_file(kind)) for kind in KIND_PERMISSIONS}
    config = {"authorization": nats_authorization(passwords, subject_prefix=subject_prefix)}
    _write_private(credentials.nats_config, json.dumps(config, indent=2) + "\n")
    return credentials.nats_config


async def enable_etcd_auth(
    endpoint: str | Sequence[str], credentials: MeshCredentials, *, prefix: str, timeout_s: float
) -> None:
    """Make etcd at ``endpoint`` (one member, or several of one cluster, failed over like
    every client: danube.meta.client) ask for credentials: users ``root`` and ``danube-mesh``
    (role ``danube-mesh``: read and write under ``prefix``), then ``auth enable``.

    Idempotent: when auth is on already (a restarted mesh), it logs in as root and makes
    sure the users, role and grant are there, with the passwords of ``credentials``."""
    root_password = _read(credentials.etcd_root_password_file)
    mesh_password = _read(credentials.etcd_mesh_password_file)
    try:
        await _setup_etcd(endpoint, timeout_s, EtcdLogin(), root_password, mesh_password, prefix)
    except MetaError as exc:
        if "user name is empty" not in str(exc):
            raise
        # Auth is on already: the same steps, as root.
        login = EtcdLogin(user=ETCD_ROOT_USER, password=root_password)
        await _setup_etcd(endpoint, timeout_s, login, root_password, mesh_password, prefix)


async def _setup_etcd(
    endpoint: str | Sequence[str],
    timeout_s: float,
    login: EtcdLogin,
    root_password: str,
    mesh_password: str,
    prefix: str,
) -> None:
    etcd = EtcdClient(endpoint, request_timeout_s=timeout_s, login=login)
    rpc = aetcd.rpc
    start = (prefix.rstrip("/") + "/").encode()
    permission = rpc.Permission(
        permType=rpc.Permission.READWRITE, key=start, range_end=prefix_range_end(start)
    )
    # (what, etcd Auth method, request); "already exists" is what a second run hears.
    steps: list[tuple[str, str, object]] = [
        ("root role", "RoleAdd", rpc.AuthRoleAddRequest(name="root")),
        ("root grant", "UserGrantRole", rpc.AuthUserGrantRoleRequest(user="root", role="root")),
        ("mesh role", "RoleAdd", rpc.AuthRoleAddRequest(name=ETCD_MESH_ROLE)),
        (
            "mesh permission",
            "RoleGrantPermission",
            rpc.AuthRoleGrantPermissionRequest(name=ETCD_MESH_ROLE, perm=permission),
        ),
        (
            "mesh grant",
            "UserGrantRole",
            rpc.AuthUserGrantRoleRequest(user=ETCD_MESH_USER, role=ETCD_MESH_ROLE),
        ),
        ("auth enable", "AuthEnable", rpc.AuthEnableRequest()),
    ]
    try:
        await etcd.connect()
        await _upsert_user(etcd, ETCD_ROOT_USER, root_password)
        await _upsert_user(etcd, ETCD_MESH_USER, mesh_password)
        for what, method, request in steps:
            try:
                await etcd.auth(f"auth setup: {what}", method, request)
            except MetaError as exc:
                if "already exists" not in str(exc):
                    raise
        log.info("etcd auth on: user %s may read and write %s", ETCD_MESH_USER, prefix)
    finally:
        await etcd.close()


async def _upsert_user(etcd: EtcdClient, name: str, password: str) -> None:
    rpc = aetcd.rpc
    try:
        await etcd.auth(
            f"auth setup: user {name}",
            "UserAdd",
            rpc.AuthUserAddRequest(name=name, password=password),
        )
    except MetaError as exc:
        if "already exists" not in str(exc):
            raise
        await etcd.auth(
            f"auth setup: password of {name}",
            "UserChangePassword",
            rpc.AuthUserChangePasswordRequest(name=name, password=password),
        )


@dataclass(frozen=True)
class SecureFiles:
    """Everything a secured deployment reads, laid out by :func:`ensure_secure_files`."""

    credentials: MeshCredentials
    nats_config: Path
    pki: LocalPki
    """The local CA, the server certificate of every listener, the admin's client one."""
    keys_dir: Path
    """The token signing keys (discovery's ``security.keys_dir``: it issues tokens)."""
    verify_keys_dir: Path
    """Their public halves only (the ``security.keys_dir`` of the kinds that only verify)."""
    admin_token_file: Path


def ensure_secure_files(
    dir: Path,
    *,
    hosts: Sequence[str] = (),
    subject_prefix: str,
    issuer: str,
    audience: str,
    admin_token_ttl_s: int = ADMIN_TOKEN_TTL_S,
    signing_kid: str | None = None,
) -> SecureFiles:
    """Lay out under ``dir`` what a secured mesh needs (the module docstring lists it):
    what exists and is still usable is kept, what is missing is made, and a fresh admin
    token is issued. ``hosts`` are the names the server certificate covers besides
    loopback's (a compose service name, a Kubernetes Service's DNS names); ``signing_kid``
    names the signing key when one has to be made (a fixed file name, for a manifest that
    lists it)."""
    credentials = ensure_credentials_in(dir)
    nats_config = write_nats_config(credentials, subject_prefix=subject_prefix)
    wanted = list(dict.fromkeys([*DEFAULT_HOSTS, *hosts]))  # in order, once each
    pki = ensure_local_pki(credentials.dir / "pki", hosts=wanted, clients=(ADMIN_PRINCIPAL,))
    keys_dir = credentials.dir / "keys"
    signing = ensure_signing_key(keys_dir, signing_kid)
    verify_keys_dir = credentials.dir / "verify-keys"
    write_public_keys(keys_dir, verify_keys_dir)
    admin_token = issue_token(
        signing, ADMIN_PRINCIPAL, admin_token_ttl_s, issuer=issuer, audience=audience
    )
    token_file = credentials.dir / "admin.token"
    _write_private(token_file, admin_token + "\n")
    return SecureFiles(
        credentials=credentials,
        nats_config=nats_config,
        pki=pki,
        keys_dir=keys_dir,
        verify_keys_dir=verify_keys_dir,
        admin_token_file=token_file,
    )


@dataclass
class SecureMesh:
    """What ``--secure`` adds to a mesh plan (built by :func:`prepare_secure_mesh`)."""

    credentials: MeshCredentials
    nats_config: Path
    pki: LocalPki
    """The local CA, the server certificate of every listener, the admin's client one."""
    admin_token_file: Path
    # Environment of each kind's service processes (service_environment).
    kind_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # Run once etcd first answers, before any service starts.
    etcd_setup: Callable[[], Awaitable[None]] | None = None
    banner: list[str] = field(default_factory=list)

    def env_for(self, kind: str) -> dict[str, str]:
        """The environment service ``kind`` gets from the secured plan."""
        return dict(self.kind_env.get(kind, {}))


# The services with doors clients reach: tokens and RBAC (discovery; ingest's data and gRPC
# doors; the dispatchers' consume doors).
TOKEN_KINDS = frozenset({"discovery", "dispatcher", "ingest"})
# Those of them that issue tokens (API keys exchanged for tokens), so hold the private keys;
# the others get the public halves only (a compromised ingest pod cannot mint a token).
SIGNING_KINDS = frozenset({"discovery"})
# Those that also take a client certificate as a principal (optional).
CLIENT_CERT_KINDS = frozenset({"discovery", "ingest"})


def service_environment(
    files: SecureFiles, kind: str, *, super_admins: Sequence[str] = ()
) -> dict[str, str]:
    """The settings, as ``DANUBE_*`` variables, that service ``kind`` runs with in a mesh
    secured with ``files``: its NATS user and the path of its password, the etcd mesh user
    and the path of its password, its listener's certificate; discovery and ingest (whose
    data and gRPC doors take produce from clients) also the client CA (client certificates
    optional: the subject is a principal); those and the dispatchers (their consume doors)
    tokens and RBAC with ``admin`` among the super-admins, discovery with the signing keys,
    the others with their public halves only. Paths only, never a secret. docker-compose.yml and
    deploy/kubernetes/ set the same (a unit test compares them)."""
    credentials, pki = files.credentials, files.pki
    env = {
        "DANUBE_BUS__USER": kind,
        "DANUBE_BUS__PASSWORD_FILE": str(credentials.nats_password_file(kind)),
        "DANUBE_WAL_CLOUD__METADATA__USER": ETCD_MESH_USER,
        "DANUBE_WAL_CLOUD__METADATA__PASSWORD_FILE": str(credentials.etcd_mesh_password_file),
        f"DANUBE_{kind.upper()}__TLS__CERT_FILE": str(pki.server.cert),
        f"DANUBE_{kind.upper()}__TLS__KEY_FILE": str(pki.server.key),
    }
    if kind in CLIENT_CERT_KINDS:
        env |= {
            f"DANUBE_{kind.upper()}__TLS__CLIENT_CA_FILE": str(pki.ca.cert),
            f"DANUBE_{kind.upper()}__TLS__CLIENT_AUTH": "optional",
        }
    if kind in TOKEN_KINDS:
        env |= {
            "DANUBE_SECURITY__ENABLED": "true",
            "DANUBE_SECURITY__KEYS_DIR": str(
                files.keys_dir if kind in SIGNING_KINDS else files.verify_keys_dir
            ),
            "DANUBE_SECURITY__SUPER_ADMINS": json.dumps(sorted({*super_admins, ADMIN_PRINCIPAL})),
        }
    return env


def prepare_secure_mesh(settings: DanubeSettings, data_dir: Path) -> SecureMesh:
    """Credentials, certificates, server configuration, service environments and banner of
    a secured mesh: the one place ``--secure`` is assembled.

    Inside: a NATS user per service kind and etcd auth. The public side: a local CA whose
    server certificate every listener serves (discovery's HTTP, WebSocket and gRPC APIs and
    each service's health/metrics port), client certificates optional on discovery (mTLS;
    the certificate's subject is the principal), bearer tokens and RBAC on, and an admin
    token (principal ``admin``, a super-admin) with a matching client certificate.
    """
    security = settings.security
    files = ensure_secure_files(
        data_dir / SECURE_DIR_NAME,
        hosts=_hosts(settings.discovery.host),
        subject_prefix=settings.bus.subject_prefix,
        issuer=security.issuer,
        audience=security.audience,
    )
    credentials, pki = files.credentials, files.pki
    metadata = settings.wal_cloud.metadata
    kind_env = {
        kind: service_environment(files, kind, super_admins=security.super_admins)
        for kind in KIND_PERMISSIONS
    }

    async def etcd_setup() -> None:
        await enable_etcd_auth(
            metadata.etcd_endpoints,
            credentials,
            prefix=metadata.prefix,
            timeout_s=max(metadata.request_timeout_s, _ETCD_SETUP_TIMEOUT_S),
        )

    token_file = files.admin_token_file
    banner = [
        "security: ON inside the mesh: NATS user and subject permissions per service kind,",
        f"  etcd auth (user {ETCD_MESH_USER}); credentials in {credentials.dir} (0600)",
        "security: ON at the front doors: TLS on every listener (CA "
        f"{pki.ca.cert}), tokens and RBAC",
        "  admin: export DANUBE_SERVICE_ADDR="
        f"https://{settings.discovery.host}:{settings.discovery.port}",
        f"         export DANUBE_CA_FILE={pki.ca.cert} DANUBE_TOKEN=$(cat {token_file})",
        f"  (or mTLS: --cert-file {pki.clients[ADMIN_PRINCIPAL].cert} "
        f"--key-file {pki.clients[ADMIN_PRINCIPAL].key})",
    ]
    return SecureMesh(
        credentials=credentials,
        nats_config=files.nats_config,
        pki=pki,
        admin_token_file=token_file,
        kind_env=kind_env,
        etcd_setup=etcd_setup,
        banner=banner,
    )


def _hosts(bind: str) -> tuple[str, ...]:
    """The names the server certificate covers: loopback's, and the bound host unless it
    binds every address."""
    extra = () if bind in ("", "0.0.0.0", "::") or bind in DEFAULT_HOSTS else (bind.strip("[]"),)
    return (*DEFAULT_HOSTS, *extra)
