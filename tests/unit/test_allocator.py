"""The services' allocator setting: large buffers freed and allocated again are reused, not
faulted in anew from the kernel each time (glibc on Linux)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

# Two ~1 MB buffers alive at once, freed, again and again (what nats-py's publish of a
# batched produce did); the page faults the loop took.
_LOOP = """
import resource, sys
from danube.runtime.allocator import keep_freed_memory
taken = keep_freed_memory() if sys.argv[1] == "keep" else None
payload = b"x" * 1_050_000
for _ in range(20):
    (b"head" + payload) + b"tail"
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    (b"head" + payload) + b"tail"
print(taken, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _LOOP, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


def test_freed_large_buffers_are_reused_not_faulted_in_again() -> None:
    taken, kept = _faults("keep")
    _, default = _faults("default")
    assert taken == "True"
    assert kept < 200  # under one fault per round: the blocks stay with the process
    assert default > 10 * max(kept, 1)  # glibc's defaults fault pages in every round
