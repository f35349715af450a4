"""How people meet the project, end to end on the whole mesh:

- the README quickstart block, run as written (``make run`` in the background, then the
  ``danube`` commands; only the ports are moved to free ones through the environment);
- the same round trip on ``danube up --scale ingest=2 --scale dispatcher=2 --scale
  cloud_reader=2``;
- under ``make run``, each kind of service process killed with SIGKILL in turn: the
  supervisor brings it back and every acknowledged message is still delivered.

Each test ends with Ctrl-C (SIGINT to the process group) and checks no process is left."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from meshrun import ROOT, MeshRun

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

QUICKSTART = re.compile(r"<!-- quickstart -->\s*```sh\n(.*?)```", re.S)
SERVICES = ("ingest", "dispatcher", "discovery", "uploader", "cloud_reader", "retention")


def _quickstart() -> list[str]:
    match = QUICKSTART.search((ROOT / "README.md").read_text())
    assert match, "README.md has no quickstart block"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def _ok(mesh: MeshRun, command: str) -> str:
    result = mesh.run(command)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_readme_quickstart_as_written(mesh_run: Callable[..., MeshRun]) -> None:
    lines = _quickstart()
    assert lines[0] == "make run"
    mesh = mesh_run()  # make run (data and ports moved, the command as written)
    mesh.wait_ready()
    produce, consume = lines[1], lines[2]
    produced = _ok(mesh, produce).splitlines()
    assert produced == [f"/default/orders {i}" for i in range(1000)]
    consumed = _ok(mesh, consume).splitlines()
    assert consumed == [f"[/default/orders@{i}] hello" for i in range(1000)]
    mesh.interrupt()


def test_the_round_trip_on_a_scaled_mesh(mesh_run: Callable[..., MeshRun]) -> None:
    mesh = mesh_run(
        "--scale", "ingest=2", "--scale", "dispatcher=2", "--scale", "cloud_reader=2", make=False
    )  # fmt: skip
    mesh.wait_ready()
    assert len(mesh.services("ingest")) == 2
    assert len(mesh.services("dispatcher")) == 2
    assert len(mesh.services("cloud_reader")) == 2
    produced = _produced(_ok(mesh, "danube produce -t /default/wide -p 3 -m m -c 1000"))
    assert len(produced) == 1000
    consumed = _consumed(
        _ok(mesh, "danube consume -t /default/wide -m s --start earliest -c 1000 --json")
    )
    assert sorted(consumed) == sorted(produced)
    for partition in {p for p, _ in produced}:  # in order within each partition
        offsets = [o for p, o in consumed if p == partition]
        assert offsets == sorted(offsets)
    cluster = json.loads(_ok(mesh, "danube admin cluster --json"))["nodes"]
    assert len(cluster["ingest"]) == 2
    assert len(cluster["dispatcher"]) == 2
    mesh.interrupt()


def test_a_killed_service_comes_back_and_nothing_acked_is_lost(
    mesh_run: Callable[..., MeshRun],
) -> None:
    mesh = mesh_run()
    mesh.wait_ready()
    produced: set[tuple[str, int]] = set()
    for round_, kind in enumerate(SERVICES):
        produced |= _produced(_ok(mesh, f"danube produce -t /default/kill -p 2 -m r{round_} -c 50"))
        (victim,) = mesh.services(kind)
        mesh.run(f"kill -9 {victim}")
        _wait_back(mesh, kind, victim)
    produced |= _produced(_ok(mesh, "danube produce -t /default/kill -p 2 -m last -c 50"))
    consumed = _consumed(
        _ok(
            mesh, f"danube consume -t /default/kill -m s --start earliest -c {len(produced)} --json"
        )
    )
    assert set(consumed) == produced  # every acknowledged message, each once here
    assert len(consumed) == len(produced)
    assert "restart" in mesh.log().lower()
    mesh.interrupt()


def _wait_back(mesh: MeshRun, kind: str, victim: int, timeout_s: float = 60.0) -> None:
    """Until a new process of ``kind`` runs and the mesh answers a produce again."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = mesh.services(kind)
        if pids and victim not in pids:
            break
        assert time.monotonic() < deadline, f"{kind} did not come back\n{mesh.log()[-3000:]}"
        time.sleep(0.2)


def _produced(stdout: str) -> set[tuple[str, int]]:
    pairs = set()
    for line in stdout.splitlines():
        partition, offset = line.split()
        pairs.add((partition, int(offset)))
    return pairs


def _consumed(stdout: str) -> list[tuple[str, int]]:
    return [(m["partition"], m["offset"]) for m in map(json.loads, stdout.splitlines())]


def test_the_quickstart_block_is_what_the_readme_shows() -> None:
    lines = _quickstart()
    assert lines[0] == "make run"
    assert all(line.startswith(".venv/bin/danube ") for line in lines[1:])
    assert Path(ROOT / "Makefile").read_text().count("run:") >= 1
