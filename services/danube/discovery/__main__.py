"""``python -m danube.discovery``: run one discovery instance."""

import uvloop

from danube.discovery.app import serve
from danube.runtime.service import run_service

if __name__ == "__main__":
    # uvloop: the produce path's front door spends less CPU per request in the loop and its
    # transports (docs/performance.md). Out of descriptors, libuv accepts and closes the
    # waiting connections instead of spinning on accept(), as AcceptBackoffLoop prevents on
    # asyncio's loop (tests/e2e/test_fault_descriptors.py).
    run_service("discovery", serve, loop_factory=uvloop.new_event_loop)
