"""What every upload of one file shares, single PUT or multipart, raw or framed: the request, a
part's bytes as a file botocore can rewind, the part size, and the checks around the bytes (the file
did not change while read, and one HEAD says the server holds what we sent). Why the CRC32C goes where
it does: ckptvault/store/upload.py.
"""

from __future__ import annotations

import io
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptvault.store import object_lock
from ckptvault.store.botocore_errors import translate
from ckptvault.store.errors import ChecksumMismatchError, StoreError
from ckptvault.store.limits import MAX_PART, MAX_PARTS, MIB
from ckptvault.store.object_lock import content_md5
from ckptvault.store.port import CRC_TAG, Capabilities, LockStatus, ProgressFn, TransferConfig

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class BufferReader(io.RawIOBase):
    """A seekable file over a memoryview, so botocore can stream (and on retry rewind) a part
    without copying it into a bytes object."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self._view) - self._pos)
        b[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        out = bytes(self._view[self._pos : end])
        self._pos = max(self._pos, end)
        return out

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)


@dataclass(frozen=True)
class UploadRequest:
    client: S3Client
    bucket: str
    key: str
    path: Path
    transfer: TransferConfig
    caps: Capabilities
    put_args: Mapping[str, Any]  # SSE and ContentType, passed to PutObject / CreateMultipartUpload
    tags: Mapping[str, str] | None
    sha256: bool
    progress: ProgressFn | None
    endpoint: str | None
    # Content-MD5 on every body (object_lock.needs_content_md5): the write is locked, by us or by the
    # bucket's default retention, and no validated CRC32C header goes with it; S3 refuses it with neither
    content_md5: bool = False
    # The bucket's Object Lock configuration where the store read it (a bucket that asked for the
    # integrity header): a completed multipart object the server left without the bucket's default
    # retention (moto) gets it in verify
    bucket_lock: LockStatus | None = None


def integrity(req: UploadRequest, view: memoryview | bytes) -> dict[str, Any]:
    """The Content-MD5 argument a locked body (ours or the bucket default's) needs where no CRC32C header
    goes with it."""
    return {"ContentMD5": content_md5(view)} if req.content_md5 else {}


def part_size_for(size: int, configured: int) -> int:
    """The configured part size, grown (in whole MiB) where a file would need more than 10,000 parts."""
    need = -(-size // MAX_PARTS)
    part = max(configured, -(-need // MIB) * MIB)
    if part > MAX_PART:
        raise StoreError(f"a file of {size} bytes exceeds S3's limit of {MAX_PARTS} parts of 5 GiB")
    return part


def tagging(tags: Mapping[str, str] | None) -> dict[str, Any]:
    # %20, not "+", for spaces: Ceph RGW takes "+" literally.
    return {"Tagging": urllib.parse.urlencode(dict(tags), quote_via=urllib.parse.quote)} if tags else {}


def read_exactly(f: io.RawIOBase, view: memoryview, path: Path) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise StoreError(f"{path} shrank while it was being uploaded (got {got} of {len(view)} bytes)")
        got += n


def check_unchanged(f: io.FileIO, before: os.stat_result, path: Path) -> None:
    after = os.fstat(f.fileno())
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise StoreError(f"{path} changed while it was being uploaded; not uploading a torn copy. Retry later")


def verify(req: UploadRequest, *, size: int, parts: int, crc: str, composite: str | None) -> str:
    """HEAD the new object and compare what the server reports with what we read and sent (`crc`: the
    CRC32C of the stored bytes). Then, on a multipart object the server keeps no CRC32C of, the
    `crc32c` tag (CRC_TAG) with it, and last the lock the upload asked for, where the server dropped it."""
    try:
        head = req.client.head_object(Bucket=req.bucket, Key=req.key, ChecksumMode="ENABLED")
    except Exception as e:
        raise translate(e, op="verifying the upload of", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e
    where = f"s3://{req.bucket}/{req.key}"
    etag = str(head.get("ETag", ""))
    problems = []
    if head["ContentLength"] != size:
        problems.append(f"size {head['ContentLength']} != {size} bytes read")
    suffix = etag.strip('"').rpartition("-")[2]
    if parts and "-" in etag and suffix.isdigit() and int(suffix) != parts:
        problems.append(f"ETag says {suffix} parts, we uploaded {parts}")
    if not parts and head.get("Metadata", {}).get("crc32c", crc) != crc:
        problems.append(f"metadata crc32c {head['Metadata']['crc32c']} != {crc}")
    server = head.get("ChecksumCRC32C")
    if server and req.caps.checksums_validated:
        expected = composite if (composite and "-" in server) else crc
        if server != expected:
            problems.append(f"server CRC32C {server} != {expected}")
    if problems:
        raise ChecksumMismatchError(f"{where}: the uploaded object does not match {req.path}: " + "; ".join(problems))
    if parts and not req.caps.checksums_validated:
        # The server keeps no whole-object CRC32C of a multipart object: this tag is how a rerun knows
        # it (ckptvault.ingest.steps.plan_upload). Set before the lock: a kill between the two leaves
        # an unlocked object the rerun reuses and locks. Tagged after it, a kill in between left a
        # locked object the rerun could not recognise and sent again, its killed version staying
        # behind locked and billed until its date (docs/object-lock.md, "A crash mid-upload").
        tagset: Any = [{"Key": k, "Value": v} for k, v in {**(req.tags or {}), CRC_TAG: crc}.items()]
        try:
            req.client.put_object_tagging(Bucket=req.bucket, Key=req.key, Tagging={"TagSet": tagset})
        except Exception as e:
            raise translate(e, op="tagging", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e
    lock = object_lock.from_head(req.put_args)[0]
    if lock is not None:
        # Ceph RGW 16.2 and moto drop the lock given at CreateMultipartUpload: the completed object has
        # none. Set it now, before any manifest names the object (docs/FORMAT.md, "Object Lock").
        try:
            object_lock.raise_to(req.client, req.bucket, req.key, lock, object_lock.from_head(head)[0])
        except Exception as e:
            raise translate(e, op="locking", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e
    elif req.bucket_lock is not None and object_lock.from_head(head)[0] is None:
        # moto applies a bucket's default retention to a PUT but not to a completed multipart upload
        # (SeaweedFS, Ceph RGW 16.2 and AWS do): give it the date the default gives from its write
        default = object_lock.default_retention(req.bucket_lock, head["LastModified"])
        if default is not None:
            try:
                object_lock.raise_to(req.client, req.bucket, req.key, default, None)
            except Exception as e:
                raise translate(e, op="locking", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e
    return etag
