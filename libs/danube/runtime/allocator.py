"""Keep glibc's allocator from handing every large freed block back to the kernel.

A batched produce moves ~1 MB buffers through each service (the HTTP body, the bus request,
the NATS command, the WAL write), several alive at once. With glibc's defaults a freed
block past its thresholds goes back to the kernel (``munmap``, or the heap's top trimmed)
and the next one is faulted in page by page, zeroed: ~1 ms of system time per megabyte
instead of ~0.03 ms for the copy itself (docs/performance.md, "Batched produce through
send()"). Raising the two thresholds keeps such blocks for reuse: at most
:data:`TRIM_THRESHOLD_BYTES` of free memory stays with the process, and a block of
:data:`MMAP_THRESHOLD_BYTES` or more is still mapped on its own.

Only glibc has these knobs (``mallopt``); elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Above the largest request a service takes whole (16 MiB HTTP body) stays mapped apart.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Raise glibc's trim and mmap thresholds for this process; whether it took them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    taken = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not taken:
        log.warning("the allocator refused its thresholds; freed blocks go back to the kernel")
    return taken
