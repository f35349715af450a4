"""The options of ``spark.read.format("danube")``, parsed and checked once, with no I/O.

docs/spark.md has the table. In short: ``topic`` (required), where the mesh is (``config``,
``etcd_endpoint``, ``prefix``, any ``wal_cloud.<key>`` of the config file), what to read
(``start_offset``/``end_offset``, ``start_time``/``end_time``: each range includes its start
and excludes its end) and how (``split``, ``max_partition_bytes``, ``min_partitions``,
``chunk_bytes``, ``batch_rows``, ``clock_skew_ms``) and whether to decode payloads with the
topic's registered schema (``decode``: ``none`` or ``schema``). Spark hands options over
lower-cased; an unknown option fails rather than being ignored, so a typo cannot silently
widen a read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, get_args

from danube.config import CloudConfig, DanubeSettings, load_settings
from danube.names import InvalidNameError, TopicName
from danube.spark.errors import InvalidOptionError

MiB = 1024 * 1024
MAX_OFFSET = 2**63 - 1  # Spark's offset column is a signed long

Split = Literal["size", "object", "partition"]
Decode = Literal["none", "schema"]

DEFAULT_MAX_PARTITION_BYTES = 128 * MiB  # as Spark's own spark.sql.files.maxPartitionBytes
DEFAULT_CHUNK_BYTES = 8 * MiB
DEFAULT_BATCH_ROWS = 10_000
DEFAULT_CLOCK_SKEW_MS = 60_000

_SETTINGS_PREFIX = "wal_cloud."  # options that override a key of the config file
_SHORTCUTS = {
    "etcd_endpoint": "wal_cloud.metadata.etcd_endpoint",
    "prefix": "wal_cloud.metadata.prefix",
}
_KNOWN = frozenset(
    {
        "topic",
        "config",
        *_SHORTCUTS,
        "start_offset",
        "end_offset",
        "start_time",
        "end_time",
        "split",
        "max_partition_bytes",
        "min_partitions",
        "chunk_bytes",
        "batch_rows",
        "clock_skew_ms",
        "decode",
        # Spark adds this one itself for load(path); a path means nothing here.
        "path",
    }
)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What to read and how; ranges include their start and exclude their end."""

    topic: TopicName  # a topic, or one partition of it (`<topic>-part-<N>`)
    start_offset: int = 0
    end_offset: int | None = None
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    split: Split = "size"
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    min_partitions: int | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    batch_rows: int = DEFAULT_BATCH_ROWS
    clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS
    decode: Decode = "none"  # "schema": add value/decode_error from the registered schema
    config_path: str | None = None
    # DANUBE_* variable names → values: how the options reach the config loader.
    overrides: Mapping[str, str] = field(default_factory=dict)

    def wants(self, offset: int) -> bool:
        """Whether ``offset`` is inside the offset range."""
        return offset >= self.start_offset and (self.end_offset is None or offset < self.end_offset)

    def selection(self) -> dict[str, int | None]:
        """The ranges, as a backfill records them to recognise its own checkpoints."""
        return {
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "start_time_ms": self.start_time_ms,
            "end_time_ms": self.end_time_ms,
        }


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """Check the data source options; :class:`InvalidOptionError` names the first bad one."""
    given = {name.lower(): value for name, value in options.items()}
    for name in given:
        if name not in _KNOWN and not name.startswith(_SETTINGS_PREFIX):
            raise InvalidOptionError(name, "unknown option (docs/spark.md lists them)")
    if given.get("path"):
        raise InvalidOptionError("path", "the topic is given with option('topic', ...), not load()")
    if "topic" not in given:
        raise InvalidOptionError("topic", "required: /<namespace>/<topic>")
    try:
        topic = TopicName.parse(given["topic"])
    except InvalidNameError as exc:
        raise InvalidOptionError("topic", exc.message) from exc
    start_offset = _int(given, "start_offset", 0, 0, MAX_OFFSET)
    end_offset = _optional_int(given, "end_offset", 0, MAX_OFFSET)
    if end_offset is not None and end_offset < start_offset:
        raise InvalidOptionError("end_offset", f"{end_offset} is before start_offset")
    start_time = _optional_time(given, "start_time")
    end_time = _optional_time(given, "end_time")
    if start_time is not None and end_time is not None and end_time < start_time:
        raise InvalidOptionError("end_time", "is before start_time")
    split = given.get("split", "size")
    splits: dict[str, Split] = {"size": "size", "object": "object", "partition": "partition"}
    if split not in splits:
        raise InvalidOptionError("split", f"'size', 'object' or 'partition', not {split!r}")
    decode = given.get("decode", "none").strip().lower() or "none"
    decodes: dict[str, Decode] = {"none": "none", "schema": "schema"}
    if decode not in decodes:
        raise InvalidOptionError("decode", f"'none' or 'schema', not {decode!r}")
    return ReadOptions(
        topic=topic,
        decode=decodes[decode],
        start_offset=start_offset,
        end_offset=end_offset,
        start_time_ms=start_time,
        end_time_ms=end_time,
        split=splits[split],
        max_partition_bytes=_int(
            given, "max_partition_bytes", DEFAULT_MAX_PARTITION_BYTES, 64 * 1024, 2**40
        ),
        min_partitions=_optional_int(given, "min_partitions", 1, 1_000_000),
        chunk_bytes=_int(given, "chunk_bytes", DEFAULT_CHUNK_BYTES, 4096, 256 * MiB),
        batch_rows=_int(given, "batch_rows", DEFAULT_BATCH_ROWS, 1, 1_000_000),
        clock_skew_ms=_int(given, "clock_skew_ms", DEFAULT_CLOCK_SKEW_MS, 0, 2**40),
        config_path=given.get("config") or None,
        overrides=_overrides(given),
    )


def load_source_settings(
    options: ReadOptions, environ: Mapping[str, str] | None = None
) -> DanubeSettings:
    """The settings the source reads the mesh with: the config file (``config``, else
    ``$DANUBE_CONFIG``), ``DANUBE_*`` variables, then the options, key by key."""
    env = dict(os.environ if environ is None else environ)
    env.update(options.overrides)
    path = Path(options.config_path) if options.config_path else None
    return load_settings(path, environ=env)


_CLOUD_VARIABLE = "DANUBE_WAL_CLOUD__CLOUD__"


def backend_given(options: ReadOptions, environ: Mapping[str, str]) -> bool:
    """Whether the options or ``DANUBE_*`` variables name ``wal_cloud.cloud.backend`` (a
    config file's section shows in the loaded settings' ``model_fields_set`` instead)."""
    names = [*environ, *options.overrides]
    return any(name.upper() == _CLOUD_VARIABLE + "BACKEND" for name in names)


def without_cloud(
    options: ReadOptions, environ: Mapping[str, str]
) -> tuple[ReadOptions, dict[str, str]]:
    """``options`` and ``environ`` but their ``wal_cloud.cloud`` keys."""

    def keep(name: str) -> bool:
        return not name.upper().startswith(_CLOUD_VARIABLE)

    overrides = {name: value for name, value in options.overrides.items() if keep(name)}
    return replace(options, overrides=overrides), {k: v for k, v in environ.items() if keep(k)}


def recorded_cloud_environment(cloud: Mapping[str, str | bool]) -> dict[str, str]:
    """The ``DANUBE_WAL_CLOUD__CLOUD__*`` variables of a section recorded in etcd
    (``cluster/object_store``): laid under the reader's own, they give the recorded backend
    and root while the reader's variables and options (credentials) still win key by key.
    Keys this version's model of the backend does not know (recorded by a newer service) are
    left out rather than fail the load."""
    known = _CLOUD_FIELDS.get(str(cloud.get("backend")), frozenset())
    variables = {}
    for name, value in cloud.items():
        if name in known:
            text = ("true" if value else "false") if isinstance(value, bool) else value
            variables[_CLOUD_VARIABLE + name.upper()] = text
    return variables


def _cloud_fields() -> dict[str, frozenset[str]]:
    union = get_args(get_args(CloudConfig)[0])
    found = {}
    for model in union:
        (backend,) = get_args(model.model_fields["backend"].annotation)
        found[backend] = frozenset(model.model_fields)
    return found


_CLOUD_FIELDS = _cloud_fields()


def _overrides(given: Mapping[str, str]) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for name, value in given.items():
        path = _SHORTCUTS.get(name, name)
        if not path.startswith(_SETTINGS_PREFIX):
            continue
        parts = path.split(".")
        if any(not part.isidentifier() for part in parts):
            raise InvalidOptionError(name, "not a key path of the config file")
        overrides["DANUBE_" + "__".join(part.upper() for part in parts)] = value
    return overrides


def _int(given: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = _optional_int(given, name, low, high)
    return default if value is None else value


def _optional_int(given: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    text = given.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        raise InvalidOptionError(name, f"{text!r} is not an integer") from None
    if not low <= value <= high:
        raise InvalidOptionError(name, f"{value} is outside {low}..{high}")
    return value


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC when it names no zone)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _optional_time(given: Mapping[str, str], name: str) -> int | None:
    text = given.get(name)
    if text is None or text == "":
        return None
    try:
        value = parse_time_ms(str(text))
    except ValueError:
        raise InvalidOptionError(
            name, f"{text!r} is neither milliseconds nor an ISO 8601 time"
        ) from None
    if value < 0:
        raise InvalidOptionError(name, "before 1970")
    return value
