"""``python -m danube.discovery``: run one discovery instance."""

from danube.discovery.app import serve
from danube.runtime.service import run_service

if __name__ == "__main__":
    run_service("discovery", serve)
