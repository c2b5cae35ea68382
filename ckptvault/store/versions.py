"""The bucket's versions through boto3: its versioning status and ListObjectVersions.

What the three servers do with these calls is measured in docs/object-lock.md ("After an attack"):
all three list versions and delete markers alike, and all three answer ListObjectVersions on a bucket
that never had versioning (every VersionId `null`), so only GetBucketVersioning tells such a bucket.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ckptvault.store.port import ObjectVersion

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def versioning_status(client: S3Client, bucket: str) -> str | None:
    """`Enabled`, `Suspended`, or None where versioning was never turned on."""
    status = client.get_bucket_versioning(Bucket=bucket).get("Status")
    return str(status) if status else None


def _entry(raw: Any, marker: bool) -> ObjectVersion:
    return ObjectVersion(
        key=raw["Key"],
        version_id=str(raw.get("VersionId") or "null"),
        last_modified=raw["LastModified"].timestamp(),
        size=0 if marker else int(raw.get("Size", 0)),
        etag="" if marker else str(raw.get("ETag", "")),
        delete_marker=marker,
        latest=bool(raw.get("IsLatest")),
    )


def list_versions(client: S3Client, bucket: str, prefix: str) -> Iterator[ObjectVersion]:
    """Every version and delete marker under `prefix`: keys in order, each key's entries newest first.
    S3 pages the two kinds in separate lists; within a page they are merged back into the server's order
    (by key, then newest first; a marker and a version of the same second keep the marker first, as a
    delete follows what it deletes)."""
    pages = client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        entries = [_entry(v, False) for v in page.get("Versions", [])]
        entries += [_entry(m, True) for m in page.get("DeleteMarkers", [])]
        # Python's sort is stable and each list arrives newest first per key: sort by key, then by time
        entries.sort(key=lambda e: (e.key, -int(e.last_modified), not e.delete_marker))
        yield from entries
