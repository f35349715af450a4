"""A binary body's sequencing (frames_sequencing: the scan's runs when they settle it, its own
walk over the records otherwise) against its slow twin, the rules read off every record
decoded: the same run, or invalid_sequence naming the same record."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.admission.sequences import INVALID_SEQUENCE, Sequencing, frames_sequencing
from danube.errors import BadRequestError
from danube.frame import decode_record_fields
from danube.frame.produce import encode_produce_frame, scan_frames_for_produce

pytestmark = pytest.mark.unit

Outcome = Sequencing | tuple[str, int] | None
_RECORD = re.compile(r"record (\d+)")


def fast(body: bytes) -> Outcome:
    frames = scan_frames_for_produce(body, max_count=100)
    try:
        return frames_sequencing(frames)
    except BadRequestError as exc:
        found = _RECORD.match(exc.message)
        return (exc.code, -1 if found is None else int(found[1]))


def slow(body: bytes) -> Outcome:
    """The rules (danube.admission.sequences) over the decoded records, in order."""
    frames = scan_frames_for_produce(body, max_count=100)
    read = [decode_record_fields(frames.record(i)) for i in range(len(frames))]
    first = read[0]
    if first.sequence is None:  # none or a mixed request: refused at the first sequenced one
        mixed = [i for i, r in enumerate(read) if r.sequence is not None]
        return (INVALID_SEQUENCE, mixed[0]) if mixed else None
    for index, record in enumerate(read):
        if (
            record.sequence is None
            or (record.producer, record.producer_epoch) != (first.producer, first.producer_epoch)
            or record.sequence != first.sequence + index
        ):
            return (INVALID_SEQUENCE, index)
    return Sequencing(first.producer, first.producer_epoch, first.sequence, len(read))


# Records as an idempotent producer (or a confused one) sends them: a few producers and
# epochs, sequences mostly going on by one, now and then not, or none.
_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["p", "p", "q", "\u00e9"]),
        st.sampled_from([0, 0, 1]),
        st.sampled_from([1, 1, 1, 1, 0, 2, None]),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(_STEPS, st.integers(0, 2**64 - 1))
def test_the_runs_settle_a_body_as_its_records_do(
    steps: list[tuple[str, int, int | None]], start: int
) -> None:
    sequence = start
    frames = []
    for producer, epoch, step in steps:
        if step is not None:
            sequence = (sequence + step) % 2**64
        frames.append(
            encode_produce_frame(
                b"x",
                producer=producer.encode(),
                publish_time_ms=0,
                sequence=None if step is None else sequence,
                producer_epoch=0 if step is None else epoch,
            )
        )
    body = b"".join(frames)
    assert fast(body) == slow(body)
