"""The bucket's versions through boto3: its versioning status and ListObjectVersions.

What the three servers do with these calls is measured in docs/object-lock.md ("After an attack"):
all three list versions and delete markers alike, and all three answer ListObjectVersions on a bucket
that never had versioning (every VersionId `null`), so only GetBucketVersioning tells such a bucket.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
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
        storage_class="" if marker else str(raw.get("StorageClass") or "STANDARD"),
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


# -- which version was current at a moment ----------------------------------------------------------
# Decided from a listing of versions, never from today's objects, which an attacker may have deleted or
# rewritten. A moment is unix seconds compared to the second, as the servers keep LastModified: a version
# written during that second counts as current at it. Two entries of one key in the same second keep the
# server's order (newest first), the only order that can tell them apart.


def written_by(v: ObjectVersion, at: float) -> bool:
    return math.floor(v.last_modified) <= math.floor(at)


def by_key(versions: Iterable[ObjectVersion]) -> dict[str, list[ObjectVersion]]:
    """The entries grouped per key, newest first within each (the listing's order kept on a tie)."""
    grouped: dict[str, list[ObjectVersion]] = {}
    for v in versions:
        grouped.setdefault(v.key, []).append(v)
    for entries in grouped.values():
        entries.sort(key=lambda v: -math.floor(v.last_modified))  # stable: a same-second tie keeps order
    return grouped


def current_at(entries: Sequence[ObjectVersion], at: float) -> ObjectVersion | None:
    """The version of one key a GET would have read at `at` (entries newest first, as `by_key` gives
    them): None when the key did not exist then or a delete marker was on top."""
    top = next((v for v in entries if written_by(v, at)), None)
    return None if top is None or top.delete_marker else top


class PointInTime:
    """The versions current at one moment, resolved from ListObjectVersions as they are asked for and
    remembered (a prefix listed once answers every key under it); shared by the threads of a restore."""

    def __init__(self, at: float) -> None:
        self.at = at
        self._lock = threading.Lock()
        self._known: dict[str, ObjectVersion | None] = {}
        self._listed: list[str] = []
        self._fixed = False

    @classmethod
    def fixed(cls, chosen: Iterable[ObjectVersion]) -> PointInTime:
        """Not a moment but chosen versions (`ObjectStore.pinned`): every other key, and a chosen delete
        marker, reads as absent, and nothing is listed from the server."""
        view = cls(math.inf)
        view._known = {v.key: None if v.delete_marker else v for v in chosen}
        view._listed = [""]
        view._fixed = True
        return view

    def absent_why(self) -> str:
        """Why a key this view has no version of reads as absent, for the error that says so."""
        if self._fixed:
            return "not one of the versions this view reads"
        return f"no version of it was current at {datetime.fromtimestamp(self.at, UTC):%Y-%m-%dT%H:%M:%SZ}"

    def _covered(self, key: str) -> bool:
        return key in self._known or any(key.startswith(p) for p in self._listed)

    def listing(self, client: S3Client, bucket: str, prefix: str) -> list[ObjectVersion]:
        """The versions current at the moment under `prefix`, by key."""
        if self._fixed:
            return sorted((v for v in self._known.values() if v and v.key.startswith(prefix)), key=lambda v: v.key)
        current = []
        found: dict[str, ObjectVersion | None] = {}
        for key, entries in by_key(list_versions(client, bucket, prefix)).items():
            found[key] = v = current_at(entries, self.at)
            if v is not None:
                current.append(v)
        with self._lock:
            self._known.update(found)
            self._listed.append(prefix)
        return sorted(current, key=lambda v: v.key)

    def version(self, client: S3Client, bucket: str, key: str) -> ObjectVersion | None:
        """The version of `key` current at the moment, or None when it had none."""
        with self._lock:
            if self._covered(key):
                return self._known.get(key)
        entries = [v for v in list_versions(client, bucket, key) if v.key == key]
        v = current_at(by_key(entries).get(key, []), self.at)
        with self._lock:
            self._known[key] = v
        return v
