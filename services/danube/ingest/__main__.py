"""``python -m danube.ingest``: run one ingest node."""

import uvloop

from danube.ingest.app import serve
from danube.runtime.service import run_service

if __name__ == "__main__":
    # uvloop, as discovery: every produce crosses this loop several times (the bus request,
    # the group commit's hand-off to its thread and back, the reply), and libuv's loop and
    # transports cost about half of asyncio's per turn (docs/performance.md). Out of
    # descriptors, libuv accepts and closes waiting connections instead of spinning on
    # accept() (tests/e2e/test_fault_descriptors.py runs an ingest node at 256).
    run_service("ingest", serve, loop_factory=uvloop.new_event_loop)
