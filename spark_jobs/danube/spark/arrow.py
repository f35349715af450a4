"""Frames to Arrow record batches: the rows the Spark source yields.

The schema (docs/spark.md)::

    topic         string     not null   `/<ns>/<topic>`, the topic read (a partition's parent)
    partition     int        not null   partition number; 0 for a topic without partitions
    offset        long       not null
    publish_time  timestamp  not null   UTC, millisecond precision (stored as microseconds)
    producer      string     not null
    key           string     null when the message has no key (an empty key is "")
    attributes    map<string, string>  not null (empty when none)
    payload       binary     not null
    schema_id     long       null when the record carries none (the topic has no schema)
    schema_version int       null likewise

With ``decode=schema`` (:mod:`danube.spark.decode`) two more::

    value         the registered schema's type (schema_types), null when the payload does not decode
    decode_error  string     null when it does

:data:`ARROW_SCHEMA` is exactly what Spark expects for :data:`danube.spark.source.SCHEMA`
(PySpark compares the two and refuses a batch that differs; a unit test checks they agree).
Records are decoded with :func:`danube.frame.decode_record_fields`, which checks each one: a
record that is not well formed fails the read with :class:`CorruptObjectError` naming the
object and the offset.
"""

from __future__ import annotations

import pyarrow as pa

from danube.frame import CorruptRecordError, Frame, decode_record_fields
from danube.spark.decode import PayloadDecoder
from danube.storage import CorruptObjectError

_US_PER_MS = 1000

ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("publish_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("producer", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=True),
        pa.field(
            "attributes",
            pa.map_(
                pa.field("key", pa.string(), nullable=False),
                pa.field("value", pa.string(), nullable=False),
            ),
            nullable=False,
        ),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("schema_id", pa.int64(), nullable=True),
        pa.field("schema_version", pa.int32(), nullable=True),
    ]
)
_SCHEMA_VERSION_MAX = 2**31 - 1  # the column is a Spark int


def arrow_schema(value_type: pa.DataType | None = None) -> pa.Schema:
    """:data:`ARROW_SCHEMA`, with ``value`` of ``value_type`` and ``decode_error`` when given."""
    if value_type is None:
        return ARROW_SCHEMA
    return ARROW_SCHEMA.append(pa.field("value", value_type, nullable=True)).append(
        pa.field("decode_error", pa.string(), nullable=True)
    )


class BatchBuilder:
    """Collects the rows of one object slice; :meth:`take` makes a record batch of them.

    Rows whose publish time falls outside ``[start_time_ms, end_time_ms)`` are left out.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        object_key: str,
        *,
        start_time_ms: int | None = None,
        end_time_ms: int | None = None,
        decoder: PayloadDecoder | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.object_key = object_key
        self._start_ms = start_time_ms
        self._end_ms = end_time_ms
        self._decoder = decoder
        self.schema = arrow_schema(None if decoder is None else decoder.value_type)
        self._clear()

    def _clear(self) -> None:
        self._offsets: list[int] = []
        self._times: list[int] = []
        self._producers: list[str] = []
        self._keys: list[str | None] = []
        self._map_ends: list[int] = [0]
        self._names: list[str] = []
        self._values: list[str] = []
        self._payloads: list[bytes] = []
        self._schema_ids: list[int | None] = []
        self._schema_versions: list[int | None] = []

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, frame: Frame) -> None:
        """Decode the frame's record and keep its row (unless outside the time range)."""
        try:
            time_ms, producer, key, attributes, payload, schema_id, schema_version = (
                decode_record_fields(frame.payload)[:7]
            )
        except CorruptRecordError as exc:
            raise CorruptObjectError(
                self.object_key, None, frame.offset, f"bad record: {exc.message}"
            ) from exc
        if (self._start_ms is not None and time_ms < self._start_ms) or (
            self._end_ms is not None and time_ms >= self._end_ms
        ):
            return
        if schema_version is not None and schema_version > _SCHEMA_VERSION_MAX:
            raise CorruptObjectError(
                self.object_key, None, frame.offset, f"schema version {schema_version} is over 2^31"
            )
        self._offsets.append(frame.offset)
        self._times.append(time_ms * _US_PER_MS)
        self._producers.append(producer)
        self._keys.append(key)
        if attributes:
            self._names.extend(attributes)
            self._values.extend(attributes.values())
        self._map_ends.append(len(self._names))
        self._payloads.append(payload)
        self._schema_ids.append(schema_id)
        self._schema_versions.append(schema_version)

    def take(self) -> pa.RecordBatch:
        """The rows added since the last take, as one batch of :attr:`schema`."""
        rows = len(self._offsets)
        attributes = pa.MapArray.from_arrays(
            pa.array(self._map_ends, pa.int32()),
            pa.array(self._names, pa.string()),
            pa.array(self._values, pa.string()),
            type=ARROW_SCHEMA.field("attributes").type,
        )
        columns = [
            pa.repeat(pa.scalar(self.topic, pa.string()), rows),
            pa.repeat(pa.scalar(self.partition, pa.int32()), rows),
            pa.array(self._offsets, pa.int64()),
            pa.array(self._times, pa.timestamp("us", tz="UTC")),
            pa.array(self._producers, pa.string()),
            pa.array(self._keys, pa.string()),
            attributes,
            pa.array(self._payloads, pa.binary()),
            pa.array(self._schema_ids, pa.int64()),
            pa.array(self._schema_versions, pa.int32()),
        ]
        if self._decoder is not None:
            columns += self._decoder.columns(
                self._payloads, self._schema_ids, self._schema_versions
            )
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self._clear()
        return batch
