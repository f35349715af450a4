"""TLS on the mesh's listeners, certificates that follow their files, and the transport
principal of a client certificate (docs/security.md#tls).

For servers, from a :class:`~danube.config.model.TlsConfig`:

- :class:`ServerTls` — the ``ssl.SSLContext`` an asyncio server (uvicorn) listens with.
  Its certificate, key and client CA are re-read when one of their files changes: each new
  handshake checks the files' modification times (at most every
  ``reload_check_interval_s``) and, once they changed, is served from a context built from
  the new files. Connections already open keep the certificate they shook hands with; a
  file that does not load (half written) is logged and the previous context kept.
- :func:`grpc_server_credentials` — the same for grpcio, through its dynamic credentials.

The transport principal: with ``client_auth`` ``optional`` or ``required``, a client
certificate verified against ``client_ca_file`` names its holder — its subject's common
name, else its first subjectAltName (URI, DNS name or e-mail). Read it with:

- :func:`http_tls_principal` (a Starlette ``Request`` or ``WebSocket``) or
  :func:`scope_tls_principal` (an ASGI scope): the listener puts it in the scope under
  :data:`TLS_PRINCIPAL_SCOPE_KEY`, on every request and WebSocket of the connection;
- :func:`grpc_tls_principal` (a gRPC servicer context): from its ``auth_context()``.

Both answer ``None`` on a plain connection or one without a client certificate.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import grpc
from starlette.requests import HTTPConnection

from danube.config.model import TlsConfig
from danube.errors import DanubeError
from danube.security.files import FileStamp, file_stamp

__all__ = [
    "TLS_PRINCIPAL_SCOPE_KEY",
    "FileWatch",
    "ServerTls",
    "TlsError",
    "grpc_server_credentials",
    "grpc_tls_principal",
    "http_tls_principal",
    "principal_of_peercert",
    "scope_tls_principal",
    "with_transport_principal",
]

log = logging.getLogger(__name__)

TLS_PRINCIPAL_SCOPE_KEY = "danube.tls_principal"
"""The ASGI scope key under which a listener puts the client certificate's principal."""

# The subjectAltName types a principal may come from, in the order they are preferred.
_SAN_TYPES = ("URI", "DNS", "email")
# A principal longer than this is not a name anyone configured.
_PRINCIPAL_CHARS_MAX = 1024

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class TlsError(DanubeError):
    """The TLS files of a listener cannot be loaded at start (missing, unreadable, a key
    that does not match its certificate)."""

    code = "tls_error"


class FileWatch:
    """Whether any of some files changed (modification time, size, inode) since the last
    time it said so; looks at most every ``interval_s``. Thread-safe: grpcio asks from
    its own threads."""

    def __init__(
        self,
        paths: list[Path],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = paths
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen = self._stamp()
        self._next_check = clock() + interval_s

    def _stamp(self) -> tuple[FileStamp | None, ...]:
        # None: vanished while being replaced, a change too.
        return tuple(file_stamp(path) for path in self.paths)

    def changed(self) -> bool:
        """True once per change of the files (the first check after it)."""
        now = self._clock()
        with self._lock:
            if now < self._next_check:
                return False
            self._next_check = now + self.interval_s
            stamp = self._stamp()
            if stamp == self._seen:
                return False
            self._seen = stamp
            return True


def _files(config: TlsConfig) -> list[Path]:
    assert config.cert_file is not None
    assert config.key_file is not None
    paths = [config.cert_file, config.key_file]
    if config.client_ca_file is not None:
        paths.append(config.client_ca_file)
    return paths


_VERIFY_MODES = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def _server_context(config: TlsConfig) -> ssl.SSLContext:
    """A server context from the files of ``config``; :class:`TlsError` if they do not load."""
    assert config.cert_file is not None
    assert config.key_file is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.cert_file, config.key_file)
        if config.client_ca_file is not None:
            context.load_verify_locations(cafile=config.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(
            f"cannot load TLS files {config.cert_file}, {config.key_file}"
            f"{', ' + str(config.client_ca_file) if config.client_ca_file else ''}: {exc}"
        ) from exc
    context.verify_mode = _VERIFY_MODES[config.client_auth]
    return context


class ServerTls:
    """The server side of TLS for one listener (see the module's docstring). Pass
    :attr:`context` to the server; it stays the same object across reloads."""

    def __init__(self, config: TlsConfig) -> None:
        if not config.enabled:
            raise ValueError("TLS is not configured (no cert_file)")
        self.config = config
        self.context = _server_context(config)
        self._current = self.context
        self._watch = FileWatch(_files(config), config.reload_check_interval_s)
        self.reloads = 0
        # Called at the start of every handshake, with or without a server name sent.
        self.context.sni_callback = self._on_hello

    def _on_hello(self, conn: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        self.maybe_reload()
        if self._current is not self.context:
            conn.context = self._current

    def maybe_reload(self) -> bool:
        """Load the files again if they changed; whether a new context is in use."""
        if not self._watch.changed():
            return False
        try:
            context = _server_context(self.config)
        except TlsError as exc:
            log.warning("TLS files changed but do not load; keeping the previous ones: %s", exc)
            return False
        self._current = context
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.config.cert_file)
        return True


def grpc_server_credentials(config: TlsConfig) -> grpc.ServerCredentials:
    """grpcio server credentials from ``config``'s files, re-read when they change (grpcio
    asks before each handshake). grpcio requests a client certificate only when it requires
    one: under ``client_auth: optional`` gRPC clients are not asked for theirs."""
    watch = FileWatch(_files(config), config.reload_check_interval_s)

    def load() -> Any:
        assert config.cert_file is not None
        assert config.key_file is not None
        try:
            chain = config.cert_file.read_bytes()
            key = config.key_file.read_bytes()
            roots = config.client_ca_file.read_bytes() if config.client_ca_file else None
        except OSError as exc:
            raise TlsError(f"cannot read TLS files: {exc}") from exc
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=roots)

    # Check the files the way the HTTP side does, so a start with broken ones fails here.
    _server_context(config)
    initial = load()

    def fetch() -> Any:
        if not watch.changed():
            return None  # keep the current one
        try:
            _server_context(config)  # a pair that does not match is refused here, not by gRPC
            fresh = load()
        except TlsError as exc:
            log.warning("TLS files changed but do not load; gRPC keeps the previous ones: %s", exc)
            return None
        log.info("gRPC TLS certificate reloaded from %s", config.cert_file)
        return fresh

    return grpc.dynamic_ssl_server_credentials(
        initial, fetch, require_client_authentication=config.client_auth == "required"
    )


# --- the transport principal --------------------------------------------------------------


def principal_of_peercert(peercert: Mapping[str, Any] | None) -> str | None:
    """The principal a verified peer certificate (``SSLObject.getpeercert()``) names: its
    subject's common name, else its first URI, DNS or e-mail subjectAltName."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)[:_PRINCIPAL_CHARS_MAX]
    alt = peercert.get("subjectAltName", ())
    for kind in _SAN_TYPES:
        for key, value in alt:
            if key == kind and value:
                return str(value)[:_PRINCIPAL_CHARS_MAX]
    return None


def with_transport_principal(app: Asgi, transport: Any) -> Asgi:
    """``app`` for the requests of one connection: each scope gets the principal of the
    connection's verified client certificate under :data:`TLS_PRINCIPAL_SCOPE_KEY` (``None``
    without one). ``app`` itself on a plain connection."""
    if transport.get_extra_info("sslcontext") is None:
        return app
    # The handshake is over when a protocol is told of its connection; only a certificate
    # the CA verified is reported (an unverified one is not kept by the ssl module).
    principal = principal_of_peercert(transport.get_extra_info("peercert"))

    async def connection_app(scope: Scope, receive: Receive, send: Send) -> None:
        scope[TLS_PRINCIPAL_SCOPE_KEY] = principal
        await app(scope, receive, send)

    return connection_app


def scope_tls_principal(scope: Mapping[str, Any]) -> str | None:
    """The transport principal of the request with this ASGI scope; None without one."""
    value = scope.get(TLS_PRINCIPAL_SCOPE_KEY)
    return value if isinstance(value, str) else None


def http_tls_principal(conn: HTTPConnection) -> str | None:
    """The transport principal of a Starlette/FastAPI ``Request`` or ``WebSocket``."""
    return scope_tls_principal(conn.scope)


def grpc_tls_principal(context: Any) -> str | None:
    """The transport principal of a gRPC call (its servicer ``context``): the verified
    client certificate's common name, else its first subjectAltName; None without one."""
    auth = context.auth_context() or {}
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        values = auth.get(key) or []
        for value in values:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if text:
                return text[:_PRINCIPAL_CHARS_MAX]
    return None
