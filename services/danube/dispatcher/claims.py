"""Claim announcements: how a dispatcher serving without its node lease learns, over the
bus, that another one claimed a subscription it serves (docs/dispatcher.md, "Through an
etcd outage").

A dispatcher that wins a claim (or a reclaim) publishes a :class:`ClaimNotice` on
``ctl.subclaimed.<ns>.<base>.<part>.<sub>``; every dispatcher hears every notice. The rule
(:func:`fences`, no I/O) is: a notice from another dispatcher whose owner-key revision is
newer than the claim ours was written at means ours is no longer the owner key etcd holds,
so we stop serving at once, with or without our lease.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from danube.dispatcher.store import OwnerClaim


class ClaimNotice(BaseModel):
    """``node_id`` claimed the subscription: owner key written at ``revision``, ``epoch``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str = Field(min_length=1, max_length=256)
    epoch: int = Field(ge=0)
    revision: int = Field(ge=0)


def encode_notice(node_id: str, claim: OwnerClaim) -> bytes:
    """The notice of ``claim`` won by ``node_id``."""
    notice = ClaimNotice(node_id=node_id, epoch=claim.epoch, revision=claim.revision)
    return notice.model_dump_json().encode()


def decode_notice(body: bytes) -> ClaimNotice:
    """A notice read from the bus (pydantic.ValidationError if it is not one)."""
    return ClaimNotice.model_validate_json(body)


def fences(notice: ClaimNotice, node_id: str, claim: OwnerClaim | None) -> bool:
    """Whether hearing ``notice`` must stop our serving of the subscription we hold under
    ``claim``: another dispatcher wrote the owner key after ours was written (etcd
    revisions only grow, so an old notice arriving late never stops the newer owner)."""
    if notice.node_id == node_id:
        return False
    return claim is None or notice.revision > claim.revision
