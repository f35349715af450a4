"""TLS for the SDK's connections to an ``https://`` server: which CA to trust and,
for a server that asks (mTLS), the client certificate to show.

::

    tls = ClientTls(ca_file="ca.pem", cert_file="alice.pem", key_file="alice-key.pem")
    async with AsyncDanubeClient("https://broker:8080", tls=tls) as client: ...

Without ``ca_file`` the system's trust store is used. The same context serves the HTTP
requests and the consumer streams (``wss://``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from danube.client.errors import InvalidArgumentError

__all__ = ["ClientTls"]


@dataclass(frozen=True, slots=True)
class ClientTls:
    """The CA bundle to verify the server with (None: the system's), and an optional client
    certificate chain and key (both or neither), all PEM files."""

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidArgumentError("cert_file and key_file go together: give both or neither")

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that verifies the server's certificate and host name."""
        try:
            context = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file is not None else None
            )
            if self.cert_file is not None and self.key_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidArgumentError(f"cannot load TLS files: {exc}") from exc
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context
