"""Fault: the leader alone cut off from etcd (a black-holing TCP proxy in front of its etcd
endpoint), its followers and the bus untouched, under load at factor 3 / min in-sync 2. It
serves on without its lease while its followers confirm it; a follower claims the next epoch
once the grace is over, and from then on the old leader acknowledges nothing: no offset is
acknowledged with two payloads, nothing acknowledged is lost, and the old leader follows the
new one once its etcd is back (docs/replication.md, "Serving through an etcd outage")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx
import pytest

from danube.bus import TopicName
from danube.meta import MetaStore
from danube.up import ProcessSpec, free_port
from tests.history import History

from replication import (
    NODE_ENV,
    Cluster,
    TimedProducer,
    connect,
    leader,
    new_leader,
    read_all,
    wait_isr,
)

SpecFactory = Callable[..., ProcessSpec]

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(180)]

P = TopicName("default", "cut-part-0")
CUT_S = 12.0  # past the lease (2 s) and the followers' hold (2 x 2 s): a new epoch begins


class BlackHole:
    """A TCP proxy to ``target`` that can stop forwarding (bytes vanish both ways, nothing
    is closed: a network partition as the client sees it) and forward again (every old
    connection is closed then, so the client reconnects)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        self._drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def heal(self) -> None:
        self.cut = False
        self._drop_all()

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            w.close()
            self._writers.discard(w)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self.cut:
                continue  # black-holed
            writer.write(data)
            await writer.drain()


async def test_a_leader_cut_from_etcd_never_acknowledges_beside_its_successor(
    spec_for: SpecFactory,
    tmp_path_factory: pytest.TempPathFactory,
    etcd_endpoint: str,
    nats_url: str,
    store: MetaStore,
) -> None:
    etcd_port = int(etcd_endpoint.rsplit(":", 1)[1])
    holes = {f"ingest-{i}": BlackHole(etcd_port) for i in range(3)}
    for hole in holes.values():
        await hole.start()
    env = {
        **NODE_ENV,
        "DANUBE_INGEST__REPLICATION_FACTOR": "3",
        "DANUBE_INGEST__MIN_INSYNC_REPLICAS": "2",
    }
    specs = {
        node: spec_for(
            "ingest",
            node,
            **env,
            DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT=f"127.0.0.1:{hole.port}",
        )
        for node, hole in holes.items()
    }
    nodes = Cluster(specs, tmp_path_factory.mktemp("cut"))
    history = History()
    bus, client = await connect(nats_url, "cut-leader")
    producer = TimedProducer(client, P, history, prefix="m", timeout_s=3.0)
    stop = asyncio.Event()
    try:
        for node in specs:
            await asyncio.to_thread(nodes.start, node)
        for _ in range(10):
            await producer.send_one()
        await wait_isr(store, P, 3)
        old = await leader(store, P)
        running = asyncio.create_task(producer.run(stop))
        await asyncio.sleep(1.0)
        loop = asyncio.get_running_loop()
        cut_at = loop.time()
        holes[old.node_id].cut = True
        elected = await new_leader(store, P, old.epoch, timeout_s=CUT_S + 10)
        elected_at = loop.time()
        assert elected.node_id != old.node_id
        await asyncio.sleep(max(0.0, cut_at + CUT_S - loop.time()))
        leaseless_acks = await _metric(specs[old.node_id], "danube_ingest_leaseless_acks_total")
        holes[old.node_id].heal()
        await wait_isr(store, P, 3, timeout_s=30)  # the old leader follows and is back in sync
        await asyncio.sleep(1.0)
        stop.set()
        await running

        acked = [s for s in producer.sends if s.offset is not None]
        after_claim = [s for s in acked if s.started > elected_at + 0.5]
        print(
            f"leader {old.node_id} cut from etcd: {len(acked)} acknowledged, "
            f"{leaseless_acks:.0f} of them by it without its lease; {elected.node_id} led "
            f"epoch {elected.epoch} {elected_at - cut_at:.1f}s after the cut"
        )
        assert leaseless_acks > 0  # it did serve on through its own etcd outage
        assert after_claim, "produce went on under the new leader"
        offsets = await read_all(client, P, history)
        assert offsets == list(range(len(offsets)))
        report = history.check(expect_contiguous_from={str(P): 0})
        assert report.ok, report.summary()  # no conflict, nothing acknowledged lost
    finally:
        stop.set()
        await bus.close()
        nodes.stop_all()
        for hole in holes.values():
            with contextlib.suppress(Exception):
                await hole.close()


async def _metric(spec: ProcessSpec, name: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{spec.port}/metrics", timeout=5)).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")
