"""``python -m danube.uploader``: run one uploader node."""

from danube.uploader.app import serve

from danube.runtime.service import run_service

if __name__ == "__main__":
    run_service("uploader", serve)
