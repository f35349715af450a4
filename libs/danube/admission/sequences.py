"""An idempotent producer's produce (docs/http-api.md, "Idempotent produce"): the rules a
request's sequences must hold before anything is sent. Pure, no I/O.

The partition's ingest leader deduplicates by producer name, epoch and sequence, and takes
a request that is either unsequenced or sequenced by one producer and epoch with
consecutive sequences. Every produce door holds a request to that shape (admission), so a
request the leader would refuse half-way is refused whole with a clear 400 here:

- every message carries a sequence or none does (JSON: ``messages[i].sequence``; binary:
  every record is format version 2 or every record version 1);
- one producer name and one epoch (JSON: the body's ``producer``, ``producer_epoch``; binary:
  each record's own);
- consecutive sequences in message order (``s, s+1, ...``), the last within u64.

Sequences are per partition, so a sequenced request names one partition: an unpartitioned
topic, or ``/<ns>/<t>-part-N``. To a partitioned topic's own name it is refused with
``partition_required`` once its partition count is known (:func:`check_target`): routing by
key or round robin would cut one run of sequences over several partitions.

A binary body's rules are here (:func:`frames_sequencing`); a JSON body's, which read
discovery's HTTP model, are danube.discovery.doors.http.produce_json', with the same errors
(:func:`mixed`, :func:`gap`).
"""

from __future__ import annotations

from dataclasses import dataclass

from danube.errors import BadRequestError
from danube.frame import RECORD_VERSION, record_sequence
from danube.frame.produce import ProducedFrames
from danube.meta import TopicName

INVALID_SEQUENCE = "invalid_sequence"
"""400: sequences on some messages only, not consecutive, or of several producers or epochs."""
PARTITION_REQUIRED = "partition_required"
"""400: sequenced messages sent to a partitioned topic's own name, not to one partition."""


@dataclass(frozen=True, slots=True)
class Sequencing:
    """The run of sequences a request carries: ``first .. first+count-1`` of ``producer``
    at ``producer_epoch``."""

    producer: str
    producer_epoch: int
    first: int
    count: int


def frames_sequencing(frames: ProducedFrames) -> Sequencing | None:
    """The run of a binary produce's sequences (each record's own, format version 2), None
    when every record is unsequenced (version 1); 400 ``invalid_sequence`` naming the first
    record that breaks the rules. The records were checked by the scan already."""
    body, starts, runs = frames.body, frames.starts, frames.runs
    # The common cases read by the scan already: no sequenced record, or one producer's
    # consecutive run; anything else is read again below to say what is wrong.
    if not runs:
        return None
    if len(runs) == 1 and runs[0].length == len(starts):
        run = runs[0]
        producer = str(run.producer, "utf-8")
        return Sequencing(producer, run.producer_epoch, run.first_sequence, run.length)
    if body[starts[0]] == RECORD_VERSION:
        for index, start in enumerate(starts):
            if body[start] != RECORD_VERSION:
                raise mixed(index, "record")
        return None
    head = record_sequence(body, starts[0])
    if head is None:  # cannot be: the version byte said 2 (the scan knows no other)
        raise mixed(0, "record")
    for index, start in enumerate(starts):
        sequenced = record_sequence(body, start)
        if sequenced is None:
            raise mixed(index, "record")
        if (sequenced.producer, sequenced.producer_epoch) != (head.producer, head.producer_epoch):
            raise BadRequestError(
                f"record {index}: producer {sequenced.producer!r} epoch "
                f"{sequenced.producer_epoch}, not {head.producer!r} epoch {head.producer_epoch} "
                "as record 0: a sequenced request is one producer's",
                code=INVALID_SEQUENCE,
            )
        if sequenced.sequence != head.sequence + index:
            raise gap(index, sequenced.sequence, head.sequence + index, "record")
    return Sequencing(head.producer, head.producer_epoch, head.sequence, len(starts))


def check_target(topic: TopicName, partitions: int, sequencing: Sequencing | None) -> None:
    """400 ``partition_required`` for sequenced messages sent to a topic of ``partitions``
    partitions by its own name (not one partition's)."""
    if sequencing is not None and topic.partition is None and partitions > 0:
        raise BadRequestError(
            f"{topic} has {partitions} partitions and sequences are per partition: send "
            f"sequenced messages to one partition ({topic}-part-0 … "
            f"{topic}-part-{partitions - 1})",
            code=PARTITION_REQUIRED,
        )


def mixed(index: int, what: str = "messages") -> BadRequestError:
    """400 ``invalid_sequence``: the message (or ``record``) at ``index`` breaks "all or
    none carry a sequence"."""
    where = f"record {index}" if what == "record" else f"messages[{index}]"
    return BadRequestError(
        f"{where}: every message of a request carries a sequence, or none does",
        code=INVALID_SEQUENCE,
    )


def gap(index: int, got: int, expected: int, what: str = "messages") -> BadRequestError:
    """400 ``invalid_sequence``: the message (or ``record``) at ``index`` carries ``got``
    where the run needs ``expected``."""
    where = f"record {index}" if what == "record" else f"messages[{index}].sequence"
    return BadRequestError(
        f"{where}: {got}, not {expected}: the sequences of a request are consecutive",
        code=INVALID_SEQUENCE,
    )
