"""The bus's plain publish (danube.bus.connection: a subject checked once, then one ``PUB``
written through by ``FastClient.publish_now``) against its twin, the publish it skips: the
bus's own concrete-subject check followed by nats-py's (``_validate_subject``), and
nats-py's command (``pub_cmd``). A subject is refused by one exactly when it is refused by
the other, whatever it holds (dots, wildcards, spaces, tabs, line breaks, other control
characters, any Unicode); the same subject refused twice is refused twice (a refusal is not
remembered as checked); the command carries the same subject, length and payload."""

from __future__ import annotations

import nats.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import _validate_subject
from nats.protocol.command import pub_cmd

from danube.bus.connection import _check_concrete, _plain_subject
from danube.bus.errors import InvalidSubjectError

pytestmark = pytest.mark.unit

# Subjects built from what matters to either check, and from anything at all.
_PIECES = st.sampled_from(
    ["a", "b.c", ".", "..", "*", ">", " ", "\t", "\r", "\n", "\x0b", "\x0c", "\x00", "é", "\u2028"]
)
_SUBJECTS = st.one_of(
    st.lists(_PIECES, max_size=8).map("".join),
    st.text(max_size=40),
    st.lists(st.text(max_size=6), min_size=1, max_size=5).map(".".join),
)


def _twin_refuses(subject: str) -> bool:
    try:
        _check_concrete(subject)
        _validate_subject(subject)
    except (InvalidSubjectError, nats.errors.BadSubjectError):
        return True
    return False


@given(_SUBJECTS)
def test_a_subject_is_refused_exactly_when_the_twin_refuses_it(subject: str) -> None:
    refused = _twin_refuses(subject)
    for _ in range(2):  # the second look may come from the cache: it must say the same
        if refused:
            with pytest.raises(InvalidSubjectError):
                _plain_subject(subject)
        else:
            assert _plain_subject(subject) == subject.encode()


@given(_SUBJECTS, st.binary(max_size=300))
def test_the_command_says_what_nats_py_s_says(subject: str, payload: bytes) -> None:
    if _twin_refuses(subject):
        return
    raw = _plain_subject(subject)
    # nats-py's: "PUB <subject> <reply> <length>", the reply token empty; publish_now's
    # leaves the token out. The subject's bytes, the length and the payload are the same.
    assert pub_cmd(subject, "", payload) == b"PUB %b  %d\r\n%b\r\n" % (raw, len(payload), payload)
