"""A JSON produce's sequences (docs/http-api.md, "Idempotent produce"): the rules of
danube.admission.sequences read from discovery's HTTP body, :class:`ProduceRequest`. Pure,
no I/O."""

from __future__ import annotations

from danube.admission.sequences import INVALID_SEQUENCE, Sequencing, gap, mixed
from danube.discovery.models import ProduceRequest
from danube.errors import BadRequestError


def json_sequencing(request: ProduceRequest) -> Sequencing | None:
    """The run of a JSON produce's sequences, None for an unsequenced one; 400
    ``invalid_sequence`` naming the first message that breaks the rules."""
    sequences = [message.sequence for message in request.messages]
    if sequences[0] is None:
        if any(s is not None for s in sequences):
            raise mixed(0)
        if request.producer_epoch:
            raise BadRequestError(
                "producer_epoch is for sequenced messages: give every message a sequence",
                code=INVALID_SEQUENCE,
            )
        return None
    first = sequences[0]
    for index, sequence in enumerate(sequences):
        if sequence is None:
            raise mixed(index)
        if sequence != first + index:
            raise gap(index, sequence, first + index)
    return Sequencing(request.producer, request.producer_epoch, first, len(sequences))
