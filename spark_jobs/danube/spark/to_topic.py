"""Backfill into a topic: a topic's history (or a range of it) from the cloud tier, produced
again through the public HTTP API, in batches, safe to re-run.

How duplicates are avoided, and bounded where they cannot be:

- Each source partition is one Spark task (the source's ``split=partition``) that sends its
  messages in offset order, ``batch_messages`` at a time, and after each acknowledged batch
  records ``sent_through`` (the last source offset sent) in a **checkpoint**: a small JSON
  object ``<root>/backfills/<name>/<ns>/<partition>.json`` in object storage (the topic's
  own bucket by default, or ``checkpoint_dir``). A task, a retried task or a re-run of the
  job skips every offset up to its partition's ``sent_through``: a finished backfill run
  again sends nothing.
- What can still be sent twice: a batch the server stored whose checkpoint was not written
  (the task died in between), and a produce retried after an answer was lost (the API is
  at-least-once: docs/http-api.md). So a failure re-sends **at most one batch per source
  partition**, and nothing else.
- Every message carries its origin in two attributes, ``danube.backfill.source`` (the source
  partition) and ``danube.backfill.offset``: a consumer that must see each message once can
  drop repeats exactly (``origin_attributes=False`` leaves them out).
- A checkpoint belongs to one run's target and selection (offset and time ranges): a run
  with another one under the same ``name`` is refused (``restart=True`` deletes the
  checkpoints and starts over). Speculative execution would run a partition twice at once,
  so it is refused too.

What is kept: payload, key (so routing by key in the target works as in the source) and
attributes. The target assigns new offsets and publish times; the producer name is
``producer`` for every message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field
from pyspark.sql import SparkSession

from danube.client import AsyncDanubeClient, AsyncProducer, Message, ProducerOptions, SendResult
from danube.config import CloudConfig
from danube.config.wal_cloud import FsCloud
from danube.names import TopicName, validate_segment
from danube.spark.catalog import read_partitions, source_settings
from danube.spark.errors import BackfillStateError, InvalidOptionError
from danube.spark.options import parse_options
from danube.spark.source import FORMAT
from danube.storage import ObjectNotFoundError, ObjectStore, normalize_root

ORIGIN_SOURCE = "danube.backfill.source"
ORIGIN_OFFSET = "danube.backfill.offset"
MAX_BATCH_MESSAGES = 10_000  # the API's limit on one produce request
SEND_TIMEOUT_S = 60.0  # one request, retries of 429/503 and transport errors included

RESULT_SCHEMA = "partition int, sent long, skipped long, sent_through long"


class Checkpoint(BaseModel):
    """How far one source partition of a backfill got."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    source: str  # the source partition, `/<ns>/<topic>[-part-N]`
    target: str
    selection: dict[str, int | None]
    sent_through: int = Field(ge=-1)  # the last source offset sent; -1 none yet
    sent: int = Field(ge=0)  # messages this backfill sent for the partition, all runs
    updated_ms: int = Field(ge=0)


@dataclass(frozen=True, slots=True)
class TopicBackfillJob:
    """One backfill into a topic (see the module docstring)."""

    source_options: Mapping[str, str]  # those of spark.read.format("danube")
    target: TopicName
    url: str  # any discovery instance
    name: str  # names the checkpoints: letters, digits, _ and -
    batch_messages: int = 1000
    producer: str = "backfill"
    origin_attributes: bool = True
    checkpoint_dir: str | None = None  # a directory; default: the topic's object storage
    restart: bool = False
    send_timeout_s: float = SEND_TIMEOUT_S

    def __post_init__(self) -> None:
        validate_segment("backfill name", self.name)
        if not 1 <= self.batch_messages <= MAX_BATCH_MESSAGES:
            raise InvalidOptionError("batch_messages", f"must be in 1..{MAX_BATCH_MESSAGES}")


@dataclass(frozen=True, slots=True)
class TopicBackfill:
    """What a backfill into a topic did, summed over its source partitions."""

    sent: int  # messages produced by this run
    skipped: int  # messages a checkpoint said were sent before
    partitions: int  # source partitions with messages in the selection (after time filters)
    seconds: float

    @property
    def messages_per_s(self) -> float:
        """Messages sent per second."""
        return self.sent / self.seconds if self.seconds > 0 else 0.0


def default_name(source: TopicName, target: TopicName) -> str:
    """A name for the checkpoints of a backfill from ``source`` into ``target``."""
    return f"{source.namespace}-{source.topic}--{target.namespace}-{target.topic}"[:255]


def backfill_to_topic(spark: SparkSession, job: TopicBackfillJob) -> TopicBackfill:
    """Run the backfill; raises on the first partition that fails (a re-run resumes)."""
    if (spark.conf.get("spark.speculation", "false") or "").lower() == "true":
        raise InvalidOptionError("spark.speculation", "a backfill into a topic needs it off")
    options = parse_options({**job.source_options, "split": "partition"})
    settings = source_settings(options).settings
    cloud: CloudConfig = settings.wal_cloud.cloud
    root = normalize_root(settings.wal_cloud.uploader.root_prefix)
    if job.checkpoint_dir is not None:
        cloud, root = FsCloud(backend="fs", root=job.checkpoint_dir), ""
    found = asyncio.run(read_partitions(settings.wal_cloud.metadata, options.topic))
    sender = _Sender(
        job=replace(job, source_options={}),
        checkpoints=cloud,
        prefix="/".join(part for part in (root, "backfills", job.name) if part),
        selection=options.selection(),
        sources={partition.index: str(partition.name) for partition in found},
    )
    asyncio.run(sender.prepare(restart=job.restart))
    started = time.perf_counter()
    # Payloads go as they are: never decoded (decode is ignored), whatever the options say.
    rows = (
        spark.read.format(FORMAT)
        .options(**job.source_options)
        .option("split", "partition")
        .option("decode", "none")
    )
    summary = rows.load().mapInArrow(sender, RESULT_SCHEMA).collect()
    return TopicBackfill(
        sent=sum(row["sent"] for row in summary),
        skipped=sum(row["skipped"] for row in summary),
        partitions=sum(1 for row in summary if row["partition"] >= 0),
        seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True, slots=True)
class _Sender:
    """The function each task runs over its partition's rows (picklable: it is shipped)."""

    job: TopicBackfillJob
    checkpoints: CloudConfig
    prefix: str
    selection: dict[str, int | None]
    sources: dict[int, str]  # partition number -> the source partition's name

    def key(self, source: TopicName) -> str:
        """The checkpoint of one source partition."""
        return f"{self.prefix}/{source.namespace}/{source.topic}.json"

    async def prepare(self, *, restart: bool) -> None:
        """On the driver: refuse checkpoints of another run; delete them all on restart."""
        objects = ObjectStore.from_config(self.checkpoints)
        for key in await objects.list(self.prefix):
            if restart:
                await objects.delete(key)
                continue
            found = Checkpoint.model_validate_json(await objects.read(key))
            if found.target != str(self.job.target) or found.selection != self.selection:
                raise BackfillStateError(
                    key,
                    f"written by a run into {found.target} with {found.selection}; use another "
                    "name, or restart",
                )

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        loop = asyncio.new_event_loop()
        try:
            yield loop.run_until_complete(self._send_all(batches))
        finally:
            loop.close()

    async def _send_all(self, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch:
        objects = ObjectStore.from_config(self.checkpoints)
        options = ProducerOptions(
            name=self.job.producer,
            # A batch goes when it is full or flushed: linger only bounds a stray wait.
            linger_ms=1000,
            batch_max_messages=self.job.batch_messages,
            max_pending_messages=self.job.batch_messages,
            send_timeout_s=self.job.send_timeout_s,
            # Every task of the job produces under the job's one producer name: as idempotent
            # producers (one name, one producer) they would fence one another.
            idempotent=False,
        )
        async with AsyncDanubeClient(self.job.url) as client:
            producer = client.producer(self.job.target, options)
            partition = _PartitionSender(self, objects, producer)
            for batch in batches:
                await partition.rows(batch)
            await partition.commit()
        return pa.RecordBatch.from_pylist(
            [
                {
                    "partition": partition.index,
                    "sent": partition.sent,
                    "skipped": partition.skipped,
                    "sent_through": partition.sent_through,
                }
            ],
            schema=pa.schema(
                [
                    ("partition", pa.int32()),
                    ("sent", pa.int64()),
                    ("skipped", pa.int64()),
                    ("sent_through", pa.int64()),
                ]
            ),
        )


class _PartitionSender:
    """Sends one source partition's rows in checkpointed batches, in offset order."""

    def __init__(self, sender: _Sender, objects: ObjectStore, producer: AsyncProducer) -> None:
        self._sender = sender
        self._objects = objects
        self._producer = producer
        self.index = -1
        self.source: TopicName | None = None
        self.sent = 0
        self.skipped = 0
        self.sent_through = -1
        self._sent_before = 0
        self._pending: list[asyncio.Future[SendResult]] = []
        self._pending_through = -1

    async def rows(self, batch: pa.RecordBatch) -> None:
        """Send (or skip) the rows of one Arrow batch."""
        columns = batch.select(["partition", "offset", "key", "attributes", "payload"]).to_pydict()
        for partition, offset, key, attributes, payload in zip(
            columns["partition"],
            columns["offset"],
            columns["key"],
            columns["attributes"],
            columns["payload"],
            strict=True,
        ):
            if self.source is None:
                await self._start(partition)
            if offset <= self.sent_through:
                self.skipped += 1
                continue
            if offset <= self._pending_through:
                raise BackfillStateError(str(self.source), f"offset {offset} came twice")
            await self._send(offset, key, dict(attributes), payload)

    async def _start(self, partition: int) -> None:
        self.index = partition
        self.source = TopicName.parse(self._sender.sources[partition])
        try:
            data = await self._objects.read(self._sender.key(self.source))
        except ObjectNotFoundError:
            return
        found = Checkpoint.model_validate_json(data)
        self.sent_through, self._sent_before = found.sent_through, found.sent

    async def _send(
        self, offset: int, key: str | None, attributes: dict[str, str], payload: bytes
    ) -> None:
        if self._sender.job.origin_attributes:
            attributes[ORIGIN_SOURCE] = str(self.source)
            attributes[ORIGIN_OFFSET] = str(offset)
        self._pending.append(await self._producer.send(Message(payload, key, attributes)))
        self._pending_through = offset
        if len(self._pending) >= self._sender.job.batch_messages:
            await self.commit()

    async def commit(self) -> None:
        """Wait until the pending batch is stored, then record it in the checkpoint."""
        if not self._pending:
            return
        await self._producer.flush()
        for future in self._pending:
            error = future.exception()
            if error is not None:
                raise error
        self.sent += len(self._pending)
        self.sent_through = self._pending_through
        self._pending = []
        assert self.source is not None
        checkpoint = Checkpoint(
            source=str(self.source),
            target=str(self._sender.job.target),
            selection=self._sender.selection,
            sent_through=self.sent_through,
            sent=self._sent_before + self.sent,
            updated_ms=int(time.time() * 1000),
        )
        key = self._sender.key(self.source)
        await self._objects.write(key, checkpoint.model_dump_json().encode())
