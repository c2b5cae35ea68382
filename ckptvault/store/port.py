"""The object store port: what ckptvault needs from any S3-like store, and the contract of each call.

Keys are full object keys (the adapter never adds a prefix). Every method raises `StoreError`
(or a subclass) with a message that names the bucket and key; transient failures (timeouts,
connection resets, 5xx, SlowDown) raise `TransientStoreError` so callers can retry only those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Called with the number of bytes just transferred; used for progress bars and artifacts.
ProgressFn = Callable[[int], None]


class StoreError(Exception):
    """A store operation failed; the message names the bucket/key and, where known, the fix."""


class TransientStoreError(StoreError):
    """A failure worth retrying: network error, timeout, 5xx, throttling."""


class NotFoundError(StoreError):
    """The bucket or key does not exist."""


class PreconditionFailedError(StoreError):
    """A conditional write lost: the object already exists (If-None-Match: *)."""


class ChecksumMismatchError(StoreError):
    """Bytes read or written do not match the expected checksum. Never transient."""


class ObjectFrozenError(StoreError):
    """The object is in an archival class and must be restored before it can be read."""


@dataclass(frozen=True)
class Capabilities:
    """What a server supports, detected by probing (see `S3Store.capabilities`)."""

    checksums_validated: bool  # server rejects a wrong x-amz-checksum-crc32c (BadDigest)
    conditional_writes: bool  # server honours If-None-Match: * with 412
    restore_object: bool  # RestoreObject implemented (AWS, moto)
    lifecycle_transitions: bool  # bucket lifecycle Transition rules accepted


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    storage_class: str  # "STANDARD" when the server omits it
    last_modified: float  # unix seconds
    metadata: Mapping[str, str] = field(default_factory=dict)  # only filled by head()
    restore: str | None = None  # raw x-amz-restore header, only filled by head()

    @property
    def crc32c(self) -> str | None:
        """The whole-object CRC32C (base64, as S3 spells it) that ckptvault stored as metadata."""
        return self.metadata.get("crc32c")


@dataclass(frozen=True)
class UploadResult:
    key: str
    size: int
    crc32c: str  # base64 big-endian CRC32C of the whole object, computed in the read pass
    sha256: str | None  # hex, only when asked for
    etag: str
    parts: int  # 0 for a single PUT


@dataclass(frozen=True)
class TransferConfig:
    """Validated transfer tuning. Memory bound: part_size * (max_concurrency + 1)."""

    part_size: int = 32 * 1024 * 1024
    multipart_threshold: int = 64 * 1024 * 1024
    max_concurrency: int = 4

    def __post_init__(self) -> None:
        if self.part_size < 5 * 1024 * 1024:
            raise ValueError(f"part_size must be at least 5 MiB (S3's minimum part), got {self.part_size}")
        if self.part_size > 5 * 1024**3:
            raise ValueError(f"part_size must be at most 5 GiB (S3's maximum part), got {self.part_size}")
        if self.multipart_threshold < self.part_size:
            raise ValueError("multipart_threshold must be >= part_size")
        if not 1 <= self.max_concurrency <= 64:
            raise ValueError(f"max_concurrency must be between 1 and 64, got {self.max_concurrency}")


class ObjectStore(Protocol):
    """One bucket of an S3-like store."""

    bucket: str

    def capabilities(self) -> Capabilities:
        """Probe once (cached): a few requests under `_ckptvault_probe/`, cleaned up after."""
        ...

    def check_bucket(self) -> None:
        """Raise StoreError naming the endpoint/bucket and the fix if it is unreachable or missing."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """Metadata of one object, or None if absent."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under prefix, paginated, in key order. Metadata is not filled."""
        ...

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        tags: Mapping[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        """Write a small object with its CRC32C. if_none_match: raise PreconditionFailedError if the key
        exists (on servers without conditional writes, a HEAD first; racy, and documented as such)."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """Read a small object whole. NotFoundError if absent, ObjectFrozenError if archived."""
        ...

    def upload_file(
        self,
        path: Path,
        key: str,
        *,
        tags: Mapping[str, str] | None = None,
        sha256: bool = False,
        progress: ProgressFn | None = None,
    ) -> UploadResult:
        """Stream a file up (multipart above the threshold), computing CRC32C (and SHA-256 if asked) in
        the same read pass, sending per-part checksums where the server validates them, storing the
        whole-file CRC32C as metadata `crc32c`, then verifying size and metadata with a HEAD."""
        ...

    def download_file(
        self,
        key: str,
        dest: Path,
        *,
        size: int,
        crc32c: str,
        progress: ProgressFn | None = None,
    ) -> None:
        """Parallel ranged GETs into `dest` (created or truncated), CRC32C checked against `crc32c`:
        ChecksumMismatchError naming the key if it differs. ObjectFrozenError if archived."""
        ...

    def delete(self, key: str) -> None: ...

    def abort_multipart_uploads(self, prefix: str, older_than: float | None = None) -> int:
        """Abort incomplete multipart uploads under prefix (initiated before `older_than`, unix s)."""
        ...
