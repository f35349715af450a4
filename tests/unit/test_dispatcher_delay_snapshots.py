"""Delay snapshots without servers: the format (round trip, a torn or flipped object is
refused), the resume plan (which ranges come from snapshots, which from the log), and an
index that seals as it reads and a second one that resumes from its snapshots: every
delayed message not acked comes once, never early, the log read again only past the last
seal (or over a snapshot that fails its check); and the I/O edge over an in-memory store."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import opendal
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delay_snapshots import DelaySnapshots
from danube.dispatcher.delayed import BUCKET_MS, DelayedMessages
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import (
    Ack,
    ConsumerAttached,
    Deliver,
    FlushCursor,
    MessagesAvailable,
    Poll,
    Tick,
)
from danube.dispatcher.sealed import SealBuffer, Sealed, garbage, plan_resume
from danube.dispatcher.snapshot import (
    RECORD,
    CorruptSnapshotError,
    SnapshotHead,
    check_bucket,
    encode_snapshot,
    read_head,
    records,
)
from danube.frame import RawFrame, Record, encode_frame, encode_record
from danube.meta.records import DelaySnapshotRef
from danube.storage import ObjectNotFoundError, ObjectStore
from danube.wire.delay import DELIVER_AT_ATTRIBUTE

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000


def frame(offset: int, due_ms: int | None = None) -> RawFrame:
    attributes = {} if due_ms is None else {DELIVER_AT_ATTRIBUTE: str(due_ms)}
    record = encode_record(
        Record(payload=b"x", publish_time_ms=T0, producer="p", attributes=attributes)
    )
    return RawFrame(offset, memoryview(encode_frame(offset, record)))


def ref_of(sealed: Sealed, key: str) -> DelaySnapshotRef:
    return DelaySnapshotRef(
        key=key,
        from_offset=sealed.from_offset,
        to_offset=sealed.to_offset,
        due_max_ms=sealed.due_max_ms,
        head_bytes=sealed.head_bytes,
        size_bytes=len(sealed.data),
    )


# --- the format ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 10_000),
        st.lists(st.tuples(st.integers(0, 999), st.binary(max_size=40)), min_size=1, max_size=6),
        min_size=1,
        max_size=12,
    )
)
def test_a_snapshot_reads_back_bucket_by_bucket(
    buckets: dict[int, list[tuple[int, bytes]]],
) -> None:
    data: dict[int, bytes] = {}
    wanted: dict[int, list[tuple[int, int, int, bytes]]] = {}
    offset = 0
    for bucket, messages in buckets.items():
        parts = []
        for within, body in messages:
            due = bucket * BUCKET_MS + within
            parts.append(RECORD.pack(due, 0, offset, len(body)) + body)
            wanted.setdefault(bucket, []).append((due, 0, offset, body))
            offset += 1
        data[bucket] = b"".join(parts)
    dues = [due for found in wanted.values() for due, *_ in found]
    counts = {bucket: len(messages) for bucket, messages in buckets.items()}
    blob = encode_snapshot(5, 5 + offset + 1, data, counts, (min(dues), max(dues)))
    head = read_head(blob[: read_head(blob).head_bytes])
    assert (head.from_offset, head.to_offset, head.count) == (5, 6 + offset, offset)
    assert head.size_bytes == len(blob)
    assert [entry.bucket for entry in head.buckets] == sorted(buckets)
    for entry in head.buckets:
        part = check_bucket(entry, blob[entry.position : entry.position + entry.length])
        assert list(records(part)) == wanted[entry.bucket]
        assert entry.count == len(wanted[entry.bucket])


def test_a_torn_or_flipped_snapshot_is_refused() -> None:
    body = RECORD.pack(T0, 0, 7, 3) + b"abc"
    blob = encode_snapshot(0, 10, {T0 // BUCKET_MS: body}, {T0 // BUCKET_MS: 1}, (T0, T0))
    head = read_head(blob)
    (entry,) = head.buckets
    for torn in (blob[:10], blob[: head.head_bytes - 1]):
        with pytest.raises(CorruptSnapshotError):
            read_head(torn)
    with pytest.raises(CorruptSnapshotError):  # cut in the body: the bucket is short
        check_bucket(entry, blob[entry.position : entry.position + entry.length - 1])
    for at in (20, head.head_bytes - 2):  # a bit flipped in the head, in the table
        flipped = bytearray(blob)
        flipped[at] ^= 0x10
        with pytest.raises(CorruptSnapshotError):
            read_head(bytes(flipped))
    flipped = bytearray(blob)
    flipped[entry.position + 2] ^= 0x10  # in the body: its bucket's crc
    with pytest.raises(CorruptSnapshotError):
        check_bucket(entry, bytes(flipped[entry.position : entry.position + entry.length]))
    with pytest.raises(CorruptSnapshotError):
        read_head(b"XXXX" + blob[4:])


# --- the resume plan -------------------------------------------------------------------------


def ref(start: int, end: int, due_max_ms: int = T0 + 60_000) -> DelaySnapshotRef:
    return DelaySnapshotRef(
        key=f"k{start}", from_offset=start, to_offset=end, due_max_ms=due_max_ms,
        head_bytes=1, size_bytes=1,
    )  # fmt: skip


def test_the_plan_loads_what_snapshots_cover_and_reads_the_rest_from_the_log() -> None:
    chain = [ref(0, 100), ref(100, 200), ref(250, 300), ref(300, 400, due_max_ms=T0)]
    plan = plan_resume(150, 380, T0 + 1000, chain)
    # [0, 100) is wholly below delay_from, [300, 400) holds nothing due at the bound.
    assert [r.key for r in plan.garbage] == ["k0", "k300"]
    # Trimmed to what they give: from delay_from, below the stored next offset.
    assert [(r.from_offset, r.to_offset) for r in plan.load] == [(150, 200), (250, 300)]
    # A hole is read from the log; [300, 380) not: nothing there is due at the bound.
    assert plan.reread == [(200, 250)]
    tail = plan_resume(150, 450, T0 + 1000, chain[:3])
    assert tail.reread == [(200, 250), (300, 450)]  # and the tail past the last seal
    whole = plan_resume(0, 500, None, [])
    assert (whole.load, whole.reread) == ([], [(0, 500)])  # no snapshots: the log, as before
    none = plan_resume(None, 500, None, chain)
    assert (none.load, none.reread, len(none.garbage)) == ([], [], 4)
    past = plan_resume(120, 180, None, [ref(100, 300)])
    assert [(r.from_offset, r.to_offset) for r in past.load] == [(120, 180)]


def test_garbage_is_what_holds_nothing_still_delayed() -> None:
    chain = [ref(0, 100), ref(100, 200, due_max_ms=T0 + 5), ref(200, 300)]
    assert [r.key for r in garbage(chain, 100, T0 + 10)] == ["k0", "k100"]
    assert garbage(chain, None, None) == chain
    assert garbage(chain, 0, None) == []


# --- sealing and resuming through the index ---------------------------------------------------


def _seal_all(
    index: DelayedMessages, log: Sequence[tuple[int, int | None]], every: int
) -> dict[str, bytes]:
    """File ``log`` (offset, due) as the usual reader does, sealing every ``every`` offsets;
    the objects written, by key (each referenced once "written")."""
    objects: dict[str, bytes] = {}
    index.sealing = True
    index.start_sealing("p0", 0)
    for offset, due in log:
        if due is not None:
            index.file("p0", offset, due, frame(offset, due))
        if (offset + 1) % every == 0:
            sealed = index.seal("p0", offset + 1)
            if sealed is not None:
                key = f"s{sealed.from_offset}"
                objects[key] = sealed.data
                assert index.sealed(sealed, ref_of(sealed, key))
    return objects


def _resume(
    state_from: int, next_offset: int, bound: int, chain: tuple[DelaySnapshotRef, ...],
    objects: dict[str, bytes],
) -> DelayedMessages:  # fmt: skip
    index = DelayedMessages()
    plan = plan_resume(state_from, next_offset, bound, chain)
    heads: dict[str, SnapshotHead] = {}
    for r in plan.load:
        with contextlib.suppress(CorruptSnapshotError):  # missing or torn: the log
            heads[r.key] = read_head(objects.get(r.key, b"")[: r.head_bytes])
    index.resume_from("p0", plan, heads, bound)
    return index


def _drain(
    index: DelayedMessages, objects: dict[str, bytes], log: dict[int, int | None], now: int,
    end_ms: int,
) -> dict[int, int]:  # fmt: skip
    """Run the resumed index to ``end_ms`` as the runtime does (loads, rescans, takes):
    offset -> the time it was handed out."""
    got: dict[int, int] = {}
    while now < end_ms:
        now += 20
        for part in index.wanted(now):
            blob = objects.get(part.key, b"")
            e = part.entry
            try:
                index.loaded(part, check_bucket(e, blob[e.position : e.position + e.length]))
            except CorruptSnapshotError:
                index.failed(part)
        position = index.rescanning("p0")
        while position is not None:  # the rescan reader, in reads of 50
            read = [(o, frame(o, log[o])) for o in range(position, position + 50) if o in log]
            index.rescan("p0", read, position + 50)  # type: ignore[arg-type]
            position = index.rescanning("p0")
        for due in index.take_due(now, 10_000):
            assert due.due_ms <= now, "early"
            assert due.offset not in got, "twice"
            got[due.offset] = now
            index.done("p0", due.offset)
    return got


def test_a_resume_loads_the_sealed_range_and_reads_only_the_tail_from_the_log() -> None:
    rng = random.Random(5)
    log = [(o, T0 + rng.randrange(1_000, 60_000) if o % 3 else None) for o in range(3000)]
    first = DelayedMessages(memory_bytes_max=64 * 1024)
    objects = _seal_all(first, log, every=400)  # sealed up to 2800: the last 200 are not
    assert [r.to_offset for r in first.chain("p0")][-1] == 2800
    # Half are delivered and acked before the crash (due before T0 + 30 s).
    now = T0
    while now < T0 + 30_000:
        now += 50
        for due in first.take_due(now, 10_000):
            first.done("p0", due.offset)
    delay_from, bound = first.delay_from("p0", 3000), first.due_floor_ms()
    assert delay_from is not None
    assert bound is not None
    second = _resume(delay_from, 3000, bound, first.chain("p0"), objects)
    got = _drain(second, objects, dict(log), now, T0 + 61_000)
    wanted = {o for o, due in log if due is not None and due >= bound}
    assert set(got) == wanted, "lost, or delivered again though due before the bound"
    assert second.reread_frames == 200  # [2800, 3000): past the last seal, and only that
    assert second.loaded_records == len([o for o in wanted if o < 2800])


def test_a_corrupt_or_missing_snapshot_is_read_from_the_log_instead() -> None:
    rng = random.Random(9)
    log = [(o, T0 + rng.randrange(1_000, 20_000)) for o in range(2000)]
    first = DelayedMessages()
    objects = _seal_all(first, log, every=500)
    chain = first.chain("p0")
    assert len(chain) == 4
    bad = bytearray(objects[chain[1].key])
    bad[-3] ^= 0xFF  # the last bucket of the second snapshot: found when it is loaded
    objects[chain[1].key] = bytes(bad)
    del objects[chain[2].key]  # the third is gone: found at resume (no head)
    second = _resume(0, 2000, T0, chain, objects)
    got = _drain(second, objects, {o: d for o, d in log}, T0, T0 + 21_000)
    assert set(got) == {o for o, _ in log}, "a message was lost"
    assert second.reread_frames == 1000  # the two bad snapshots' ranges, no more


def test_the_machine_stores_its_chain_and_a_new_one_resumes_from_it() -> None:
    m = SubscriptionMachine("shared", {"p0": PartitionCursor(0)})
    assert m.delayed is not None
    m.delayed.sealing = True
    m.delayed.start_sealing("p0", 0)
    m.handle(ConsumerAttached("c1", "one"))
    reads = [(o, frame(o, T0 + 5_000 + o)) for o in range(100)]
    m.handle(MessagesAvailable("p0", reads, 0, 100))
    sealed = m.delayed.seal("p0", m.cursor("p0").read_position)
    assert sealed is not None
    assert (sealed.from_offset, sealed.to_offset) == (0, 100)
    assert m.delayed.sealed(sealed, ref_of(sealed, "a"))
    m.cursor("p0").touch()
    (state,) = [a.state for a in m.handle(Tick(5.0, T0)) if isinstance(a, FlushCursor)]
    assert state.delay_snapshots == (ref_of(sealed, "a"),)
    second = SubscriptionMachine("shared", {"p0": PartitionCursor.from_state(state)})
    second.resume_delayed({"p0": state}, {"a": read_head(sealed.data)})
    assert second.rescan_position("p0") is None  # nothing to read again: all sealed
    assert second.delayed is not None
    (part,) = second.delayed.wanted(T0 + 3_100)
    e = part.entry
    second.delayed.loaded(part, sealed.data[e.position : e.position + e.length])
    second.handle(ConsumerAttached("c2", "two"))
    got = [
        o
        for a in second.handle(Poll("c2", 1000, 6.0, T0 + 5_050))
        if isinstance(a, Deliver)
        for o in a.offsets
    ]
    assert got == list(range(51))
    second.handle(Ack("c2", [("p0", o) for o in got]))
    second.validate()


# --- the I/O edge, over OpenDAL's memory backend ---------------------------------------------


def test_snapshots_are_written_read_and_collected_through_the_object_store() -> None:
    async def run() -> None:
        objects = ObjectStore(opendal.AsyncOperator("memory"))
        snapshots = DelaySnapshots(objects, "delayed/default/t/s", claim=3)
        first = DelayedMessages()
        first.sealing = True
        first.start_sealing("t", 0)
        for offset in range(50):
            first.file("t", offset, T0 + 1000 * (offset % 5), frame(offset, T0))
        assert await snapshots.seal_once(first, {"t": 50}) == {"t"}
        (written,) = first.chain("t")
        assert written.key == f"delayed/default/t/s/t/{0:020d}-{50:020d}-3.dly"
        heads = await snapshots.heads([written, ref(7, 9)])  # the second does not exist
        assert list(heads) == [written.key]
        second = DelayedMessages()
        second.resume_from("t", plan_resume(0, 50, T0, (written,)), heads, T0)
        assert await snapshots.load_once(second, T0) == 3  # the buckets within PREFETCH_MS
        assert await snapshots.load_once(second, T0 + 3000) == 2
        assert len(second.take_due(T0 + 5000, 100)) == 50
        for offset in range(50):
            second.done("t", offset)
        assert await snapshots.seal_once(second, {"t": 50}) == set()  # garbage: deleted
        assert second.chain("t") == ()
        with pytest.raises(ObjectNotFoundError):
            await objects.read(written.key)

    asyncio.run(run())


def test_a_seal_written_across_a_seek_is_not_referenced_and_an_empty_one_extends_the_last() -> None:
    index = DelayedMessages()
    index.sealing = True
    index.start_sealing("p0", 0)
    index.file("p0", 3, T0, frame(3, T0))
    sealed = index.seal("p0", 10)
    assert sealed is not None
    assert index.seal("p0", 10) is None  # nothing new
    index.drop_partition("p0")  # a seek while the seal was being written
    assert not index.sealed(sealed, ref_of(sealed, "a"))  # the caller deletes it
    index.file("p0", 20, T0, frame(20, T0))  # read from the new position: sealed from there
    again = index.seal("p0", 30)
    assert again is not None
    assert (again.from_offset, again.to_offset) == (20, 30)
    assert index.sealed(again, ref_of(again, "b"))
    assert index.seal("p0", 45) is None  # nothing delayed in [30, 45): the last one covers it
    assert [(r.key, r.from_offset, r.to_offset) for r in index.chain("p0")] == [("b", 20, 45)]


class _SlowWrites:
    """An operator whose writes wait for the test: what is filed meanwhile is not sealed
    into a snapshot whose position was taken before."""

    def __init__(self, during_write: Callable[[], None]) -> None:
        self.inner = opendal.AsyncOperator("memory")
        self.during_write = during_write

    async def write(self, path: str, bs: bytes, /) -> None:
        self.during_write()
        await self.inner.write(path, bs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_messages_filed_while_a_seal_is_written_are_in_the_next_snapshot() -> None:
    index = DelayedMessages()
    index.sealing = True
    for p in ("a", "b"):
        index.start_sealing(p, 0)
        for offset in range(10):
            index.file(p, offset, T0 + 5000, frame(offset, T0 + 5000))
    filed_meanwhile = iter(range(10, 15))

    def more() -> None:  # the reader of "b" goes on while "a"'s snapshot is written
        for offset in filed_meanwhile:
            index.file("b", offset, T0 + 5000, frame(offset, T0 + 5000))

    async def run() -> None:
        snapshots = DelaySnapshots(ObjectStore(_SlowWrites(more)), "d", claim=1)
        assert await snapshots.seal_once(index, {"a": 10, "b": 10}) == {"a", "b"}
        assert await snapshots.seal_once(index, {"a": 10, "b": 15}) == {"b"}

    asyncio.run(run())
    assert [(r.from_offset, r.to_offset) for r in index.chain("b")] == [(0, 10), (10, 15)]
    buffer = SealBuffer(0)
    buffer.add(0, T0, 7, b"x")
    assert buffer.seal("p", 5).to_offset == 8  # never a message past its end
