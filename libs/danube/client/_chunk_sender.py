"""The producer's side of large messages (docs/client.md, "Large messages"): a payload over
``max_payload_bytes`` sent as chunks (:mod:`danube.client._chunking`) through the producer's
own ``send()``, one future for the whole message.

A layer above the producer, not inside it: each chunk is a plain message to the batching,
routing, sequencing and retries beneath. What this layer adds is order: the chunks of one
message are queued back to back under a lock, so two large messages sent at once from two
tasks never interleave their chunks (the consumer takes a later message's chunk as proof that
an earlier partial one lost a chunk); and the key: the message's own, else its uuid, so every
chunk lands in one partition (and on one consumer of a key_shared subscription).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from danube.client._chunking import chunk_attributes, new_uuid, split
from danube.client.errors import InvalidMessageError
from danube.client.messages import Message, Payload, SendResult
from danube.frame import MAX_ATTRIBUTES
from danube.wire import chunks as wire
from danube.wire import codes

# The producer's plain send: queue one message (at most max_payload_bytes), its future.
SendOne = Callable[..., Awaitable[asyncio.Future[SendResult]]]


class ChunkSender:
    """Splits and sends the payloads over ``chunk_bytes`` (at most ``total_bytes_max``)."""

    def __init__(self, send_one: SendOne, *, chunk_bytes: int, total_bytes_max: int) -> None:
        self._send_one = send_one
        self.chunk_bytes = chunk_bytes
        self.total_bytes_max = total_bytes_max
        self._order = asyncio.Lock()  # one message's chunks at a time into the queue

    def wants(self, payload: Payload | Message) -> bool:
        """Whether ``payload`` is too large for one record (so it goes as chunks)."""
        if isinstance(payload, Message):
            payload = payload.payload
        if isinstance(payload, str):
            # A str is at most 4 UTF-8 bytes a character: only long ones need encoding.
            if len(payload) * 4 <= self.chunk_bytes:
                return False
            payload = payload.encode("utf-8")
        return len(payload) > self.chunk_bytes

    async def send(
        self,
        payload: Payload | Message,
        key: str | None,
        attributes: Mapping[str, str] | None,
    ) -> asyncio.Future[SendResult]:
        """Queue the chunks of one message in order; the future resolves to where its first
        chunk is stored once every chunk is, or to the first error of their batches (then
        some chunks may be stored: a consumer gives the message up, docs/client.md)."""
        if isinstance(payload, Message):
            message = payload
            payload, key, attributes = message.payload, message.key, message.attributes
        data = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
        base = dict(attributes or {})
        self._check(data, base)
        uuid = new_uuid()
        pieces = split(data, self.chunk_bytes)
        chunk_key = key if key is not None else uuid
        futures: list[asyncio.Future[SendResult]] = []
        async with self._order:
            for index, piece in enumerate(pieces):
                chunk = chunk_attributes(base, uuid, index, len(pieces), len(data))
                futures.append(await self._send_one(bytes(piece), key=chunk_key, attributes=chunk))
        return _all_of(futures)

    def _check(self, data: bytes, attributes: dict[str, str]) -> None:
        if len(data) > self.total_bytes_max:
            raise InvalidMessageError(
                f"payload is {len(data)} bytes, over max_chunked_message_bytes "
                f"({self.total_bytes_max})",
                code=codes.PAYLOAD_TOO_LARGE,
            )
        if -(-len(data) // self.chunk_bytes) > wire.CHUNKS_MAX:
            raise InvalidMessageError(
                f"payload of {len(data)} bytes is over {wire.CHUNKS_MAX} chunks of "
                f"{self.chunk_bytes} bytes (raise max_payload_bytes)"
            )
        reserved = [name for name in attributes if name.startswith(wire.CHUNK_PREFIX)]
        if reserved:
            raise InvalidMessageError(
                f"attribute {reserved[0]!r}: names under {wire.CHUNK_PREFIX!r} are chunking's"
            )
        if len(attributes) + wire.ATTRIBUTES_COUNT > MAX_ATTRIBUTES:
            raise InvalidMessageError(
                f"{len(attributes)} attributes: a chunked message takes at most "
                f"{MAX_ATTRIBUTES - wire.ATTRIBUTES_COUNT} (chunking adds "
                f"{wire.ATTRIBUTES_COUNT})"
            )


def _all_of(futures: list[asyncio.Future[SendResult]]) -> asyncio.Future[SendResult]:
    """One future for the chunks: the first chunk's result once all are stored, else the
    first failed chunk's error (every chunk's outcome retrieved: no warning left behind)."""
    whole: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
    left = len(futures)

    def settled(_: asyncio.Future[SendResult]) -> None:
        nonlocal left
        left -= 1
        if left or whole.done():
            return
        for future in futures:
            if future.cancelled():
                whole.cancel()
                return
            error = future.exception()
            if error is not None:
                whole.set_exception(error)
                return
        whole.set_result(futures[0].result())

    for future in futures:
        future.add_done_callback(settled)
    return whole
