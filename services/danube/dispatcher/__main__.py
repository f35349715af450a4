"""``python -m danube.dispatcher``: run one dispatcher node."""

from danube.dispatcher.app import serve
from danube.runtime.service import run_service

if __name__ == "__main__":
    run_service("dispatcher", serve)
