"""A TCP relay that delays what it carries, for the network fault harness (tests/netlab.py):
this machine's kernel has no ``netem`` qdisc, so a host's added latency comes from this relay,
run inside the host's namespace between the host's processes and a server (nats-server,
etcd). The delay, in milliseconds, is read from a control file about every 50 ms (missing or
empty: 0); each chunk is forwarded once it has waited the delay that was in force when it
arrived, in order, in both directions.

Usage: python tests/netdelay.py LISTEN_HOST:PORT TARGET_HOST:PORT CONTROL_FILE
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

CHUNK_BYTES = 64 * 1024
CONTROL_POLL_S = 0.05
CONNECT_TIMEOUT_S = 5.0
QUEUE_CHUNKS_MAX = 1024  # per direction; a full queue stops reading (TCP pushes back)


class Delay:
    """The delay in force, re-read from the control file."""

    def __init__(self, control: Path) -> None:
        self.control = control
        self.seconds = 0.0

    async def follow(self) -> None:
        while True:
            try:
                text = await asyncio.to_thread(self.control.read_text)
                self.seconds = max(0.0, float(text.strip() or 0)) / 1000.0
            except (OSError, ValueError):
                self.seconds = 0.0
            await asyncio.sleep(CONTROL_POLL_S)


async def _read(
    reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]], delay: Delay
) -> None:
    loop = asyncio.get_running_loop()
    while data := await reader.read(CHUNK_BYTES):
        await queue.put((loop.time() + delay.seconds, data))
    await queue.put((0.0, b""))  # end of stream


async def _write(writer: asyncio.StreamWriter, queue: asyncio.Queue[tuple[float, bytes]]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        due, data = await queue.get()
        if not data:
            break
        if (wait := due - loop.time()) > 0:
            await asyncio.sleep(wait)
        writer.write(data)
        await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS_MAX)
    await asyncio.gather(_read(reader, queue, delay), _write(writer, queue))


async def relay(listen: tuple[str, int], target: tuple[str, int], control: Path) -> None:
    """Serve until killed."""
    delay = Delay(control)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(*target)
        except (OSError, TimeoutError):
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay))
        except OSError:
            pass
        finally:
            for end in (writer, up_writer):
                end.close()

    server = await asyncio.start_server(serve, *listen, reuse_address=True)
    follow = asyncio.create_task(delay.follow())
    async with server:
        await server.serve_forever()
    follow.cancel()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    listen_at, target_at, control_file = sys.argv[1:4]
    asyncio.run(relay(_address(listen_at), _address(target_at), Path(control_file)))
