"""The produce body's fast reader: what it takes equals what ProduceRequest makes of it, and
everything the model would refuse (or that it is not sure of) is left to the model (None)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from danube.discovery.doors.bodies.produce import ProduceRequest, ProduceResponse, ProduceResult
from danube.discovery.doors.http.produce_body import parse_produce, produce_answer
from danube.frame import MAX_ATTRIBUTES, MAX_KEY_BYTES, MAX_PRODUCER_NAME_BYTES

TAKEN: list[dict[str, Any]] = [
    {"messages": [{"payload": "a"}]},
    {"messages": [{"payload": "aGk=", "encoding": "base64", "key": "k", "attributes": {"a": "b"}}]},
    {"messages": [{"payload": "x", "key": None}], "producer": "p", "dispatch": "non_reliable"},
    {"messages": [{"payload": "x"}] * 3, "producer_id": "p-1_x", "schema_version": 2},
    {"messages": [{"payload": "x", "key": "k" * MAX_KEY_BYTES}], "schema_version": None},
    {"messages": [{"payload": "x", "sequence": 2**64 - 1}], "producer_epoch": 2**32 - 1},
    {"messages": [{"payload": "x", "sequence": 0}, {"payload": "y", "sequence": 1}]},
]

LEFT: list[Any] = [
    {},
    {"messages": [{"payload": "x", "sequence": -1}]},
    {"messages": [{"payload": "x", "sequence": "1"}]},
    {"messages": [{"payload": "x", "sequence": 1}], "producer_epoch": 2**32},
    {"messages": [{"payload": "x", "sequence": 1}], "producer_epoch": True},
    [],
    {"messages": []},
    {"messages": [{"payload": 1}]},
    {"messages": [{"payload": "x", "extra": 1}]},
    {"messages": [{"payload": "x"}], "extra": 1},
    {"messages": [{"payload": "x", "encoding": "hex"}]},
    {"messages": [{"payload": "x", "key": "k" * (MAX_KEY_BYTES + 1)}]},
    {"messages": [{"payload": "x", "key": 5}]},
    {"messages": [{"payload": "x", "attributes": None}]},
    {"messages": [{"payload": "x", "attributes": {"a": 1}}]},
    {
        "messages": [
            {"payload": "x", "attributes": {str(i): "v" for i in range(MAX_ATTRIBUTES + 1)}}
        ]
    },
    {"messages": [{"payload": "x"}], "producer": "p" * (MAX_PRODUCER_NAME_BYTES + 1)},
    {"messages": [{"payload": "x"}], "dispatch": "sometimes"},
    {"messages": [{"payload": "x"}], "producer_id": "no spaces"},
    {"messages": [{"payload": "x"}], "schema_version": 0},
    {"messages": [{"payload": "x"}], "schema_version": True},
    {"messages": [{"payload": "x"}], "schema_version": 2**31 + 1},
]


@pytest.mark.parametrize("body", TAKEN)
def test_a_valid_body_reads_as_the_model_reads_it(body: dict[str, Any]) -> None:
    fast = parse_produce(orjson.dumps(body))
    assert fast is not None
    model = ProduceRequest.model_validate(body)
    assert fast == model
    assert fast.model_fields_set == model.model_fields_set
    for ours, theirs in zip(fast.messages, model.messages, strict=True):
        assert ours.model_fields_set == theirs.model_fields_set


@pytest.mark.parametrize("body", LEFT)
def test_a_body_the_model_refuses_is_left_to_it(body: Any) -> None:
    assert parse_produce(orjson.dumps(body)) is None
    with pytest.raises(ValidationError):
        ProduceRequest.model_validate(body)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b'{"messages": [{"payload": "\\ud800"}]}',
        b"NaN",
        b'{"messages": [{"payload": "x", "sequence": 18446744073709551616}]}',  # 2**64
    ],
)
def test_what_orjson_does_not_read_is_left_to_the_model(raw: bytes) -> None:
    assert parse_produce(raw) is None


def test_the_answer_is_the_produce_response_json() -> None:
    answer = orjson.loads(produce_answer([("/default/t", 4, False), ("/default/t", 5, True)]))
    assert answer == {
        "results": [
            {"partition": "/default/t", "offset": 4},
            {"partition": "/default/t", "offset": 5, "duplicate": True},
        ]
    }


# Bodies near every bound the model checks: each field, when present, is a valid value or
# one just past a bound or of another JSON type, so random bodies cross the edges where a
# fast reader and its model could disagree (and about one in six is valid throughout).
_EDGES = st.sampled_from([-1, 0, 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1])
_ODD: st.SearchStrategy[Any] = st.sampled_from([None, True, 1.5, "1", [], {}])


def _field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, valid, _EDGES, _ODD)


_MESSAGE = st.fixed_dictionaries(
    {"payload": st.sampled_from(["x", "aGk=", ""])},
    optional={
        "encoding": _field(st.sampled_from(["utf8", "base64", "hex"])),
        "key": _field(st.sampled_from(["k", "k" * MAX_KEY_BYTES, "k" * (MAX_KEY_BYTES + 1)])),
        "attributes": _field(st.dictionaries(st.sampled_from(["a", "b"]), st.text(max_size=2))),
        "sequence": _field(st.integers(0, 3)),
        "ttl_ms": _field(st.integers(1, 10)),
        "deliver_at_ms": _field(st.integers(0, 10)),
        "deliver_after_ms": _field(st.integers(0, 10)),
    },
)
_BODY = st.fixed_dictionaries(
    {"messages": st.lists(_MESSAGE, min_size=1, max_size=3)},
    optional={
        "producer": _field(st.sampled_from(["p", "p" * (MAX_PRODUCER_NAME_BYTES + 1)])),
        "dispatch": _field(st.sampled_from(["reliable", "non_reliable", "sometimes"])),
        "producer_id": _field(st.sampled_from(["p-1_x", "no spaces"])),
        "schema_version": _field(st.integers(1, 3)),
        "producer_epoch": _field(st.integers(0, 3)),
    },
)


@settings(max_examples=600, deadline=None)
@given(_BODY)
def test_the_fast_reader_never_disagrees_with_the_model(body: dict[str, Any]) -> None:
    # The fast path's rule (docs/performance.md, "Fast paths"): what it takes, the model
    # takes with the same values; what the model refuses, it leaves to the model.
    fast = parse_produce(orjson.dumps(body))
    try:
        model = ProduceRequest.model_validate(body)
    except ValidationError:
        assert fast is None
        return
    if fast is not None:
        assert fast == model
        assert fast.model_fields_set == model.model_fields_set


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=8), st.integers(0, 2**63 - 1), st.booleans())))
def test_the_fast_answer_is_the_models_json(results: list[tuple[str, int, bool]]) -> None:
    # What the route would answer: the response model, without its unset fields.
    model = ProduceResponse(
        results=[
            ProduceResult(partition=p, offset=o, duplicate=True if d else None)
            for p, o, d in results
        ]
    )
    assert orjson.loads(produce_answer(results)) == model.model_dump(exclude_none=True)


# The route's own reading of the bytes (Starlette's Request.json(): json.loads, then the model
# in Python mode) is the slow twin of orjson and the hand checks. Bodies written as text,
# each value in one of the ways JSON allows: a field given twice (the last counts, in both
# readers), text escaped or raw, a non-BMP letter as a surrogate pair, a lone surrogate,
# numbers as floats, whitespace; and text whose length in characters and in bytes differ.
_UNICODE = st.sampled_from(["\U0001f600", "\ud800", "\x00", "e\u0301", "\u00e9" * 3])


def _text(*limits: int) -> st.SearchStrategy[str]:
    """Plain text mostly, else an edge: a non-BMP letter, a lone surrogate, a NUL, or a
    2-byte letter repeated to a limit in characters or one past it (twice over in bytes)."""
    plain = st.sampled_from(["x", "aGk=", ""])
    if not limits:
        return st.one_of(plain, _UNICODE)
    at_limits = st.sampled_from(["\u00e9" * n for limit in limits for n in (limit, limit + 1)])
    return st.one_of(plain, _UNICODE, at_limits)


_RAW_MESSAGE = st.fixed_dictionaries(
    {"payload": _text()},
    optional={
        "encoding": st.sampled_from(["utf8", "base64"]),
        "key": st.none() | _text(MAX_KEY_BYTES),
        "attributes": st.dictionaries(_text(), _text(), max_size=2),
        "sequence": st.integers(0, 3),
    },
)
_RAW_BODY = st.fixed_dictionaries(
    {"messages": st.lists(_RAW_MESSAGE, min_size=1, max_size=2)},
    optional={
        "producer": _text(MAX_PRODUCER_NAME_BYTES),
        "dispatch": st.sampled_from(["reliable", "non_reliable"]),
        "producer_epoch": st.integers(0, 3),
    },
)


@st.composite
def _json_text(draw: st.DrawFn, value: Any) -> str:
    space = draw(st.sampled_from(["", " ", "\n\t"]))
    if isinstance(value, dict):
        items = [(k, draw(_json_text(v))) for k, v in value.items()]
        if items and draw(st.integers(0, 3)) == 0:  # a field twice, another value before or after
            at = draw(st.integers(0, len(items) - 1))
            items.insert(at + draw(st.integers(0, 1)), (items[at][0], draw(_json_text(draw(_ODD)))))
        inner = f",{space}".join(f"{draw(_json_text(k))}:{space}{v}" for k, v in items)
        return "{" + space + inner + "}"
    if isinstance(value, list):
        return "[" + f",{space}".join(draw(_json_text(v)) for v in value) + "]"
    if isinstance(value, str):
        # Escaped as ASCII (a non-BMP letter as a surrogate pair, a lone one as it is) or raw.
        raw = draw(st.booleans()) and not any("\ud800" <= c <= "\udfff" for c in value)
        return json.dumps(value, ensure_ascii=not raw)
    if type(value) is int and draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([f"{value}.0", f"{value}e0"]))
    return json.dumps(value)


@settings(max_examples=200, deadline=None)
@given(_RAW_BODY.flatmap(_json_text))
def test_the_fast_reader_of_the_bytes_never_disagrees_with_the_routes(text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    fast = parse_produce(raw)
    try:
        model = ProduceRequest.model_validate(json.loads(raw))
    except (ValueError, ValidationError):  # json.JSONDecodeError is a ValueError
        assert fast is None
        return
    if fast is not None:
        assert fast == model
        assert fast.model_fields_set == model.model_fields_set
        for ours, theirs in zip(fast.messages, model.messages, strict=True):
            assert ours.model_fields_set == theirs.model_fields_set
