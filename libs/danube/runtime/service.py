"""The process entry every service shares: settings, logging, signals, exit codes.

A service provides ``serve(settings, node_id, stop)``: it runs until ``stop`` is set
(SIGTERM or SIGINT) and returns, or raises to end the process with a failure, which
the supervisor (or the container runtime) answers with a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable

from danube.config import ConfigError, DanubeSettings, load_settings
from danube.runtime.logs import configure_logging

log = logging.getLogger(__name__)

NODE_ID_ENV = "DANUBE_NODE_ID"
Serve = Callable[[DanubeSettings, str, asyncio.Event], Awaitable[None]]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2


def node_id_for(kind: str) -> str:
    """``$DANUBE_NODE_ID``, else ``<kind>-<hostname>``: stable across restarts, which an
    ingest node needs to take its partitions back. Two instances of one kind on one host
    must be given distinct ids (``danube up`` does)."""
    return os.environ.get(NODE_ID_ENV) or f"{kind}-{socket.gethostname()}"


def run_service(kind: str, serve: Serve) -> None:
    """Run ``serve`` as this process's main task and exit with its outcome."""
    configure_logging(kind)
    try:
        settings = load_settings()
    except ConfigError as exc:
        log.error("bad configuration: %s", exc)
        sys.exit(EXIT_BAD_CONFIG)
    node_id = node_id_for(kind)
    try:
        asyncio.run(_main(serve, settings, node_id))
    except Exception:
        log.exception("%s %s failed", kind, node_id)
        sys.exit(EXIT_FAILED)
    log.info("%s %s stopped", kind, node_id)
    sys.exit(EXIT_OK)


async def _main(serve: Serve, settings: DanubeSettings, node_id: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await serve(settings, node_id, stop)
