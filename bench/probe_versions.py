"""What an S3 server does with the calls point-in-time recovery needs, measured, not assumed.

    python bench/probe_versions.py ENDPOINT [REGION]

On a new bucket with Object Lock (so versioned), for each mode in governance and compliance: an object is
written with a retention, written again (an overwrite: a second version), then deleted without a version
id (a delete marker). Then, one line each: ListObjectVersions under the prefix (versions and delete
markers, in which order, IsLatest), GetObject and HeadObject of the first VersionId, CopyObject of that
version onto its own key (a new current version), DeleteObject of the delete marker's VersionId (which
makes the older version current again: the undo of a plain delete), and DeleteObject of a locked data
version (which must be refused). Then a bucket without versioning: what ListObjectVersions answers there.
Each line says `ok` with what came back, or the error code: docs/object-lock.md keeps the table.
Keys: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (the local servers' defaults if unset).
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError


def client(endpoint: str, region: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "ckptvault"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "ckptvault-secret"),
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def attempt(label: str, call: Callable[[], str]) -> str:
    try:
        line = f"{label}: ok, {call()}"
    except ClientError as e:
        err = e.response.get("Error", {})
        line = f"{label}: refused, {err.get('Code')} (HTTP {e.response['ResponseMetadata']['HTTPStatusCode']})"
    print(line, flush=True)
    return line


def probe_mode(s3: Any, bucket: str, mode: str) -> None:
    key = f"probe/{mode}/data.bin"
    until = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)
    lock = {"ObjectLockMode": mode.upper(), "ObjectLockRetainUntilDate": until}
    first = s3.put_object(Bucket=bucket, Key=key, Body=b"first version", **lock)["VersionId"]
    s3.put_object(Bucket=bucket, Key=key, Body=b"second, overwriting", **lock)
    s3.delete_object(Bucket=bucket, Key=key)
    print(f"--- {mode}")
    seen: dict[str, str] = {}

    def listing() -> str:
        page = s3.list_object_versions(Bucket=bucket, Prefix=f"probe/{mode}/")
        rows = [("v", v["VersionId"] == first, v["IsLatest"], v["Size"]) for v in page.get("Versions", [])]
        rows += [("marker", False, m["IsLatest"], 0) for m in page.get("DeleteMarkers", [])]
        marks = [m["VersionId"] for m in page.get("DeleteMarkers", [])]
        seen["marker"] = marks[0] if marks else ""
        count = len(page.get("Versions", []))
        return f"{count} versions, {len(marks)} delete markers, rows (kind, first, latest, size) {rows}"

    attempt("ListObjectVersions", listing)
    attempt("GetObject of a current delete marker", lambda: str(s3.get_object(Bucket=bucket, Key=key)["ContentLength"]))
    attempt(
        "GetObject VersionId=first",
        lambda: repr(s3.get_object(Bucket=bucket, Key=key, VersionId=first)["Body"].read()),
    )
    attempt(
        "HeadObject VersionId=first",
        lambda: "size {ContentLength}, lock {ObjectLockMode}".format_map(
            {"ObjectLockMode": None} | s3.head_object(Bucket=bucket, Key=key, VersionId=first)
        ),
    )
    copy_key = f"probe/{mode}/copy.bin"
    attempt(
        "CopyObject of VersionId=first",
        lambda: (
            "new version "
            + s3.copy_object(
                Bucket=bucket, Key=copy_key, CopySource={"Bucket": bucket, "Key": key, "VersionId": first}
            ).get("VersionId", "?")
            + ", its lock: "
            + str(s3.head_object(Bucket=bucket, Key=copy_key).get("ObjectLockMode"))
        ),
    )
    marker = seen.get("marker", "")
    attempt(
        "DeleteObject of the delete marker's VersionId",
        lambda: (
            "then GET gives " + repr(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            if s3.delete_object(Bucket=bucket, Key=key, VersionId=marker) is not None
            else ""
        ),
    )
    attempt(
        "DeleteObject of a locked version (must be refused)",
        lambda: str(s3.delete_object(Bucket=bucket, Key=key, VersionId=first).get("VersionId")),
    )


def main(endpoint: str, region: str = "us-east-1") -> None:
    s3 = client(endpoint, region)
    bucket = f"probe-versions-{uuid.uuid4().hex[:8]}"
    create: dict[str, Any] = {"Bucket": bucket, "ObjectLockEnabledForBucket": True}
    if region != "us-east-1":
        create["CreateBucketConfiguration"] = {"LocationConstraint": region}
    s3.create_bucket(**create)
    print(f"{endpoint}: bucket {bucket} (Object Lock)")
    for mode in ("governance", "compliance"):
        probe_mode(s3, bucket, mode)
    plain = f"probe-plain-{uuid.uuid4().hex[:8]}"
    plain_create = {k: v for k, v in create.items() if k != "ObjectLockEnabledForBucket"} | {"Bucket": plain}
    s3.create_bucket(**plain_create)
    s3.put_object(Bucket=plain, Key="k", Body=b"x")
    print("--- a bucket without versioning")
    attempt(
        "GetBucketVersioning",
        lambda: str(s3.get_bucket_versioning(Bucket=plain).get("Status", "never enabled")),
    )
    attempt(
        "ListObjectVersions",
        lambda: str([(v["Key"], v["VersionId"]) for v in s3.list_object_versions(Bucket=plain).get("Versions", [])]),
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
