"""`danube backfill parquet|topic|iceberg`: the Spark backfill jobs (danube.spark,
docs/spark.md).

From this command Spark runs in-process on ``--master`` (``local[*]`` by default); the same
commands run under ``spark-submit`` through ``spark_jobs/backfill_parquet.py`` and
``spark_jobs/backfill_topic.py``, and then ``spark-submit``'s ``--master`` rules. Spark is
imported only when a command runs: the rest of the CLI works without the ``spark`` extra.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from danube.cli._common import Json, ServiceAddr, err, fail, out, print_json
from danube.errors import DanubeError

app = typer.Typer(
    help="Backfills with Spark over the cloud tier: to Parquet, or into a topic.",
    no_args_is_help=True,
)

_T = TypeVar("_T")

SourceTopic = Annotated[
    str, typer.Option("--topic", "-t", help="Source topic (or one partition): /<ns>/<topic>.")
]
Config = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file of the mesh (default: $DANUBE_CONFIG)."),
]
Etcd = Annotated[str | None, typer.Option("--etcd", help="etcd host:port (overrides the config).")]
Prefix = Annotated[
    str | None, typer.Option("--prefix", help="Metadata key prefix (overrides the config).")
]
StartOffset = Annotated[
    int | None, typer.Option("--start-offset", min=0, help="First offset (inclusive).")
]
EndOffset = Annotated[
    int | None, typer.Option("--end-offset", min=0, help="End offset (exclusive).")
]
StartTime = Annotated[
    str | None,
    typer.Option("--start-time", help="Publish time from (inclusive): ms or ISO 8601 (UTC)."),
]
EndTime = Annotated[
    str | None, typer.Option("--end-time", help="Publish time to (exclusive): ms or ISO 8601.")
]
Master = Annotated[
    str | None,
    typer.Option("--master", help="Spark master (default local[*]; ignored under spark-submit)."),
]
SparkLog = Annotated[
    str,
    typer.Option(
        "--spark-log",
        help="Spark's own log level on stderr (WARN, INFO...); errors end the command anyway.",
    ),
]
# Spark logs a failed job's whole stack at ERROR; the command says what failed in one line.
DEFAULT_SPARK_LOG = "FATAL"


def _source_options(
    topic: str,
    config: Path | None,
    etcd: str | None,
    prefix: str | None,
    start_offset: int | None,
    end_offset: int | None,
    start_time: str | None,
    end_time: str | None,
) -> dict[str, str]:
    given: dict[str, Any] = {
        "topic": topic,
        "config": str(config.resolve()) if config is not None else None,
        "etcd_endpoint": etcd,
        "prefix": prefix,
        "start_offset": start_offset,
        "end_offset": end_offset,
        "start_time": start_time,
        "end_time": end_time,
    }
    return {name: str(value) for name, value in given.items() if value is not None}


def _check(command: str, options: dict[str, str]) -> None:
    """Check the options, the config, the topic and that its first object is where the
    object store says, here, before Spark starts: a typo or a wrong root costs one clear
    line, not a JVM start and a wrapped stack."""
    from danube.spark.catalog import check_first_object, read_topic_schema, source_settings
    from danube.spark.options import parse_options

    def check() -> None:
        parsed = parse_options(options)
        found = source_settings(parsed)
        asyncio.run(check_first_object(found, parsed.topic))
        if parsed.decode == "schema":
            asyncio.run(read_topic_schema(found.settings.wal_cloud.metadata, parsed.topic))

    _guard(command, check)


def _guard(command: str, work: Callable[[], _T]) -> _T:
    """Run ``work``; an error a user can cause ends the command with one red line."""
    try:
        return work()
    except KeyboardInterrupt:
        err.print(f"danube backfill {command}: interrupted")
        raise typer.Exit(130) from None
    except DanubeError as exc:
        raise fail(f"backfill {command}", f"{exc.code}: {exc.message}") from None
    except Exception as exc:  # Spark's own errors carry ours (from its workers) as text
        raise fail(f"backfill {command}", explain(exc)) from None


_OUR_ERROR = re.compile(r"^(danube\.[\w.]+)\.(\w+Error): (.+)$", re.MULTILINE)


def explain(exc: BaseException) -> str:
    """One line for an error Spark raised: ``<code>: <message>`` of the last danube error
    named in it (raised in a Python worker, it reaches the driver as text inside Spark's),
    else Spark's first line."""
    text = str(exc)
    found = _OUR_ERROR.findall(text)
    if found:
        module, name, message = found[-1]
        return f"{_code(module, name)}: {message}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"{type(exc).__name__}: {first}"


def _code(module: str, name: str) -> str:
    """The ``code`` of the error class ``module.name``; its name if it has none."""
    try:
        kind = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return name
    return kind.code if isinstance(kind, type) and issubclass(kind, DanubeError) else name


def _session(master: str | None, log_level: str) -> Any:
    try:
        from danube.spark import spark_session
    except ImportError as exc:
        raise fail(
            "backfill", f"needs the spark extra (pip install 'danube-mesh[spark]'): {exc}"
        ) from None
    spark = spark_session("danube-backfill", master=master)
    spark.sparkContext.setLogLevel(log_level)
    return spark


def _local_path_exists(output: str) -> bool:
    """Whether ``output`` names a local path (no scheme, or ``file:``) that exists."""
    if output.startswith("file:"):
        return Path(output.removeprefix("file:").removeprefix("//")).exists()
    return "://" not in output and Path(output).exists()


@app.command("parquet")
def parquet(
    topic: SourceTopic,
    output: Annotated[
        str, typer.Option("--output", "-o", help="Where to write the Parquet dataset.")
    ],
    mode: Annotated[
        str, typer.Option("--mode", help="error (refuse an existing output), overwrite, append.")
    ] = "error",
    config: Config = None,
    etcd: Etcd = None,
    prefix: Prefix = None,
    start_offset: StartOffset = None,
    end_offset: EndOffset = None,
    start_time: StartTime = None,
    end_time: EndTime = None,
    decode: Annotated[
        str,
        typer.Option(
            "--decode",
            help="schema: add value/decode_error columns decoded with the topic's registered "
            "Avro or JSON Schema (docs/spark.md); none: payloads only.",
        ),
    ] = "none",
    master: Master = None,
    spark_log: SparkLog = DEFAULT_SPARK_LOG,
    json_output: Json = False,
) -> None:
    """Write a topic's history (or a range) to Parquet, partitioned by partition and date."""
    from danube.spark.outputs import exists_error
    from danube.spark.parquet import MODES, backfill_to_parquet

    chosen = next((m for m in MODES if m == mode), None)
    if chosen is None:
        raise typer.BadParameter(f"one of {', '.join(MODES)}", param_hint="--mode")
    options = _source_options(
        topic, config, etcd, prefix, start_offset, end_offset, start_time, end_time
    )
    options["decode"] = decode
    if chosen == "error" and _local_path_exists(output):
        # Said before Spark starts; a path of another filesystem is checked by the job.
        exists = exists_error(output)
        raise fail("backfill parquet", f"{exists.code}: {exists.message}")
    _check("parquet", options)
    spark = _session(master, spark_log)
    try:
        result = _guard(
            "parquet",
            lambda: backfill_to_parquet(spark, options, output, mode=chosen),
        )
    finally:
        spark.stop()
    summary = {
        "topic": topic,
        "output": output,
        "messages": result.messages,
        "seconds": round(result.seconds, 3),
        "messages_per_s": round(result.messages_per_s, 1),
    }
    if json_output:
        print_json(summary)
    else:
        out.print(
            f"{result.messages} messages of {topic} written to {output} in "
            f"{result.seconds:.2f} s ({result.messages_per_s:,.0f} msg/s)"
        )


# The backfill topic command's options.
ToOption = Annotated[str, typer.Option("--to", help="Target topic: /<ns>/<topic>.")]
NameOption = Annotated[
    str | None,
    typer.Option("--name", help="Names the checkpoints (default: from source and target)."),
]
BatchOption = Annotated[
    int, typer.Option("--batch", min=1, max=10_000, help="Messages per checkpointed batch.")
]
ProducerOption = Annotated[str, typer.Option("--producer", help="Producer name.")]
OriginOption = Annotated[
    bool,
    typer.Option(
        "--origin/--no-origin",
        help="Add danube.backfill.source and .offset attributes to each message.",
    ),
]
CheckpointDirOption = Annotated[
    str | None,
    typer.Option(
        "--checkpoint-dir", help="Keep checkpoints in this directory (default: the bucket)."
    ),
]
RestartOption = Annotated[
    bool, typer.Option("--restart", help="Forget the checkpoints of this name; send all.")
]


@app.command("topic")
def topic_backfill(
    topic: SourceTopic,
    to: ToOption,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    name: NameOption = None,
    batch: BatchOption = 1000,
    producer: ProducerOption = "backfill",
    origin: OriginOption = True,
    checkpoint_dir: CheckpointDirOption = None,
    restart: RestartOption = False,
    config: Config = None,
    etcd: Etcd = None,
    prefix: Prefix = None,
    start_offset: StartOffset = None,
    end_offset: EndOffset = None,
    start_time: StartTime = None,
    end_time: EndTime = None,
    master: Master = None,
    spark_log: SparkLog = DEFAULT_SPARK_LOG,
    json_output: Json = False,
) -> None:
    """Produce a topic's history (or a range) into a topic, in batches; safe to re-run."""
    from danube.names import InvalidNameError, TopicName
    from danube.spark.to_topic import TopicBackfillJob, backfill_to_topic, default_name

    options = _source_options(
        topic, config, etcd, prefix, start_offset, end_offset, start_time, end_time
    )
    _check("topic", options)
    try:
        source, target = TopicName.parse(topic).parent, TopicName.parse(to)
    except InvalidNameError as exc:
        raise typer.BadParameter(exc.message) from None
    job = _guard(
        "topic",
        lambda: TopicBackfillJob(
            source_options=options,
            target=target,
            url=service_addr,
            name=name or default_name(source, target),
            batch_messages=batch,
            producer=producer,
            origin_attributes=origin,
            checkpoint_dir=checkpoint_dir,
            restart=restart,
        ),
    )
    spark = _session(master, spark_log)
    try:
        result = _guard("topic", lambda: backfill_to_topic(spark, job))
    finally:
        spark.stop()
    summary = {
        "topic": topic,
        "to": to,
        "name": job.name,
        "sent": result.sent,
        "skipped": result.skipped,
        "partitions": result.partitions,
        "seconds": round(result.seconds, 3),
    }
    if json_output:
        print_json(summary)
    else:
        out.print(
            f"{result.sent} messages of {topic} sent to {to} ({result.skipped} already sent "
            f"before, {result.partitions} partitions) in {result.seconds:.2f} s"
        )


# The backfill iceberg command's options.
TableOption = Annotated[
    str, typer.Option("--table", help="The Iceberg table, <namespace>.<table> (made if new).")
]
WarehouseOption = Annotated[
    Path,
    typer.Option(
        "--warehouse",
        help="Directory of the default catalog (SQL, sqlite file catalog.db) and its tables.",
    ),
]
CatalogNameOption = Annotated[
    str, typer.Option("--catalog", help="Catalog name (pyiceberg's configuration).")
]
CatalogPropertiesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--catalog-property",
        help="KEY=VALUE of pyiceberg's catalog (repeatable), e.g. type=rest uri=http://...; "
        "replaces the default SQL catalog.",
    ),
]
DecodeOption = Annotated[
    str,
    typer.Option("--decode", help="schema: add the typed value column (as for parquet)."),
]


@app.command("iceberg")
def iceberg(
    topic: SourceTopic,
    table: TableOption,
    warehouse: WarehouseOption = Path("danube-data/iceberg"),
    catalog_name: CatalogNameOption = "danube",
    catalog_properties: CatalogPropertiesOption = None,
    config: Config = None,
    etcd: Etcd = None,
    prefix: Prefix = None,
    decode: DecodeOption = "none",
    master: Master = None,
    spark_log: SparkLog = DEFAULT_SPARK_LOG,
    json_output: Json = False,
) -> None:
    """Keep an Iceberg table in step with a topic: add the offsets uploaded since its last
    commit, each once (docs/spark.md, "Iceberg table")."""
    try:
        from danube.spark.iceberg import catalog, sql_catalog_properties, sync_to_iceberg
    except ImportError as exc:
        raise fail(
            "backfill iceberg",
            f"needs the iceberg extra (pip install 'danube-mesh[iceberg]'): {exc}",
        ) from None
    properties: dict[str, str] = {}
    for item in catalog_properties or []:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise typer.BadParameter(f"KEY=VALUE, not {item!r}", param_hint="--catalog-property")
        properties[key] = value
    if not properties:
        properties = sql_catalog_properties(str(warehouse))
    options = _source_options(topic, config, etcd, prefix, None, None, None, None)
    options["decode"] = decode
    _check("iceberg", options)
    iceberg = _guard("iceberg", lambda: catalog(catalog_name, properties))
    spark = _session(master, spark_log)
    try:
        result = _guard("iceberg", lambda: sync_to_iceberg(spark, options, table, iceberg))
    finally:
        spark.stop()
    ranges = {str(p): list(r) for p, r in result.ranges.items()}
    summary = {
        "topic": topic,
        "table": table,
        "messages": result.rows,
        "ranges": ranges,
        "snapshot_id": result.snapshot_id,
        "seconds": round(result.seconds, 3),
    }
    if json_output:
        print_json(summary)
    elif not result.rows:
        out.print(f"nothing new in {topic} for {table}")
    else:
        shown = ", ".join(f"partition {p} [{a}, {b})" for p, (a, b) in ranges.items())
        out.print(
            f"{result.rows} messages of {topic} committed to {table} ({shown}) in "
            f"{result.seconds:.2f} s, snapshot {result.snapshot_id}"
        )


def main(command: str) -> None:
    """Entry of the ``spark-submit`` scripts: ``danube backfill <command>`` with the
    script's arguments."""
    app(args=[command, *sys.argv[1:]], prog_name=f"backfill_{command}.py")
