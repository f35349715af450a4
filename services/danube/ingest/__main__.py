"""``python -m danube.ingest``: run one ingest node."""

from danube.ingest.app import serve
from danube.runtime.service import run_service

if __name__ == "__main__":
    run_service("ingest", serve)
