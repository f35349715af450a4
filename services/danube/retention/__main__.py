"""``python -m danube.retention``: run one retention node (one of them leads)."""

from danube.retention.app import serve
from danube.runtime.service import run_service

if __name__ == "__main__":
    run_service("retention", serve)
