"""``python -m danube.dispatcher``: run one dispatcher node."""

import uvloop

from danube.dispatcher.app import serve
from danube.runtime.service import run_service

if __name__ == "__main__":
    # uvloop, as discovery and ingest: each delivery is a live wake-up, a fetch from ingest
    # and a reply to discovery on this loop (docs/performance.md).
    run_service("dispatcher", serve, loop_factory=uvloop.new_event_loop)
