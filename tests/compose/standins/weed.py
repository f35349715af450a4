#!/opt/weed/bin/python
"""Stand-in for SeaweedFS's ``weed`` in the compose smoke's local S3 image (not SeaweedFS).

It answers the two ways docker-compose.yml runs the real image, on the same ports:

- ``weed server -dir=... -ip=... -ip.bind=ADDR -s3 -s3.port=8333 -s3.config=FILE``: an S3
  server (moto's, in memory) on ``-s3.port`` with ``GET /healthz`` answering 200 as
  SeaweedFS's S3 gateway does; the same S3 state on the master port (9333), which the shell
  below talks to. The identities file must be SeaweedFS's JSON with at least one access key
  (moto itself checks no signature: the smoke's mesh signs with the compose file's keys).
- ``weed shell -master=HOST:9333``: reads commands from stdin; ``s3.bucket.list`` prints one
  bucket per line, ``s3.bucket.create -name NAME`` creates one.

Anything else exits 2 with a message, so a compose file that starts using more of the real
image fails the smoke instead of passing by accident.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MASTER_PORT = 9333
SHELL_TIMEOUT_S = 10.0

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def flags(args: list[str]) -> dict[str, str]:
    """``-name=value`` and ``-name`` (true) flags, as Go's flag package writes them."""
    parsed: dict[str, str] = {}
    for arg in args:
        if not arg.startswith("-"):
            raise SystemExit(f"weed (stand-in): unexpected argument {arg!r}")
        name, _, value = arg.lstrip("-").partition("=")
        parsed[name] = value or "true"
    return parsed


def with_healthz(app: Wsgi) -> Wsgi:
    """``GET /healthz`` answers 200 (SeaweedFS's S3 gateway has it); the rest goes to S3."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"OK"]
        return app(environ, start_response)

    return wrapped


def check_identities(path: str) -> int:
    """The number of access keys in SeaweedFS's S3 identities file; exits if there are none."""
    doc = json.loads(Path(path).read_text())
    keys = [
        credential["accessKey"]
        for identity in doc["identities"]
        for credential in identity.get("credentials", [])
        if credential.get("accessKey") and credential.get("secretKey")
    ]
    if not keys:
        raise SystemExit(f"weed (stand-in): no access key in {path}")
    return len(keys)


def server(args: list[str]) -> int:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    options = flags(args)
    if options.get("s3") != "true":
        raise SystemExit("weed (stand-in): only `server -s3` is stood in for")
    keys = check_identities(options["s3.config"]) if "s3.config" in options else 0
    bind = options.get("ip.bind", "0.0.0.0")
    app = with_healthz(DomainDispatcherApplication(create_backend_app))
    ports = [int(options.get("s3.port", "8333")), int(options.get("master.port", MASTER_PORT))]
    servers = [
        make_server(bind, port, app, threaded=True, request_handler=MotoRequestHandler)
        for port in ports
    ]
    sys.stderr.write(f"weed (stand-in): S3 on {bind}:{ports[0]}, master {ports[1]}, {keys} keys\n")
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


def _call(method: str, url: str) -> bytes:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=SHELL_TIMEOUT_S) as response:
        body: bytes = response.read()
    return body


def shell(args: list[str]) -> int:
    master = flags(args).get("master", f"localhost:{MASTER_PORT}")
    base = f"http://{master}"
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words == ["s3.bucket.list"]:
            listing = _call("GET", base + "/").decode()
            for name in re.findall(r"<Name>([^<]+)</Name>", listing):
                print(f"  {name}")
        elif words[:2] == ["s3.bucket.create", "-name"] and len(words) == 3:
            _call("PUT", f"{base}/{words[2]}")
            print(f"created bucket {words[2]}")
        else:
            sys.stderr.write(f"weed shell (stand-in): unknown command {line.strip()!r}\n")
            return 2
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("weed (stand-in): server | shell\n")
        return 2
    command, rest = argv[0], argv[1:]
    if command == "server":
        return server(rest)
    if command == "shell":
        try:
            return shell(rest)
        except (urllib.error.URLError, OSError) as exc:
            sys.stderr.write(f"weed shell (stand-in): {exc}\n")
            return 1
    sys.stderr.write(f"weed (stand-in): {command!r} is not stood in for\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
