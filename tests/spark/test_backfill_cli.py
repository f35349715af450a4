"""The backfills as users start them, in processes of their own: `danube backfill parquet`
(given only etcd: the object store is the one the cluster recorded there) and `danube
backfill topic` (Spark started by the command) and `spark-submit
spark_jobs/backfill_parquet.py`, over a tier in real etcd and files: what they write and
print, and one clear line with exit code 1 for an unknown topic, a bad option, an output
that exists or an object that is not where the store says (found before Spark starts)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import yaml

from danube.bus import Bus
from danube.config import (
    BusConfig,
    CloudConfig,
    DanubeSettings,
    DiscoveryConfig,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.config.wal_cloud import FsCloud
from danube.discovery import app as discovery_app
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.names import TopicName
from danube.runtime.service import run_in_process
from danube.storage import ObjectStore
from danube.up import free_port
from danube.uploader.record import record_object_store
from danube.wire.ingest.client import IngestClient

from tiers import write_tier

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
SOURCE = TopicName("default", "clicks")
COUNTS = [700, 500]
COMMAND_TIMEOUT_S = 180.0
SHORT_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture
def cloud_config(tmp_path: Path) -> CloudConfig:
    """Files only: these tests are about how the jobs start, not about backends."""
    return FsCloud(backend="fs", root=str(tmp_path / "objects"))


@pytest.fixture
async def tier(store: MetaStore, cloud_config: CloudConfig) -> None:
    await write_tier(store, ObjectStore.from_config(cloud_config), SOURCE, COUNTS, per_object=300)


async def _run(*argv: str) -> tuple[int, str, str]:
    """Run a command; its exit code, stdout and stderr."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    # spark-submit starts the Python driver and workers with $PYSPARK_PYTHON (docs/spark.md).
    env["PYSPARK_PYTHON"] = sys.executable
    # Each command starts a JVM for a job of seconds: compiling only with C1 and one GC thread
    # starts and finishes it about a third sooner on a small machine (what the job does is the
    # same). spark-submit adds $SPARK_SUBMIT_OPTS to the driver JVM's options.
    env.setdefault("SPARK_SUBMIT_OPTS", SHORT_JVM_OPTS)
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _rows(output: Path) -> list[tuple[int, int]]:
    table = pads.dataset(output, format="parquet", partitioning="hive").to_table()
    partitions = [int(p) for p in table.column("partition").to_pylist()]
    return sorted(zip(partitions, table.column("offset").to_pylist(), strict=True))


EVERY_ROW = [(p, offset) for p, count in enumerate(COUNTS) for offset in range(count)]


async def test_danube_backfill_parquet_given_only_etcd_writes_the_topic_and_a_summary(
    tier: None,
    store: MetaStore,
    cloud_config: CloudConfig,
    etcd_endpoint: str,
    meta_prefix: str,
    tmp_path: Path,
) -> None:
    # What every uploader does at start: the object store is then found through etcd.
    await record_object_store(store, cloud_config, "uploader-cli")
    output = tmp_path / "out"
    code, out, err = await _run(
        str(BIN / "danube"), "backfill", "parquet", "-t", str(SOURCE), "-o", str(output),
        "--etcd", etcd_endpoint, "--prefix", meta_prefix,
        "--master", "local[1]", "--start-offset", "100", "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    assert summary["messages"] == sum(COUNTS) - 200
    assert summary["output"] == str(output)
    assert summary["messages_per_s"] > 0
    assert _rows(output) == [row for row in EVERY_ROW if row[1] >= 100]


async def test_spark_submit_runs_the_parquet_backfill(
    tier: None, config_file: Path, tmp_path: Path
) -> None:
    output = tmp_path / "submitted"
    code, out, err = await _run(
        str(BIN / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
        "spark_jobs/backfill_parquet.py",
        "--topic", str(SOURCE), "--output", str(output), "--config", str(config_file), "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["messages"] == sum(COUNTS)
    assert _rows(output) == EVERY_ROW


async def test_an_unknown_topic_a_bad_option_or_a_wrong_root_is_one_line_and_exit_code_1(
    tier: None, config_file: Path, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> None:
    code, out, err = await _run(
        str(BIN / "danube"), "backfill", "parquet", "-t", "/default/nope",
        "-o", str(tmp_path / "x"), "-c", str(config_file), "--master", "local[1]",
    )  # fmt: skip
    assert code == 1
    assert out == ""
    assert "danube backfill parquet: topic_not_readable: topic /default/nope: no such topic" in err
    assert "Traceback" not in err
    code, out, err = await _run(
        str(BIN / "danube"), "backfill", "parquet", "-t", str(SOURCE), "-o", str(tmp_path / "x"),
        "-c", str(config_file), "--start-time", "yesterday",
    )  # fmt: skip
    assert code == 1
    assert err.strip() == (
        "danube backfill parquet: invalid_option: option 'start_time': 'yesterday' is "
        "neither milliseconds nor an ISO 8601 time"
    )
    taken = tmp_path / "taken"
    taken.mkdir()
    code, out, err = await _run(
        str(BIN / "danube"), "backfill", "parquet", "-t", str(SOURCE), "-o", str(taken),
        "-c", str(config_file),
    )  # fmt: skip
    assert code == 1
    assert err.strip() == (
        f"danube backfill parquet: invalid_option: option 'output': {taken} already exists "
        "(--mode overwrite replaces it, --mode append adds to it)"
    )
    elsewhere = tmp_path / "elsewhere"
    wrong = tmp_path / "wrong.yml"
    metadata = {"etcd_endpoint": etcd_endpoint, "prefix": meta_prefix}
    cloud = {"backend": "fs", "root": str(elsewhere)}
    wrong.write_text(yaml.safe_dump({"wal_cloud": {"metadata": metadata, "cloud": cloud}}))
    code, out, err = await _run(
        str(BIN / "danube"), "backfill", "parquet", "-t", str(SOURCE), "-o", str(tmp_path / "x"),
        "-c", str(wrong),
    )  # fmt: skip
    assert code == 1
    first = f"danube-data/topics/default/clicks-part-0/{0:020}-{299:020}.dnb"
    assert err.strip() == (
        f"danube backfill parquet: object_not_found: object not found: '{first}' in "
        f"fs:{elsewhere} (as configured)"
    )


async def test_danube_backfill_topic_sends_then_a_rerun_sends_nothing(
    tier: None,
    config_file: Path,
    bus: Bus,
    nats_url: str,
    etcd_endpoint: str,
    meta_prefix: str,
    tmp_path: Path,
) -> None:
    settings = DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=tmp_path / "wal"),
            metadata=MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        discovery=DiscoveryConfig(port=free_port(), grpc_port=0, lease_ttl_s=3),
    )
    command = [
        str(BIN / "danube"), "backfill", "topic", "-t", str(SOURCE), "--to", "/default/copy",
        "-s", f"http://127.0.0.1:{settings.discovery.port}", "-c", str(config_file),
        "--checkpoint-dir", str(tmp_path / "checkpoints"), "--master", "local[1]", "--json",
    ]  # fmt: skip
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-cli"),
        run_in_process(discovery_app.serve, settings, "disc-cli"),
    ):
        code, out, err = await _run(*command)
        assert code == 0, err
        summary = json.loads(out)
        assert (summary["sent"], summary["skipped"], summary["partitions"]) == (1200, 0, 2)
        assert summary["name"] == "default-clicks--default-copy"
        code, out, err = await _run(*command)
        assert code == 0, err
        assert (json.loads(out)["sent"], json.loads(out)["skipped"]) == (0, 1200)
        # Auto-created without partitions: everything in one, as sent.
        reply = await IngestClient(bus).fetch(TopicName("default", "copy"), 0, max_count=5000)
        assert len(reply.frames) == 1200
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").rglob("*.json"))
    assert checkpoints == ["clicks-part-0.json", "clicks-part-1.json"]
