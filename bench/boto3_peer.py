"""The boto3 peer: `upload_file` / `download_file` with boto3's defaults, one file after another.

    python bench/boto3_peer.py upload SRC_DIR ENDPOINT BUCKET PREFIX
    python bench/boto3_peer.py download ENDPOINT BUCKET PREFIX DEST_DIR

Defaults means defaults: boto3's TransferConfig (8 MiB parts, 10 threads) and its default checksum
behaviour. Only the endpoint, path-style addressing (local servers have no wildcard DNS) and the
region (from AWS_REGION) are set. Credentials come from the environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import boto3
from botocore.config import Config


def _client():  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=sys.argv[2] if sys.argv[1] == "download" else sys.argv[3],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}),
    )


def upload(src: Path, bucket: str, prefix: str) -> None:
    s3 = _client()
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        s3.upload_file(str(path), bucket, prefix.rstrip("/") + "/" + path.relative_to(src).as_posix())


def download(bucket: str, prefix: str, dest: Path) -> None:
    s3 = _client()
    prefix = prefix.rstrip("/") + "/"
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            target = dest / obj["Key"][len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(target))


if __name__ == "__main__":
    if sys.argv[1] == "upload":
        upload(Path(sys.argv[2]), sys.argv[4], sys.argv[5])
    elif sys.argv[1] == "download":
        download(sys.argv[3], sys.argv[4], Path(sys.argv[5]))
    else:
        raise SystemExit(__doc__)
