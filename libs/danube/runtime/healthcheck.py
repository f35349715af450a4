"""The health file a service writes, and the container healthcheck that reads it.

A container's healthcheck runs inside the container, but cannot always know the port to
probe: with ``metrics_port: 0`` (any free port, which replicas sharing the host's network
need) only the service knows it. So a service whose environment names a file in
``$DANUBE_HEALTH_FILE`` writes there, once its endpoint listens, one JSON object::

    {"node_id": "dispatcher-1", "url": "http://127.0.0.1:40123/readyz"}

and ``python -m danube.runtime.healthcheck`` (the image's healthcheck) probes that URL:
exit 0 on a 2xx answer, 1 otherwise (no file yet, no answer, 503). Standard library only:
it runs every few seconds in every container.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

HEALTH_FILE_ENV = "DANUBE_HEALTH_FILE"
PROBE_TIMEOUT_S = 3.0
# A health file is a few dozen bytes; anything bigger is not ours.
_FILE_BYTES_MAX = 4096
_ANY_ADDRESS = frozenset({"", "0.0.0.0", "::"})


def probe_url(host: str, port: int, path: str = "/readyz", *, tls: bool = False) -> str:
    """The URL that reaches a server bound to ``host:port`` from the same machine
    (``https://`` when it serves TLS)."""
    if host in _ANY_ADDRESS:
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}{path}"


def write_health_file(node_id: str, url: str, *, path: Path | None = None) -> Path | None:
    """Write the health file named by ``$DANUBE_HEALTH_FILE`` (or ``path``) atomically;
    ``None`` when neither names one."""
    if path is None:
        named = os.environ.get(HEALTH_FILE_ENV, "")
        if not named:
            return None
        path = Path(named)
    body = json.dumps({"node_id": node_id, "url": url}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Rename over the old file: a healthcheck never reads half of it.
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def read_health_url(path: Path) -> str:
    """The URL in a health file; ``ValueError`` if it is missing, too big or not ours."""
    try:
        data = path.read_bytes()[: _FILE_BYTES_MAX + 1]
    except OSError as exc:
        raise ValueError(f"no health file {path}: {exc.strerror}") from exc
    if len(data) > _FILE_BYTES_MAX:
        raise ValueError(f"health file {path} is over {_FILE_BYTES_MAX} bytes")
    try:
        url = json.loads(data)["url"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"health file {path} is not a health file: {exc}") from exc
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"health file {path}: bad url {url!r}")
    return url


def probe_context() -> ssl.SSLContext:
    """The TLS context of a readiness probe of this machine: no certificate checked."""
    # The probe asks a process on this machine whether it is ready, sends nothing secret
    # and trusts nothing it answers beyond the status: who holds the certificate does not
    # matter (the health file names 127.0.0.1, which the certificate need not list).
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def check(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """``None`` when ``url`` answers 2xx, else what went wrong. An ``https://`` URL is
    probed without checking the server's certificate (a readiness probe of this machine;
    a listener that requires client certificates cannot be probed this way)."""
    context = probe_context() if url.startswith("https://") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{url}: {exc}"
    return None if 200 <= status < 300 else f"{url}: status {status}"


def main(argv: list[str] | None = None) -> int:
    """The healthcheck command: probe the health file's URL (or ``--url``)."""
    parser = argparse.ArgumentParser(
        prog="python -m danube.runtime.healthcheck", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--file", type=Path, default=None, help=f"default ${HEALTH_FILE_ENV}")
    parser.add_argument("--url", default=None, help="probe this URL instead of the file's")
    parser.add_argument("--timeout-s", type=float, default=PROBE_TIMEOUT_S)
    args = parser.parse_args(argv)
    url: str | None = args.url
    if url is None:
        path: Path | None = args.file
        if path is None:
            named = os.environ.get(HEALTH_FILE_ENV, "")
            if not named:
                sys.stderr.write(f"unhealthy: neither --url, --file nor ${HEALTH_FILE_ENV}\n")
                return 1
            path = Path(named)
        try:
            url = read_health_url(path)
        except ValueError as exc:
            sys.stderr.write(f"unhealthy: {exc}\n")
            return 1
    problem = check(url, args.timeout_s)
    if problem is not None:
        sys.stderr.write(f"unhealthy: {problem}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
