"""Create a bucket on an S3 server, idempotently: the compose smoke's stand-in for the
bucket step of docker-compose.yml, run as the `s3-init` one-shot in the servers image.

Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (boto3's own chain).
Retries for a bounded time: the server may still be starting.
"""

from __future__ import annotations

import argparse
import sys
import time

import boto3
from botocore.exceptions import BotoCoreError, ClientError

RETRY_FOR_S = 30.0
RETRY_PAUSE_S = 0.5


def make_bucket(endpoint: str, bucket: str, region: str) -> str:
    """Create ``bucket`` unless it exists; the outcome as a word."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=region)
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in (
            "BucketAlreadyOwnedByYou",
            "BucketAlreadyExists",
        ):
            return "exists"
        raise
    return "created"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--region", default="us-east-1")
    args = parser.parse_args()
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        try:
            outcome = make_bucket(args.endpoint, args.bucket, args.region)
        except (BotoCoreError, ClientError) as exc:
            if time.monotonic() > deadline:
                sys.stderr.write(f"make_bucket: {args.bucket} at {args.endpoint}: {exc}\n")
                return 1
            time.sleep(RETRY_PAUSE_S)
            continue
        sys.stderr.write(f"make_bucket: {args.bucket} {outcome}\n")
        return 0


if __name__ == "__main__":
    sys.exit(main())
