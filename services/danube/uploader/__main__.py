"""``python -m danube.uploader``: run one uploader node."""

from danube.runtime.service import run_service
from danube.uploader.app import serve

if __name__ == "__main__":
    run_service("uploader", serve)
