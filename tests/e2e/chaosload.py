"""The network fault harness's load (docs/chaos.md): producers in the hub sending numbered
messages one at a time through the bus, every attempt recorded with its times and answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from danube.bus import TopicName
from danube.errors import DanubeError
from danube.frame import Record, encode_record
from danube.wire.ingest.client import IngestClient
from tests.chaos import longest_unavailable
from tests.history import History

ATTEMPT_TIMEOUT_S = 3.0  # one produce call (IngestClient retries retriable answers inside)
RETRY_PAUSE_S = 0.05


@dataclass(frozen=True)
class Attempt:
    """One produce call and its answer: ``ok`` (with the offset), ``error`` (a code) or
    ``timeout``; times are the event loop's."""

    producer: str
    partition: str
    msg_id: str
    started: float
    ended: float
    outcome: str
    offset: int | None = None
    code: str | None = None


class Load:
    """Producers (several per partition) sending numbered messages one at a time, each
    message sent again until acknowledged (as the SDK does), every attempt recorded."""

    def __init__(self, client: IngestClient, partitions: list[TopicName], per_partition: int):
        self.client = client
        self.partitions = partitions
        self.per_partition = per_partition
        self.history = History()
        self.attempts: list[Attempt] = []

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tasks:
            for p in self.partitions:
                for i in range(self.per_partition):
                    tasks.create_task(self._produce(f"{p.topic}-p{i}", p, stop))

    async def _produce(self, name: str, partition: TopicName, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        number = 0
        while not stop.is_set():
            msg_id = f"{name}-{number}"
            record = encode_record(
                Record(payload=msg_id.encode(), publish_time_ms=1, producer=name)
            )
            while not stop.is_set():
                started = loop.time()
                outcome, offset, code = "ok", None, None
                try:
                    offset = await self.client.produce(
                        partition, [record], timeout_s=ATTEMPT_TIMEOUT_S
                    )
                except TimeoutError:
                    outcome, code = "timeout", "timeout"
                except DanubeError as exc:
                    outcome, code = ("timeout" if exc.code == "timeout" else "error"), exc.code
                except Exception as exc:  # a bus error: recorded, the message sent again
                    outcome, code = "error", type(exc).__name__
                self.attempts.append(
                    Attempt(
                        name, str(partition), msg_id, started, loop.time(), outcome, offset, code
                    )
                )
                if outcome == "ok":
                    self.history.produced(
                        msg_id, partition=str(partition), offset=offset, acked=True
                    )
                    break
                self.history.produced(msg_id, acked=False)
                await asyncio.sleep(RETRY_PAUSE_S)
            number += 1

    def latency_p50_s(self, partition: TopicName, start: float, end: float) -> float:
        """The median time of the acknowledged calls on ``partition`` started in [start, end]."""
        took = sorted(
            a.ended - a.started
            for a in self.attempts
            if a.partition == str(partition) and a.outcome == "ok" and start <= a.started <= end
        )
        return took[len(took) // 2] if took else float("nan")

    def unavailable_s(self, start: float, end: float) -> dict[str, float]:
        """Per partition, the longest stretch of [start, end] with no acknowledgement."""
        return {
            str(p): longest_unavailable(
                (a.ended for a in self.attempts if a.partition == str(p) and a.outcome == "ok"),
                start,
                end,
            )
            for p in self.partitions
        }
