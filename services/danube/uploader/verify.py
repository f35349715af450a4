"""Checking a partition's cloud tier: descriptors, objects and the checkpoint agree.

``verify_partition`` reads every descriptor and every object of a partition and reports what
is wrong: an object that is missing, has another size, a frame that fails its check, offsets
that differ from the descriptor's, descriptors that overlap or leave a hole between them,
objects without a descriptor, a checkpoint behind the last descriptor. Reads whole objects: an
operator's tool (and the tests'), not something to run on every request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from danube.bus import TopicName
from danube.frame import CorruptFrameError, decode_frames
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import UploaderCheckpoint
from danube.storage import ObjectDescriptor, ObjectNotFoundError, ObjectStore


@dataclass
class TierReport:
    """What :func:`verify_partition` found. ``offsets``: every offset held, in object order."""

    descriptors: list[ObjectDescriptor] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    uploaded_through: int = -1
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def verify_partition(
    store: MetaStore, objects: ObjectStore, partition: TopicName, *, with_offsets: bool = True
) -> TierReport:
    """Check the cloud tier of ``partition`` (see the module docstring)."""
    report = TierReport()
    kvs = await store.range(meta_keys.object_descriptors_prefix(partition))
    report.descriptors = sorted(
        (ObjectDescriptor.from_bytes(kv.value) for kv in kvs), key=lambda d: d.first_offset
    )
    checkpoint = await store.get_model(
        meta_keys.uploader_checkpoint_key(partition), UploaderCheckpoint
    )
    report.uploaded_through = -1 if checkpoint is None else checkpoint.uploaded_through
    previous_last: int | None = None
    for descriptor in report.descriptors:
        if previous_last is not None and descriptor.first_offset <= previous_last:
            report.problems.append(f"{descriptor.key} overlaps the object before it")
        previous_last = descriptor.last_offset
        await _check_object(objects, descriptor, report, with_offsets)
    if report.descriptors and report.uploaded_through < report.descriptors[-1].last_offset:
        report.problems.append(
            f"checkpoint {report.uploaded_through} is behind the last object "
            f"({report.descriptors[-1].last_offset})"
        )
    if report.descriptors:
        prefix = report.descriptors[0].key.rsplit("/", 1)[0] + "/"
        described = {d.key for d in report.descriptors}
        for key in await objects.list(prefix):
            if key not in described:
                report.problems.append(f"{key} has no descriptor")
    return report


async def _check_object(
    objects: ObjectStore, descriptor: ObjectDescriptor, report: TierReport, with_offsets: bool
) -> None:
    key = descriptor.key
    try:
        body = await objects.read(key)
    except ObjectNotFoundError:
        report.problems.append(f"{key} is missing")
        return
    if len(body) != descriptor.size_bytes:
        report.problems.append(f"{key}: {len(body)} bytes, descriptor says {descriptor.size_bytes}")
        return
    try:
        frames, end = decode_frames(body)
    except CorruptFrameError as exc:
        report.problems.append(f"{key}: {exc}")
        return
    offsets = [frame.offset for frame in frames]
    if end != len(body) or not offsets:
        report.problems.append(f"{key}: ends inside a frame")
        return
    if (offsets[0], offsets[-1], len(offsets)) != (
        descriptor.first_offset,
        descriptor.last_offset,
        descriptor.message_count,
    ):
        report.problems.append(f"{key}: frames {offsets[0]}..{offsets[-1]} x{len(offsets)}")
    if with_offsets:
        report.offsets += offsets
