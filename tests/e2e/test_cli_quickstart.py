"""The CLI against a whole mesh started by `danube up`: keyed produce lands in one partition
in order, consume from earliest gets exactly that, the cluster lists the services, and
`danube bench e2e` delivers every message it produced; Ctrl-C stops everything."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from meshrun import MeshRun

pytestmark = pytest.mark.e2e


def test_up_then_produce_consume_admin_and_bench_with_the_cli(
    mesh_run: Callable[..., MeshRun],
) -> None:
    mesh = mesh_run(make=False)
    mesh.wait_ready()
    produced = mesh.run("danube produce -t /default/quick -p 2 -m hi -c 200 --key k")
    assert produced.returncode == 0, produced.stderr
    lines = produced.stdout.splitlines()
    assert len(lines) == 200
    assert len({line.split()[0] for line in lines}) == 1  # one key, one partition
    assert [int(line.split()[1]) for line in lines] == list(range(200))

    consumed = mesh.run("danube consume -t /default/quick -m s --start earliest -c 200 --json")
    assert consumed.returncode == 0, consumed.stderr
    got = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(m["offset"], m["payload"], m["key"]) for m in got] == [
        (i, "hi", "k") for i in range(200)
    ]

    cluster = mesh.run("danube admin cluster --json")
    assert cluster.returncode == 0, cluster.stderr
    nodes = json.loads(cluster.stdout)["nodes"]
    assert {"discovery", "ingest", "dispatcher"} <= {k for k, v in nodes.items() if v}

    bench = mesh.run("danube bench e2e -n 2000 --size 200 --json")
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout)
    assert (result["produced"], result["consumed"], result["missing"]) == (2000, 2000, 0)
    mesh.interrupt()
