"""Compressed request bodies: ``Content-Encoding: gzip`` or ``zstd`` on a produce
(docs/http-api.md, "Compressed bodies").

A produce body may come compressed; it is inflated here, before anything reads it, to at most
``discovery.max_body_bytes`` — the limit a body sent as is has — so a small body that
inflates past it (a zip bomb) is refused with 413 ``body_too_large`` having inflated no more
than the limit and stored nothing. The inflated body is then served exactly as if it had been
sent so (its ``Content-Length`` set, the ``Content-Encoding`` gone). Other routes take no
encoded body: 415 ``unsupported_content_encoding``.

Pure functions; :class:`~danube.discovery.doors.http.middleware.ApiFront` calls them.
"""

from __future__ import annotations

import zlib

import zstandard
from starlette.types import Scope

from danube.discovery.errors import BadRequestError, TooLargeError, UnsupportedMediaTypeError

ENCODINGS = ("gzip", "zstd")
"""What a produce body may be encoded with (``identity``, or no header, is as sent)."""

_CONTENT_ENCODING = b"content-encoding"
_CONTENT_LENGTH = b"content-length"
# zlib's window bits for a gzip stream (header and trailer checked), not a raw or zlib one.
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_READ_BYTES = 64 * 1024  # inflated per step: the bound is checked between steps


def content_encoding(scope: Scope) -> str | None:
    """The request's ``Content-Encoding`` (lowercase), None when it has none or ``identity``."""
    for name, value in scope["headers"]:
        if name == _CONTENT_ENCODING:
            encoding = value.decode("latin-1").strip().lower()
            return None if encoding in ("", "identity") else encoding
    return None


def check_encoding(encoding: str, *, produce: bool) -> None:
    """415 ``unsupported_content_encoding`` unless ``encoding`` is one a produce takes and
    the request is a produce."""
    if not produce or encoding not in ENCODINGS:
        where = "a produce body" if produce else "this route's body"
        raise UnsupportedMediaTypeError(
            f"Content-Encoding {encoding[:40]!r} is not taken for {where} "
            f"(a produce takes {', '.join(ENCODINGS)} or identity)",
            code="unsupported_content_encoding",
        )


def inflate(encoding: str, body: bytes, *, limit_bytes: int) -> bytes:
    """``body`` decoded from ``encoding`` (one of :data:`ENCODINGS`): 413 ``body_too_large``
    as soon as it passes ``limit_bytes`` (never inflating much past it), 400
    ``invalid_content_encoding`` when it is not a whole stream of that encoding."""
    try:
        if encoding == "gzip":
            return _gunzip(body, limit_bytes)
        return _unzstd(body, limit_bytes)
    except (zlib.error, zstandard.ZstdError) as exc:
        raise BadRequestError(
            f"the body is not valid {encoding}: {exc}", code="invalid_content_encoding"
        ) from None


def _too_large(limit_bytes: int) -> TooLargeError:
    return TooLargeError(
        f"request body over the limit of {limit_bytes} bytes once decompressed",
        code="body_too_large",
        limit=limit_bytes,
    )


def _truncated(encoding: str) -> BadRequestError:
    return BadRequestError(
        f"the body ends inside its {encoding} stream", code="invalid_content_encoding"
    )


def _gunzip(body: bytes, limit_bytes: int) -> bytes:
    """One or more gzip members, end to end (what ``gzip`` and ``cat a.gz b.gz`` make)."""
    parts: list[bytes] = []
    size = 0
    rest = body
    while rest:
        inflater = zlib.decompressobj(_GZIP_WBITS)
        pending = rest
        while pending and not inflater.eof:
            # At most the room left plus one byte: past the limit is known without more.
            part = inflater.decompress(pending, limit_bytes - size + 1)
            size += len(part)
            if size > limit_bytes:
                raise _too_large(limit_bytes)
            parts.append(part)
            pending = inflater.unconsumed_tail
        if not inflater.eof:
            raise _truncated("gzip")
        rest = inflater.unused_data
    return b"".join(parts)


def _unzstd(body: bytes, limit_bytes: int) -> bytes:
    """One or more zstd frames, end to end. A frame's stated content size is not trusted:
    the output is counted as it comes, in steps, so a bomb stops at the limit. The stream
    reader does not tell a truncated frame from a whole one; once the output is known to be
    within the limit, a second pass (its output dropped) checks that every frame ends."""
    reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
    parts: list[bytes] = []
    size = 0
    while True:
        part = reader.read(min(_READ_BYTES, limit_bytes - size + 1))
        if not part:
            break
        size += len(part)
        if size > limit_bytes:
            raise _too_large(limit_bytes)
        parts.append(part)
    rest = body
    if not rest:
        raise _truncated("zstd")
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        frame.decompress(rest)  # within the limit: the first pass counted it
        if not frame.eof:
            raise _truncated("zstd")
        rest = frame.unused_data
    return b"".join(parts)


def decoded_scope(scope: Scope, size_bytes: int) -> Scope:
    """``scope`` as if its body of ``size_bytes`` had been sent as is: its
    ``Content-Length`` that size, no ``Content-Encoding``."""
    headers = [
        (name, value)
        for name, value in scope["headers"]
        if name not in (_CONTENT_ENCODING, _CONTENT_LENGTH)
    ]
    headers.append((_CONTENT_LENGTH, str(size_bytes).encode()))
    return {**scope, "headers": headers}
