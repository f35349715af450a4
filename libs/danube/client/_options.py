"""The producer's options (:class:`ProducerOptions`), checked when made; what each does is in
:mod:`danube.client.producer` and docs/client.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from danube.client._idempotent import DEFAULT_PRODUCER_NAME
from danube.client._producer_session import AccessMode
from danube.client.errors import InvalidArgumentError
from danube.client.messages import DEFAULT_MAX_PAYLOAD_BYTES, check_producer_name
from danube.frame.compression import CODEC_IDS, Compression
from danube.wire.chunks import CHUNKED_BYTES_DEFAULT, CHUNKED_BYTES_MAX

Dispatch = Literal["reliable", "non_reliable"]
Transport = Literal["binary", "json"]

# The server's limits (docs/http-api.md, "Limits"): messages and bytes of one request.
SERVER_MAX_MESSAGES = 10_000
SERVER_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ProducerOptions:
    """How a producer names itself, batches, bounds and retries (docs/client.md,
    "Producer")."""

    # The default name is made unique per idempotent producer (``danube-client-<12 hex>``);
    # another name is one producer's: a new instance of it fences the older one.
    name: str = DEFAULT_PRODUCER_NAME
    dispatch: Dispatch = "reliable"  # used only when the produce auto-creates the topic
    linger_ms: float = 5.0
    batch_max_messages: int = 1000
    batch_max_bytes: int = 1024 * 1024
    max_pending_messages: int = 10_000
    max_inflight_batches: int = 1
    send_timeout_s: float = 30.0
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    # None: no producer session; "shared" / "exclusive": hold one (see the module docstring).
    access_mode: AccessMode | None = None
    transport: Transport = "binary"
    # Sequenced records, deduplicated by the leader (binary transport only: "json" sends
    # unsequenced records whatever this says).
    idempotent: bool = True
    # A payload over max_payload_bytes goes as chunks of that size, up to this many bytes
    # (docs/client.md, "Large messages"); off, such a payload is refused at send().
    chunking: bool = False
    max_chunked_message_bytes: int = CHUNKED_BYTES_DEFAULT
    # Each message's payload stored compressed ("zstd" or "lz4") when that makes it smaller
    # (binary transport only: docs/client.md, "Compression"). Consumers get it decompressed.
    compression: Compression | None = None
    # Post each batch to its partition's leader, as the lookup names it (docs/client.md,
    # "Direct produce"); off, or for a non-idempotent producer, everything goes through
    # the server the client was given (the proxy path: one address, e.g. a load balancer).
    direct: bool = True

    def __post_init__(self) -> None:
        check_producer_name(self.name)
        _check("linger_ms", self.linger_ms, 0, 60_000)
        _check("batch_max_messages", self.batch_max_messages, 1, SERVER_MAX_MESSAGES)
        _check("batch_max_bytes", self.batch_max_bytes, 4096, SERVER_MAX_BODY_BYTES)
        _check("max_pending_messages", self.max_pending_messages, 1, 10_000_000)
        _check("max_inflight_batches", self.max_inflight_batches, 1, 64)
        _check("send_timeout_s", self.send_timeout_s, 0.001, 3600)
        _check("max_payload_bytes", self.max_payload_bytes, 1, 64 * 1024 * 1024)
        if self.transport not in ("binary", "json"):
            raise InvalidArgumentError(f"transport must be binary or json, not {self.transport!r}")
        _check("max_chunked_message_bytes", self.max_chunked_message_bytes, 1, CHUNKED_BYTES_MAX)
        ordered = self.idempotent and self.transport == "binary"
        if self.chunking and self.max_inflight_batches > 1 and not ordered:
            # Unsequenced batches in flight together may be stored in either order: a
            # message's chunks would be, and its consumers would give it up.
            raise InvalidArgumentError(
                "chunking needs ordered batches: idempotent=True or max_inflight_batches=1"
            )
        if self.compression is not None and self.compression not in CODEC_IDS:
            raise InvalidArgumentError(
                f"compression must be zstd, lz4 or None, not {self.compression!r}"
            )
        if self.compression is not None and self.transport != "binary":
            raise InvalidArgumentError(
                "compression needs transport='binary' (a JSON body carries text, not records)"
            )
        if self.access_mode not in (None, "shared", "exclusive"):
            raise InvalidArgumentError(
                f"access_mode must be shared or exclusive, not {self.access_mode!r}"
            )


def _check(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be in {low}..{high}, got {value}")
