"""Multipart uploads of a MemoryStore, as S3 has them: CreateMultipartUpload, UploadPart with a
CRC32C checked against the part's bytes (BadDigest), CompleteMultipartUpload of listed parts in
ascending order (InvalidPart, EntityTooSmall under 5 MiB but the last, a FULL_OBJECT CRC32C checked
against the assembled bytes), AbortMultipartUpload and ListMultipartUploads. An object appears only
at completion; until then nothing of it is listed or readable.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckptvault.checksum import crc32c_combine, crc32c_update, from_b64, to_b64
from ckptvault.store.errors import ChecksumMismatchError, NotFoundError, StoreError
from ckptvault.store.limits import MAX_PARTS, MIN_PART
from ckptvault.store.port import ObjectInfo, Retention


class Bucket(Protocol):
    """What the uploads use of the MemoryStore they belong to, declared here: the store imports this
    module, which so never imports the store back."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...  # the store's one lock, shared with its uploads

    @property
    def clock(self) -> Callable[[], float]: ...

    def where(self, key: str | None = None) -> str: ...

    def check_tags(self, key: str, tags: Mapping[str, str]) -> dict[str, str]: ...

    def commit(
        self, key: str, data: bytes, crc: int, tag: str, tags: dict[str, str], retention: Retention | None = None
    ) -> None: ...

    def head(self, key: str) -> ObjectInfo | None: ...


def etag(data: bytes) -> str:
    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def multipart_etag(parts: Iterable[bytes]) -> str:
    # S3's multipart ETag: the MD5 of the parts' binary MD5s, suffixed with the part count.
    digests = [hashlib.md5(p, usedforsecurity=False).digest() for p in parts]
    return f'"{hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"'


@dataclass(frozen=True)
class Upload:
    """An incomplete multipart upload, as ListMultipartUploads reports it."""

    key: str
    upload_id: str
    initiated: float


@dataclass
class _Pending:
    key: str
    initiated: float
    tags: dict[str, str]
    retention: Retention | None = None  # as S3 takes it: at CreateMultipartUpload
    parts: dict[int, tuple[bytes, str]] = field(default_factory=dict)  # number -> (bytes, ETag)


class Uploads:
    """The incomplete multipart uploads of one MemoryStore, under its lock."""

    def __init__(self, store: Bucket) -> None:
        self._store = store
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)

    def create(self, key: str, *, tags: Mapping[str, str] | None = None, retention: Retention | None = None) -> str:
        checked = self._store.check_tags(key, tags or {})
        with self._store.lock:
            upload_id = f"memory-upload-{next(self._ids)}"
            self._pending[upload_id] = _Pending(key, self._store.clock(), checked, retention)
            return upload_id

    def _get(self, key: str, upload_id: str) -> _Pending:
        up = self._pending.get(upload_id)
        if up is None or up.key != key:
            raise NotFoundError(
                f"uploading {self._store.where(key)}: no multipart upload {upload_id} (NoSuchUpload): completed, "
                "aborted or never started"
            )
        return up

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes, crc32c: str | None = None) -> str:
        """Store part `number` (1..10,000), replacing an earlier one of that number, and return its ETag."""
        where = self._store.where(key)
        if not 1 <= number <= MAX_PARTS:
            raise StoreError(f"uploading {where}: part number {number} is not in 1..{MAX_PARTS}")
        if crc32c is not None and from_b64(crc32c) != crc32c_update(data):
            raise ChecksumMismatchError(
                f"uploading part {number} of {where}: the part's bytes do not match its CRC32C {crc32c} (BadDigest)"
            )
        tag = etag(data)
        with self._store.lock:
            self._get(key, upload_id).parts[number] = (bytes(data), tag)
        return tag

    def complete(
        self, key: str, upload_id: str, parts: Iterable[tuple[int, str]], *, crc32c: str | None = None
    ) -> ObjectInfo:
        """Assemble the listed (number, ETag) parts into the object; with `crc32c` (FULL_OBJECT) the
        whole object must hash to it, or the upload stays open and nothing is written."""
        where = self._store.where(key)
        with self._store.lock:
            up = self._get(key, upload_id)
            chosen = list(parts)
            numbers = [n for n, _ in chosen]
            if not chosen or numbers != sorted(set(numbers)):
                raise StoreError(f"completing {where}: list the parts once each, in ascending order (InvalidPartOrder)")
            if any(up.parts.get(n, (b"", ""))[1] != tag for n, tag in chosen):
                raise StoreError(f"completing {where}: a listed part was not uploaded with that ETag (InvalidPart)")
            pieces = [up.parts[n][0] for n in numbers]
            if any(len(p) < MIN_PART for p in pieces[:-1]):
                raise StoreError(f"completing {where}: a part other than the last is under 5 MiB (EntityTooSmall)")
            crc = 0
            for p in pieces:
                crc = crc32c_combine(crc, crc32c_update(p), len(p))
            if crc32c is not None and from_b64(crc32c) != crc:
                raise ChecksumMismatchError(
                    f"completing {where}: the assembled object's CRC32C is {to_b64(crc)}, not {crc32c} (BadDigest)"
                )
            self._store.commit(key, b"".join(pieces), crc, multipart_etag(pieces), up.tags, up.retention)
            del self._pending[upload_id]
            info = self._store.head(key)
        assert info is not None  # written above, under the lock
        return info

    def abort(self, key: str, upload_id: str) -> None:
        with self._store.lock:
            self._get(key, upload_id)
            del self._pending[upload_id]

    def list(self, prefix: str) -> tuple[Upload, ...]:
        with self._store.lock:
            found = [Upload(u.key, i, u.initiated) for i, u in self._pending.items() if u.key.startswith(prefix)]
        return tuple(sorted(found, key=lambda u: (u.key, u.initiated)))

    def abort_all(self, prefix: str, older_than: float | None) -> int:
        aborted = 0
        with self._store.lock:
            for u in self.list(prefix):
                if older_than is None or u.initiated < older_than:
                    del self._pending[u.upload_id]
                    aborted += 1
        return aborted
