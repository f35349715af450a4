"""The PUB and HPUB commands nats-py writes for every publish, built with one copy of the
payload instead of two.

nats-py 2.16 (``nats.protocol.command``) builds them with ``+`` twice: the command line and
the headers plus the payload, then that plus the closing CRLF, so two buffers of the
payload's size are alive at once. For the ~1 MB of a batched produce, glibc hands each back
to the kernel on free and faults fresh pages in for the next: measured ~1 ms per command
against ~0.02 ms for one ``join`` (docs/performance.md, "Batched produce through send()").
The bytes are the same, as the NATS protocol lays them out::

    PUB <subject> [reply-to] <#bytes>\\r\\n[payload]\\r\\n
    HPUB <subject> [reply-to] <#header bytes> <#total bytes>\\r\\n[headers][payload]\\r\\n

:func:`install` puts them in place of nats-py's (nats-py looks the builders up on its
``command`` module at every publish); the bus calls it before it connects.
"""

from __future__ import annotations

from nats.protocol import command

_CRLF = b"\r\n"


def pub_command(subject: str, reply: str, payload: bytes) -> bytes:
    """``PUB``: what ``nats.protocol.command.pub_cmd`` returns, the payload copied once."""
    line = f"PUB {subject} {reply} {len(payload)}\r\n".encode()
    return b"".join((line, payload, _CRLF))


def hpub_command(subject: str, reply: str, hdr: bytes | bytearray, payload: bytes) -> bytes:
    """``HPUB``: what ``nats.protocol.command.hpub_cmd`` returns, the payload copied once
    (``hdr``: the headers block, named as nats-py names it)."""
    line = f"HPUB {subject} {reply} {len(hdr)} {len(hdr) + len(payload)}\r\n".encode()
    return b"".join((line, hdr, payload, _CRLF))


def install() -> None:
    """Make nats-py build its PUB and HPUB commands with the functions above."""
    command.pub_cmd = pub_command
    command.hpub_cmd = hpub_command
