"""The binary produce body (danube.wire.produce_binary: frames scanned once) against the JSON
body (the pydantic model, JsonMessages, encode_records) for the same messages: the same
admission answer, the same stored records, keys and payloads, or an error of the same kind
(and code); and the same results read back by the SDK from either answer."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from danube.admission import Admission, FramesMessages, ProduceLimits
from danube.admission.exclusive import ExclusiveView
from danube.client._records import json_results, results_of_runs
from danube.discovery.doors.bodies.produce import ProduceRequest
from danube.discovery.doors.http.produce_body import produce_answer
from danube.discovery.doors.http.produce_json import JsonMessages, encode_records, results
from danube.discovery.produce.producer import Stored
from danube.errors import DanubeError, ErrorKind
from danube.frame import MAX_ATTRIBUTES, MAX_KEY_BYTES, MAX_PRODUCER_NAME_BYTES
from danube.frame.produce import encode_produce_frame
from danube.meta import TopicName
from danube.meta.records import Policies, TopicConfig
from danube.security import Permission, Resource
from danube.wire.chunks import TOTAL_BYTES_ATTRIBUTE
from danube.wire.produce_binary import runs_answer, scan_body
from danube.wire.validation import validation_code

pytestmark = pytest.mark.unit

TOPIC = TopicName("default", "t")
LIMITS = ProduceLimits(messages_max=4, payload_bytes_max=64)
CHUNKED_BYTES_MAX = 1000
PUBLISH_TIME_MS = 1_700_000_000_000
# Where the JSON door and the binary door name one fault differently: the model's 400 or
# the encoder's (a byte limit the model counts in characters) against the scan's.
JSON_CODES_OF = {"corrupt_record": {"invalid_request", "invalid_record"}}


class Open:
    """No security: everyone may produce."""

    enabled = False

    def authorize(
        self, principal: str, permission: Permission, resource: Resource, *, action: str
    ) -> None:
        raise AssertionError("not asked when disabled")


class Policy:
    async def effective_policies(self, topic: TopicName) -> tuple[TopicConfig | None, Policies]:
        return None, Policies(max_chunked_message_bytes=CHUNKED_BYTES_MAX)


def _admission() -> Admission:
    return Admission(LIMITS, security=Open(), policies=Policy(), fence=ExclusiveView())


@dataclasses.dataclass
class Message:
    payload: bytes
    key: str | None
    attributes: dict[str, str]
    sequence: int | None
    base64: bool  # how the JSON body carries the payload


@dataclasses.dataclass
class Batch:
    producer: str
    epoch: int
    messages: list[Message]


Outcome = tuple[Any, ...]


def _failed(exc: DanubeError) -> Outcome:
    return ("refused", exc.kind, exc.code)


async def json_door(batch: Batch) -> Outcome:
    """The JSON body's way: the model, admission, then the records encoded."""
    body: dict[str, Any] = {
        "producer": batch.producer,
        "messages": [
            {
                "payload": base64.b64encode(m.payload).decode() if m.base64 else m.payload.decode(),
                "encoding": "base64" if m.base64 else "utf8",
                "key": m.key,
                "attributes": m.attributes,
                "sequence": m.sequence,
            }
            for m in batch.messages
        ],
    }
    if batch.epoch:
        body["producer_epoch"] = batch.epoch
    try:
        request = ProduceRequest.model_validate(orjson.loads(orjson.dumps(body)))
    except ValidationError as exc:  # the route's 400 (danube.discovery.doors.http.failures)
        return ("refused", ErrorKind.INVALID, validation_code(exc.errors()))
    messages = JsonMessages(request)
    try:
        admitted = await _admission().produce("anyone", TOPIC, messages)
        stored = encode_records(request, messages.payloads(), publish_time_ms=PUBLISH_TIME_MS)
    except DanubeError as exc:
        return _failed(exc)
    keys = [m.key for m in request.messages]
    return ("ok", admitted.sequencing, stored, keys, list(messages.payloads()))


async def binary_door(batch: Batch) -> Outcome:
    """The binary body's way: the frames as a producer encodes them, scanned, admitted."""
    body = b"".join(
        encode_produce_frame(
            m.payload,
            producer=batch.producer.encode(),
            publish_time_ms=PUBLISH_TIME_MS,
            key=None if m.key is None else m.key.encode(),
            attributes=[(k.encode(), v.encode()) for k, v in m.attributes.items()],
            sequence=m.sequence,
            producer_epoch=batch.epoch if m.sequence is not None else 0,
        )
        for m in batch.messages
    )
    try:
        frames = scan_body(
            body, max_messages=LIMITS.messages_max, max_payload_bytes=LIMITS.payload_bytes_max
        )
        admitted = await _admission().produce("anyone", TOPIC, FramesMessages(frames))
    except DanubeError as exc:
        return _failed(exc)
    stored = [bytes(frames.record(i)) for i in range(len(frames))]
    payloads = [bytes(frames.payload(i)) for i in range(len(frames))]
    return ("ok", admitted.sequencing, stored, frames.keys, payloads)


_TEXT = st.one_of(
    st.sampled_from(["", "a", "\u00e9", "\u20ac", "\U0001f600", "\x00", "e\u0301", '"\\']),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=5),
)
_MESSAGE = st.builds(
    Message,
    payload=st.one_of(st.binary(max_size=24), _TEXT.map(str.encode)),
    key=st.none() | _TEXT,
    attributes=st.dictionaries(_TEXT, _TEXT, max_size=3),
    sequence=st.none(),
    base64=st.booleans(),
)
# One fault of each kind (and the binary door's code for it), or none: each answered by both
# doors with an error of one kind.
FAULTS: dict[str | None, str | None] = {
    None: None,
    "payload over the limit": "payload_too_large",
    "a sequence gap": "invalid_sequence",
    "sequences on some messages": "invalid_sequence",
    "a chunk over the topic's limit": "chunked_message_too_large",
    "a chunk total that is not a number": "invalid_chunk",
    "a key over its limit in bytes, within it in characters": "corrupt_record",
    "a key over its limit in characters": "corrupt_record",
    "too many attributes": "corrupt_record",
    "a producer name over its limit": "corrupt_record",
    "too many messages": "too_many_messages",
}


@st.composite
def batches(draw: st.DrawFn) -> tuple[Batch, str | None]:
    messages = draw(st.lists(_MESSAGE, min_size=1, max_size=LIMITS.messages_max))
    fault = draw(st.sampled_from([None, None, *FAULTS]))
    producer = draw(_TEXT)
    victim = messages[-1]
    if fault in ("a sequence gap", "sequences on some messages") and len(messages) == 1:
        messages.append(dataclasses.replace(victim))
    elif fault == "too many messages":
        messages = [dataclasses.replace(m) for m in (messages * 5)[: LIMITS.messages_max + 1]]
    sequenced = draw(st.booleans()) or fault in ("a sequence gap", "sequences on some messages")
    epoch = draw(st.integers(0, 2**32 - 1)) if sequenced else 0
    if sequenced:
        first = draw(st.integers(0, 2**64 - 2 - len(messages)))
        for index, message in enumerate(messages):
            message.sequence = first + index
    if fault == "payload over the limit":
        victim.payload = b"x" * (LIMITS.payload_bytes_max + 1)
    elif fault == "a sequence gap":
        messages[-1].sequence = messages[-2].sequence + 2  # type: ignore[operator]
    elif fault == "sequences on some messages":
        messages[-1].sequence = None
    elif fault == "a chunk over the topic's limit":
        victim.attributes = {**victim.attributes, TOTAL_BYTES_ATTRIBUTE: str(CHUNKED_BYTES_MAX + 1)}
    elif fault == "a chunk total that is not a number":
        victim.attributes = {**victim.attributes, TOTAL_BYTES_ATTRIBUTE: "1e3"}
    elif fault == "a key over its limit in bytes, within it in characters":
        victim.key = "\u00e9" * (MAX_KEY_BYTES // 2 + 1)
    elif fault == "a key over its limit in characters":
        victim.key = "k" * (MAX_KEY_BYTES + 1)
    elif fault == "too many attributes":
        victim.attributes = {f"a{i}": "" for i in range(MAX_ATTRIBUTES + 1)}
    elif fault == "a producer name over its limit":
        producer = "p" * (MAX_PRODUCER_NAME_BYTES + 1)
    for message in messages:  # what is not UTF-8 only base64 carries in JSON
        if message.payload.decode(errors="replace").encode() != message.payload:
            message.base64 = True
    return Batch(producer, epoch, messages), fault


async def _both(batch: Batch) -> tuple[Outcome, Outcome]:
    return await json_door(batch), await binary_door(batch)


@settings(max_examples=150, deadline=None)
@given(batches())
def test_both_doors_store_the_same_records_or_refuse_alike(
    drawn: tuple[Batch, str | None],
) -> None:
    batch, fault = drawn
    by_json, by_binary = asyncio.run(_both(batch))
    assert (by_json[0], by_binary[0]) == ("ok" if fault is None else "refused",) * 2, by_binary
    if fault is None:
        assert by_json == by_binary
        return
    kind, code = by_binary[1:]
    assert code == FAULTS[fault]
    assert by_json[1] == kind
    assert by_json[2] == code or by_json[2] in JSON_CODES_OF.get(code, ()), (by_json, code)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda partitions: st.lists(
            st.tuples(st.integers(0, partitions - 1), st.integers(0, 50), st.booleans()),
            min_size=1,
            max_size=8,
        ).map(lambda placed: (partitions, placed))
    )
)
def test_the_sdk_reads_the_same_results_from_either_answer(
    drawn: tuple[int, list[tuple[int, int, bool]]],
) -> None:
    partitions, placed = drawn
    stored = Stored(
        names=TOPIC.partitions(partitions),
        routed=[p for p, _, _ in placed],
        offsets=[o for _, o, _ in placed],
        duplicates=[d for _, _, d in placed],
        partitions=partitions,
    )
    by_json = produce_answer([(r.partition, r.offset, bool(r.duplicate)) for r in results(stored)])
    by_runs = runs_answer(
        stored.names, stored.routed, stored.offsets, stored.duplicates, stored.partitions
    )
    count = len(placed)
    assert results_of_runs(orjson.loads(by_runs), count) == json_results(
        orjson.loads(by_json), count
    )
