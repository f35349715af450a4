"""What the client commands share: the server option, running a coroutine, and turning the
errors a user can cause into one red line and a non-zero exit code (no traceback)."""

from __future__ import annotations

import json
import sys
from collections.abc import Coroutine
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from danube.client.errors import ApiError, ClientError, TransportError
from danube.client.tls import ClientTls

if TYPE_CHECKING:
    # The SDK's heavier modules load when a command runs, never for `--help`: the CLI's
    # modules import only typer and these light ones at start (make bench watches it).
    from rich.console import Console

    from danube.client import AsyncDanubeClient, Position

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _LazyConsole:
    """A rich Console made at its first use: rich.console and rich.markup cost about 30 ms
    to import, which `danube produce` would pay before its first request (typer alone
    never imports rich for a command)."""

    def __init__(self, **options: Any) -> None:
        self._lazy_options = options
        self._lazy_console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._lazy_console is None:
            from rich.console import Console

            self._lazy_console = Console(**self._lazy_options)
        return getattr(self._lazy_console, name)


# Results go to stdout; progress, summaries and errors to stderr, so stdout pipes cleanly.
out = cast("Console", _LazyConsole(highlight=False, soft_wrap=True))
err = cast("Console", _LazyConsole(stderr=True, highlight=False, soft_wrap=True))


def escape(text: str) -> str:
    """``text`` with rich's markup escaped (printed as it is)."""
    from rich.markup import escape as escape_markup

    return escape_markup(text)


ServiceAddr = Annotated[
    str,
    typer.Option(
        "--service-addr",
        "-s",
        envvar="DANUBE_SERVICE_ADDR",
        help="URL of the Danube HTTP API (any discovery instance).",
    ),
]
Topic = Annotated[
    str, typer.Option("--topic", "-t", help="Topic: /<namespace>/<topic>, or <topic> in default.")
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="DANUBE_TOKEN",
        help="Bearer token sent with every request (a server with security enabled).",
        show_default=False,
    ),
]

# The bearer token of this invocation (`danube --token ...` or $DANUBE_TOKEN), set once by
# the root command before any subcommand runs.
_token: str | None = None


def set_token(token: str | None) -> None:
    """Remember the invocation's bearer token (the root command's ``--token``)."""
    global _token
    _token = token or None


def bearer_token() -> str | None:
    """The invocation's bearer token, if any: every client the CLI makes sends it."""
    return _token


# TLS of every client command (`danube --ca-file ca.pem produce ...`): options of the root
# command, or their environment variables (docs/security.md#tls).
CaFile = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        envvar="DANUBE_CA_FILE",
        help="PEM CA bundle to verify an https:// server with (default: the system's).",
    ),
]
CertFile = Annotated[
    Path | None,
    typer.Option(
        "--cert-file",
        envvar="DANUBE_CERT_FILE",
        help="PEM client certificate (chain) for a server that requires one (mTLS).",
    ),
]
KeyFile = Annotated[
    Path | None,
    typer.Option("--key-file", envvar="DANUBE_KEY_FILE", help="PEM private key of --cert-file."),
]


# Set once by the root command from its options; read by every client command.
_client_tls: ContextVar[ClientTls | None] = ContextVar("danube_client_tls", default=None)


def use_client_tls(
    ca_file: Path | None, cert_file: Path | None, key_file: Path | None
) -> ClientTls | None:
    """Make the root command's TLS options those of the client commands; None when none
    is given."""
    tls = None
    if ca_file is not None or cert_file is not None or key_file is not None:
        if (cert_file is None) != (key_file is None):
            raise typer.BadParameter(
                "--cert-file and --key-file go together", param_hint="--key-file"
            )
        tls = ClientTls(ca_file=ca_file, cert_file=cert_file, key_file=key_file)
    _client_tls.set(tls)
    return tls


def client_tls() -> ClientTls | None:
    """The TLS options the root command was given, if any."""
    return _client_tls.get()


def connect(url: str, **options: Any) -> AsyncDanubeClient:
    """The SDK client of a command: ``url`` with the command line's TLS options and token."""
    from danube.client.client import AsyncDanubeClient

    return AsyncDanubeClient(url, tls=client_tls(), token=bearer_token(), **options)


def fail(command: str, message: str, code: int = EXIT_ERROR) -> typer.Exit:
    """Print ``danube <command>: message`` in red to stderr; the Exit to raise."""
    err.print(f"[red]danube {command}:[/] {escape(message)}")
    return typer.Exit(code)


def run(command: str, main: Coroutine[Any, Any, int | None]) -> None:
    """Run a command's coroutine; expected errors end it with one line and exit code 1,
    a bad argument with 2, Ctrl-C with 130. On uvloop, as the services: a command is mostly
    SDK round trips (``danube bench`` above all), each costing a few turns of the loop."""
    import asyncio

    import uvloop

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            code = runner.run(main)
    except KeyboardInterrupt:
        err.print(f"danube {command}: interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TransportError as exc:
        raise fail(command, f"cannot reach the server: {exc.message}") from None
    except ClientError as exc:
        usage = exc.code in ("invalid_argument", "invalid_name", "invalid_message")
        text = str(exc) if isinstance(exc, ApiError) else f"{exc.code}: {exc.message}"
        raise fail(command, text, EXIT_USAGE if usage else EXIT_ERROR) from None
    if code:
        raise typer.Exit(code)


def print_json(value: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n")


def parse_attributes(items: list[str] | None) -> dict[str, str]:
    """``["k:v", "a:1,b:2"]`` → ``{"k": "v", "a": "1", "b": "2"}`` (Danube's form)."""
    attributes: dict[str, str] = {}
    for item in items or []:
        for pair in item.split(","):
            name, sep, value = pair.partition(":")
            if not sep or not name.strip():
                raise typer.BadParameter(f"expected name:value, got {pair!r}", param_hint="-a")
            attributes[name.strip()] = value.strip()
    return attributes


def parse_position(value: str, option: str) -> Position:
    """``earliest``, ``latest``, an offset, or ``ts:<unix ms>``."""
    from danube.client.messages import Timestamp

    if value in ("earliest", "latest"):
        return "earliest" if value == "earliest" else "latest"
    if value.isdigit():
        return int(value)
    if value.startswith("ts:") and value[3:].isdigit():
        return Timestamp(int(value[3:]))
    raise typer.BadParameter(
        f"earliest, latest, an offset or ts:<unix ms>, not {value!r}", param_hint=option
    )
