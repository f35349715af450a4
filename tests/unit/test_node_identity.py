"""Node ids for replicas: slots (lowest free, held by flock, freed with the process), the
id precedence of node_id_for, and the health file the container healthcheck reads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from danube.runtime import healthcheck
from danube.runtime.service import node_id_for
from danube.runtime.slots import SlotError, claim_slot

pytestmark = pytest.mark.unit


def test_replicas_take_the_lowest_free_slots_and_a_released_one_is_taken_again(
    tmp_path: Path,
) -> None:
    first = claim_slot(tmp_path / "slots", "ingest")
    second = claim_slot(tmp_path / "slots", "ingest")
    other_kind = claim_slot(tmp_path / "slots", "dispatcher")
    assert (first.node_id, second.node_id, other_kind.node_id) == (
        "ingest-0",
        "ingest-1",
        "dispatcher-0",
    )
    first.release()
    first.release()  # idempotent
    again = claim_slot(tmp_path / "slots", "ingest")
    assert again.node_id == "ingest-0"  # the restarted replica is the same node again
    assert claim_slot(tmp_path / "slots", "ingest").node_id == "ingest-2"


def test_a_slot_held_by_another_process_is_skipped_and_freed_when_it_dies(
    tmp_path: Path,
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from pathlib import Path
                from danube.runtime.slots import claim_slot
                slot = claim_slot(Path({str(tmp_path)!r}), "ingest")
                print(slot.node_id, flush=True)
                sys.stdin.read()  # hold it until told to go
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ingest-0"
        mine = claim_slot(tmp_path, "ingest")
        assert mine.node_id == "ingest-1"
        assert "pid" in (tmp_path / "ingest-0.lock").read_text()  # who holds it, for people
    finally:
        holder.kill()  # a crash: the kernel drops the lock
        holder.wait(10)
    assert claim_slot(tmp_path, "ingest").node_id == "ingest-0"


def test_no_free_slot_is_an_error(tmp_path: Path) -> None:
    held = [claim_slot(tmp_path, "uploader", slots_max=2) for _ in range(2)]
    with pytest.raises(SlotError, match="all 2 slots of uploader"):
        claim_slot(tmp_path, "uploader", slots_max=2)
    assert [slot.node_id for slot in held] == ["uploader-0", "uploader-1"]


def test_an_unusable_slot_directory_is_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SlotError, match="slot directory"):
        claim_slot(blocker / "slots", "ingest")


def test_node_id_comes_from_the_variable_then_a_slot_then_the_host_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DANUBE_NODE_ID", "ingest-a")
    monkeypatch.setenv("DANUBE_NODE_SLOTS", str(tmp_path))
    assert node_id_for("ingest") == ("ingest-a", None)
    monkeypatch.delenv("DANUBE_NODE_ID")
    node_id, slot = node_id_for("ingest")
    assert node_id == "ingest-0"
    assert slot is not None
    assert slot.path == tmp_path / "ingest-0.lock"
    monkeypatch.delenv("DANUBE_NODE_SLOTS")
    monkeypatch.setattr("socket.gethostname", lambda: "box")
    assert node_id_for("ingest") == ("ingest-box", None)


def test_probe_url_reaches_a_wildcard_bind_through_loopback() -> None:
    assert healthcheck.probe_url("0.0.0.0", 9100) == "http://127.0.0.1:9100/readyz"
    assert healthcheck.probe_url("127.0.0.2", 1) == "http://127.0.0.2:1/readyz"
    assert healthcheck.probe_url("::1", 5, "/healthz") == "http://[::1]:5/healthz"


def test_the_health_file_is_written_only_when_named_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DANUBE_HEALTH_FILE", raising=False)
    assert healthcheck.write_health_file("n", "http://127.0.0.1:1/readyz") is None
    path = tmp_path / "run" / "health.json"
    monkeypatch.setenv("DANUBE_HEALTH_FILE", str(path))
    assert healthcheck.write_health_file("dispatcher-1", "http://127.0.0.1:2/readyz") == path
    assert json.loads(path.read_text()) == {
        "node_id": "dispatcher-1",
        "url": "http://127.0.0.1:2/readyz",
    }
    assert healthcheck.read_health_url(path) == "http://127.0.0.1:2/readyz"
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no health file"),
        ("{", "not a health file"),
        ('{"node_id": "x"}', "not a health file"),
        ('{"url": "file:///etc/passwd"}', "bad url"),
        ("x" * 5000, "over 4096 bytes"),
    ],
)
def test_the_healthcheck_is_unhealthy_without_a_good_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, problem: str
) -> None:
    path = tmp_path / "health.json"
    if content is not None:
        path.write_text(content)
    assert healthcheck.main(["--file", str(path)]) == 1
    assert problem in capsys.readouterr().err


def test_the_healthcheck_needs_a_file_or_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DANUBE_HEALTH_FILE", raising=False)
    assert healthcheck.main([]) == 1
    assert "DANUBE_HEALTH_FILE" in capsys.readouterr().err
