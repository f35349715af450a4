"""``python -m danube.cloud_reader``: run one cloud reader."""

from danube.cloud_reader.app import serve
from danube.runtime.service import run_service

if __name__ == "__main__":
    run_service("cloud_reader", serve)
