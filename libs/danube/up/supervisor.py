"""Run a set of processes as one unit: start in order, restart on death, stop cleanly.

Each child is started only after the one before it answers its readiness probe
(nats and etcd before the services that need them). A child that dies is
restarted with capped, jittered exponential backoff, and the restart is logged.
Every line a child prints is handed to ``sink`` with the child's name, so the
operator sees one interleaved, labelled log. ``run()`` returns only after every
child has exited: SIGTERM first, SIGKILL after the spec's stop timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from danube.aio import wait_any
from danube.up.servers import ProcessSpec, ServerError, die_with_parent, probe

log = logging.getLogger(__name__)

LineSink = Callable[[str, str], None]
"""Receives (process name, output line without its newline)."""

_LINE_BYTES_MAX = 64 * 1024  # longer lines are split rather than buffered without bound


@dataclass(frozen=True)
class RestartPolicy:
    """How a dead child is restarted."""

    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    # A child that stayed up this long counts as healthy again: backoff starts over.
    healthy_after_s: float = 60.0


class _Child:
    """One supervised process and its restart state."""

    def __init__(self, spec: ProcessSpec, sink: LineSink, policy: RestartPolicy) -> None:
        self.spec = spec
        self.sink = sink
        self.policy = policy
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.restarts = 0
        self.stop_requested = asyncio.Event()

    @property
    def stopping(self) -> bool:
        return self.stop_requested.is_set()

    async def keep_running(self) -> None:
        """Start the process and restart it whenever it exits, until stopped."""
        backoff_s = self.policy.initial_backoff_s
        while not self.stopping:
            started = time.monotonic()
            await self._spawn_and_wait()
            if self.stopping:
                return
            assert self.proc is not None
            if time.monotonic() - started >= self.policy.healthy_after_s:
                backoff_s = self.policy.initial_backoff_s
            delay_s = backoff_s * random.uniform(0.5, 1.0)
            self.restarts += 1
            log.warning(
                "%s (pid %s) exited with %s; restart %d in %.1fs",
                self.spec.name,
                self.proc.pid,
                self.proc.returncode,
                self.restarts,
                delay_s,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_requested.wait(), delay_s)
            backoff_s = min(backoff_s * 2, self.policy.max_backoff_s)

    async def _spawn_and_wait(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.spec.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **self.spec.env},
            # Own session: a terminal's Ctrl-C reaches only the supervisor, which then
            # stops the children in reverse order.
            start_new_session=True,
            preexec_fn=die_with_parent,
            limit=_LINE_BYTES_MAX,
        )
        log.info("%s started (pid %d)", self.spec.name, self.proc.pid)
        if self.stopping:  # stop() ran while we were spawning
            self.proc.terminate()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._pump_output(self.proc))
            probing = tg.create_task(self._await_ready(self.proc))
            await self.proc.wait()
            probing.cancel()

    async def _await_ready(self, proc: asyncio.subprocess.Process) -> None:
        url = self.spec.ready_url
        # Polling is the only way to learn that another process answers HTTP.
        while url is not None and not await asyncio.to_thread(probe, url):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        log.info("%s ready (pid %d)", self.spec.name, proc.pid)
        self.ready.set()

    async def _pump_output(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:  # a line over the limit: take what is buffered
                line = await proc.stdout.read(_LINE_BYTES_MAX)
            if not line:
                return
            self.sink(self.spec.name, line.decode("utf-8", "replace").rstrip("\n"))

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if the process outlives its stop timeout."""
        self.stop_requested.set()
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), self.spec.stop_timeout_s)
        except TimeoutError:
            log.warning(
                "%s did not stop in %.0fs; killing it", self.spec.name, self.spec.stop_timeout_s
            )
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        log.info("%s stopped (exit %s)", self.spec.name, proc.returncode)


class Supervisor:
    """Starts ``specs`` in order and keeps them running until ``stop`` is set."""

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        *,
        sink: LineSink,
        policy: RestartPolicy | None = None,
    ) -> None:
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique: {names}")
        self._children = [_Child(spec, sink, policy or RestartPolicy()) for spec in specs]
        self.ready = asyncio.Event()

    def pids(self) -> dict[str, int]:
        """The current pid of every running child, by name."""
        return {
            child.spec.name: child.proc.pid
            for child in self._children
            if child.proc is not None and child.proc.returncode is None
        }

    def restarts(self) -> dict[str, int]:
        """How many times each child has been restarted."""
        return {child.spec.name: child.restarts for child in self._children}

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; raise ServerError if a child never becomes ready."""
        failure: ServerError | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                for child in self._children:
                    tg.create_task(child.keep_running(), name=f"supervise-{child.spec.name}")
                    failure = await self._await_ready(child, stop)
                    if failure is not None or stop.is_set():
                        break
                else:
                    self.ready.set()
                if failure is None:
                    await stop.wait()
                await self._stop_all()
        finally:
            # Also on errors and cancellation: never leave a child behind.
            await asyncio.shield(self._stop_all())
        if failure is not None:
            raise failure

    async def _await_ready(self, child: _Child, stop: asyncio.Event) -> ServerError | None:
        await wait_any(child.ready, stop, timeout_s=child.spec.ready_timeout_s)
        if stop.is_set():
            return None
        if child.ready.is_set():
            return await self._first_ready(child)
        return ServerError(
            f"{child.spec.name} did not become ready in {child.spec.ready_timeout_s:.0f}s"
        )

    async def _first_ready(self, child: _Child) -> ServerError | None:
        hook = child.spec.on_first_ready
        if hook is None:
            return None
        try:
            async with asyncio.timeout(child.spec.ready_timeout_s):
                await hook()
        except Exception as exc:  # reported as the start's failure, as a probe timeout is
            return ServerError(f"{child.spec.name}: setup after start failed: {exc}")
        return None

    async def _stop_all(self) -> None:
        for child in reversed(self._children):
            await child.stop()
