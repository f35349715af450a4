"""`danube up`: nats-server, etcd and every service under one supervisor."""

from __future__ import annotations

import asyncio
import logging
import signal
import zlib
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from danube.aio import wait_any
from danube.config import ConfigError, load_settings
from danube.errors import DanubeError
from danube.up.mesh import (
    SCRAPE_TARGETS_FILE,
    MeshPlan,
    parse_scale,
    plan_mesh,
    write_scrape_targets,
)
from danube.up.secure import SECURE_DIR_NAME, prepare_secure_mesh
from danube.up.supervisor import Supervisor

_COLORS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan")
_NAME_WIDTH = 14


class _Printer:
    """Writes each line with its process name in front, one color per name."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def line(self, name: str, text: str) -> None:
        color = _COLORS[zlib.crc32(name.encode()) % len(_COLORS)]
        self.console.print(
            f"[{color}]{escape(name):<{_NAME_WIDTH}}│[/] {escape(text)}",
            highlight=False,
            soft_wrap=True,
        )


class _SupervisorLog(logging.Handler):
    def __init__(self, printer: _Printer) -> None:
        super().__init__()
        self.printer = printer

    def emit(self, record: logging.LogRecord) -> None:
        self.printer.line("supervisor", record.getMessage())


def run(*, config: Path | None, data_dir: Path, scale: list[str], secure: bool = False) -> int:
    """Run the mesh until SIGINT/SIGTERM; return the process exit code."""
    console = Console(stderr=False)
    printer = _Printer(console)
    try:
        settings = load_settings(config)
        if not secure and (data_dir / SECURE_DIR_NAME).is_dir():
            # etcd there asks for credentials: without them every service would fail.
            raise ValueError(
                f"{data_dir} holds a mesh started with --secure; "
                "start it with --secure again, or use another --data-dir"
            )
        secured = prepare_secure_mesh(settings, data_dir.resolve()) if secure else None
        plan = plan_mesh(
            settings,
            data_dir=data_dir.resolve(),
            scale=parse_scale(scale),
            config_path=config,
            secure=secured,
        )
    except (ConfigError, ValueError, OSError) as exc:
        console.print(f"[red]danube up:[/] {escape(str(exc))}")
        return 2
    data_dir.mkdir(parents=True, exist_ok=True)
    write_scrape_targets(plan, data_dir.resolve())
    root = logging.getLogger("danube")
    root.setLevel(logging.INFO)
    root.addHandler(_SupervisorLog(printer))
    try:
        asyncio.run(_supervise(plan, printer, data_dir))
    except DanubeError as exc:
        console.print(f"[red]danube up failed:[/] {escape(str(exc))}")
        return 1
    return 0


async def _supervise(plan: MeshPlan, printer: _Printer, data_dir: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    supervisor = Supervisor(plan.specs, sink=printer.line)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(supervisor.run(stop))
        tg.create_task(_announce(supervisor, plan, printer, data_dir, stop))
    printer.line("supervisor", "all processes stopped")


def metrics_banner(plan: MeshPlan, data_dir: Path) -> list[str]:
    """Where each process serves /metrics (fixed ports: docs/operations.md), and the
    Prometheus file that scrapes them all."""
    where = ", ".join(f"{name} {address}" for name, address in plan.metrics.items())
    return [
        f"  metrics {where}",
        "  prometheus --config.file=deploy/observability/prometheus-local.yml scrapes them "
        f"(targets: {data_dir / SCRAPE_TARGETS_FILE})",
    ]


async def _announce(
    supervisor: Supervisor, plan: MeshPlan, printer: _Printer, data_dir: Path, stop: asyncio.Event
) -> None:
    await wait_any(supervisor.ready, stop)
    if not supervisor.ready.is_set():
        return
    printer.line("supervisor", f"mesh ready: {len(plan.specs)} processes, data in {data_dir}")
    for name, url in plan.urls.items():
        printer.line("supervisor", f"  {name:<6} {url}")
    for line in metrics_banner(plan, data_dir):
        printer.line("supervisor", line)
    if plan.secure is None:
        printer.line(
            "supervisor",
            "security: OFF (plain HTTP and gRPC, no tokens, no credentials on NATS or etcd; "
            "loopback only); "
            "`make run ARGS=--secure` turns it on",
        )
    else:
        for line in plan.secure.banner:
            printer.line("supervisor", line)
    printer.line("supervisor", "press Ctrl-C to stop")
