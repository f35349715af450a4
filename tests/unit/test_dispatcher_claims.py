"""The claim-notice rule (danube.dispatcher.claims): another dispatcher's claim newer than
ours stops our serving; our own, an older one and a garbled notice do not."""

from __future__ import annotations

import pydantic
import pytest

from danube.dispatcher.claims import decode_notice, encode_notice, fences
from danube.dispatcher.store import OwnerClaim

OURS = OwnerClaim(epoch=3, revision=100, lease_id=7)


def test_a_newer_claim_of_another_dispatcher_fences() -> None:
    notice = decode_notice(encode_notice("b", OwnerClaim(epoch=1, revision=101, lease_id=9)))
    assert (notice.node_id, notice.epoch, notice.revision) == ("b", 1, 101)
    assert fences(notice, "a", OURS)
    assert fences(notice, "a", None)  # not claimed (yet) here: nothing to keep


def test_our_own_and_older_claims_do_not_fence() -> None:
    ours = decode_notice(encode_notice("a", OwnerClaim(epoch=3, revision=200, lease_id=7)))
    assert not fences(ours, "a", OURS)
    older = decode_notice(encode_notice("b", OwnerClaim(epoch=9, revision=99, lease_id=9)))
    assert not fences(older, "a", OURS)  # a late notice never stops the newer owner
    same = decode_notice(encode_notice("b", OwnerClaim(epoch=9, revision=100, lease_id=9)))
    assert not fences(same, "a", OURS)


def test_a_garbled_notice_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        decode_notice(b'{"node_id": "", "epoch": -1, "revision": 1}')
