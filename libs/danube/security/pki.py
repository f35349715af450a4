"""A local certificate authority: what `danube up --secure` and the tests serve TLS with.

All cryptography is the ``cryptography`` library's; this module only chooses names,
lifetimes and extensions, and writes PEM files (private keys readable by their owner
only, 0600, written whole or not at all). Keys are ECDSA P-256.

:func:`ensure_local_pki` lays out one directory and is idempotent::

    <dir>/ca.pem  ca-key.pem           the CA (self-signed)
    <dir>/server.pem  server-key.pem   for the given DNS names and IP addresses
    <dir>/clients/<name>.pem  <name>-key.pem   one per client subject (CN=<name>)

Files that exist, parse, were signed by the CA on disk and have more than
:data:`RENEW_BEFORE` left are reused; anything else is issued again (a new CA
re-issues everything under it).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from danube.errors import DanubeError

__all__ = [
    "CA_VALID_DAYS",
    "CERT_VALID_DAYS",
    "RENEW_BEFORE",
    "CertPaths",
    "LocalPki",
    "PkiError",
    "create_ca",
    "ensure_local_pki",
    "issue_client_cert",
    "issue_server_cert",
]

CA_VALID_DAYS = 3650
CERT_VALID_DAYS = 365
# A certificate with less than this left is issued again rather than reused.
RENEW_BEFORE = dt.timedelta(days=30)
# Clocks of the machines a certificate is shown to may lag ours a little.
_BACKDATE = dt.timedelta(minutes=5)
_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


class PkiError(DanubeError):
    """A certificate could not be issued or read (bad name, unreadable file)."""

    code = "pki_error"


@dataclass(frozen=True, slots=True)
class CertPaths:
    """A certificate (PEM chain) and its private key (PEM, mode 0600)."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class LocalPki:
    """What :func:`ensure_local_pki` laid out: the CA, the server's pair, one pair per
    client subject."""

    dir: Path
    ca: CertPaths
    server: CertPaths
    clients: dict[str, CertPaths] = field(default_factory=dict)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` atomically, created with ``mode`` (never wider first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _save(paths: CertPaths, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    pem_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # The key first: a certificate on disk always has its key beside it.
    _write(paths.key, pem_key, 0o600)
    _write(paths.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _load(paths: CertPaths) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
        key = serialization.load_pem_private_key(paths.key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise PkiError(f"cannot read {paths.cert} / {paths.key}: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{paths.key}: not an EC key")
    return cert, key


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def create_ca(
    cert: Path, key: Path, *, common_name: str = "Danube local CA", days: int = CA_VALID_DAYS
) -> CertPaths:
    """A new self-signed CA that may sign end-entity certificates only (path length 0)."""
    private = _new_key()
    public = private.public_key()
    name = _name(common_name)
    certificate = (
        _builder(name, name, public, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(private, hashes.SHA256())
    )
    paths = CertPaths(cert, key)
    _save(paths, certificate, private)
    return paths


def _host_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9*.-]{1,253}", host):
                raise PkiError(f"not a DNS name or IP address: {host!r}") from None
            names.append(x509.DNSName(host.lower()))
    return names


def _issue(
    ca: CertPaths,
    out: CertPaths,
    common_name: str,
    alt_names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    days: int,
) -> CertPaths:
    ca_cert, ca_key = _load(ca)
    private = _new_key()
    public = private.public_key()
    builder = (
        _builder(_name(common_name), ca_cert.subject, public, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    _save(out, builder.sign(ca_key, hashes.SHA256()), private)
    return out


def issue_server_cert(
    ca: CertPaths, out: CertPaths, hosts: Sequence[str], *, days: int = CERT_VALID_DAYS
) -> CertPaths:
    """A server certificate for ``hosts`` (DNS names and IP addresses, all in its
    subjectAltName; the first is its CN), signed by ``ca``."""
    if not hosts:
        raise PkiError("a server certificate needs at least one host")
    return _issue(ca, out, hosts[0], _host_names(hosts), ExtendedKeyUsageOID.SERVER_AUTH, days)


def issue_client_cert(
    ca: CertPaths, out: CertPaths, subject: str, *, days: int = CERT_VALID_DAYS
) -> CertPaths:
    """A client certificate whose subject is ``CN=<subject>`` (the principal a server with
    mTLS sees), signed by ``ca``."""
    if not _NAME.fullmatch(subject):
        raise PkiError(f"client subject must match {_NAME.pattern}, got {subject!r}")
    return _issue(ca, out, subject, [], ExtendedKeyUsageOID.CLIENT_AUTH, days)


def _usable(paths: CertPaths, ca_cert: x509.Certificate | None) -> x509.Certificate | None:
    """The certificate at ``paths`` if it can be reused: readable with its key, matching
    it, issued by ``ca_cert`` (or self-signed when None), far enough from expiry."""
    if not (paths.cert.is_file() and paths.key.is_file()):
        return None
    try:
        cert, key = _load(paths)
    except PkiError:
        return None
    if cert.public_key() != key.public_key():
        return None
    if cert.not_valid_after_utc - RENEW_BEFORE < _now():
        return None
    issuer = ca_cert or cert
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return None
    return cert


def _covers(cert: x509.Certificate, hosts: Sequence[str]) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(_host_names(hosts)) <= set(san)


def ensure_local_pki(
    dir: Path, hosts: Sequence[str] = DEFAULT_HOSTS, clients: Sequence[str] = ()
) -> LocalPki:
    """The CA, a server certificate for ``hosts`` and a client certificate per subject in
    ``clients`` under ``dir``: reused when usable (see the module's docstring), else issued."""
    dir.mkdir(parents=True, exist_ok=True)
    ca = CertPaths(dir / "ca.pem", dir / "ca-key.pem")
    ca_cert = _usable(ca, None)
    if ca_cert is None:
        create_ca(ca.cert, ca.key)
        ca_cert, _ = _load(ca)
    server = CertPaths(dir / "server.pem", dir / "server-key.pem")
    cert = _usable(server, ca_cert)
    if cert is None or not _covers(cert, hosts):
        issue_server_cert(ca, server, hosts)
    issued: dict[str, CertPaths] = {}
    for subject in clients:
        if not _NAME.fullmatch(subject):  # before it becomes a file name
            raise PkiError(f"client subject must match {_NAME.pattern}, got {subject!r}")
        clients_dir = dir / "clients"
        paths = CertPaths(clients_dir / f"{subject}.pem", clients_dir / f"{subject}-key.pem")
        if _usable(paths, ca_cert) is None:
            issue_client_cert(ca, paths, subject)
        issued[subject] = paths
    return LocalPki(dir=dir, ca=ca, server=server, clients=issued)
