"""Streamed upload with same-pass hashing: every byte is read from the file exactly once.

The reading thread fills mmap part buffers (page-aligned: reading into them is ~5x faster than into
a bytearray), hashes each part (CRC32C, SHA-256 if asked) in file order, and hands it to a thread
pool for UploadPart. Buffers come from one budget for the whole process (store/buffers.py) and at
most `max_concurrency + 1` per file; the reader blocks when they are all in flight, so memory stays
flat whatever the file sizes and however many files are sent at once.

Where the whole-file CRC32C lives (decided deliberately):
- Single PUT: as user metadata `crc32c` (x-amz-meta-crc32c) and, where the server validates
  checksums, as the object checksum x-amz-checksum-crc32c too.
- Multipart: metadata is fixed at CreateMultipartUpload, before the CRC is known. Where the server
  supports full-object checksums (AWS, SeaweedFS) the upload is created with ChecksumType
  FULL_OBJECT and completed with the whole-file CRC32C, which the server checks against the bytes it
  assembled and then reports on HEAD: end-to-end and free. Elsewhere (Ceph: checksums ignored)
  the object carries no CRC. We do not CopyObject with new metadata (a full server-side copy of
  hundreds of GB) nor put the CRC in a tag (tags are mutable, limited to 10, and belong to the caller).
  The manifest, written last by the caller, is the authoritative record of every file's CRC32C.
Verification after upload (one HEAD): size; the part count from the ETag suffix "-N"; the
whole-object CRC32C or the composite "crc-of-part-crcs-N" where the server reports one. Per-part
CRCs are sent with each UploadPart where the server validates them, so a corrupted part fails
(BadDigest) at once.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import threading
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from ckptvault.checksum import StreamHasher, crc32c_update, from_b64, to_b64
from ckptvault.store.buffers import PartBuffers, shared
from ckptvault.store.errors import error_code, translate
from ckptvault.store.limits import MAX_COPY, MAX_PART, MAX_PARTS, MIB
from ckptvault.store.port import (
    Capabilities,
    ChecksumMismatchError,
    ProgressFn,
    StoreError,
    TransferConfig,
    UploadResult,
)

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


def part_size_for(size: int, configured: int) -> int:
    """The configured part size, grown (in whole MiB) where a file would need more than 10,000 parts."""
    need = -(-size // MAX_PARTS)
    part = max(configured, -(-need // MIB) * MIB)
    if part > MAX_PART:
        raise StoreError(f"a file of {size} bytes exceeds S3's limit of {MAX_PARTS} parts of 5 GiB")
    return part


def upload_file(req: UploadRequest) -> UploadResult:
    with req.path.open("rb", buffering=0) as f:
        fd = f.fileno()
        before = os.fstat(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # deeper readahead on the hot tier
        if before.st_size <= req.transfer.multipart_threshold:
            return _single(req, f, before)
        return _multipart(req, f, before)


def _tagging(tags: Mapping[str, str] | None) -> dict[str, Any]:
    # %20, not "+", for spaces: Ceph RGW takes "+" literally.
    return {"Tagging": urllib.parse.urlencode(dict(tags), quote_via=urllib.parse.quote)} if tags else {}


def _read_exactly(f: io.FileIO, view: memoryview, path: Path) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise StoreError(f"{path} shrank while it was being uploaded (got {got} of {len(view)} bytes)")
        got += n


def _check_unchanged(f: io.FileIO, before: os.stat_result, path: Path) -> None:
    after = os.fstat(f.fileno())
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise StoreError(f"{path} changed while it was being uploaded; not uploading a torn copy. Retry later")


def _single(req: UploadRequest, f: io.FileIO, before: os.stat_result) -> UploadResult:
    size = before.st_size
    hasher = StreamHasher(sha256=req.sha256)
    pool = shared(req.transfer.budget)
    # Files up to the threshold: one buffer of the part size, so small and big files share one
    # kind of buffer in the pool.
    buf = pool.take(max(req.transfer.multipart_threshold, size, 1))
    view = memoryview(buf)[:size]
    try:
        _read_exactly(f, view, req.path)
        hasher.update(view)
        _check_unchanged(f, before, req.path)
        crc = hasher.crc32c_b64
        extra: dict[str, Any] = {"ChecksumCRC32C": crc} if req.caps.checksums_validated else {}
        try:
            req.client.put_object(
                Bucket=req.bucket,
                Key=req.key,
                Body=cast(IO[bytes], BufferReader(view)),
                ContentLength=size,
                Metadata={"crc32c": crc},
                **_tagging(req.tags),
                **req.put_args,
                **extra,
            )
        except Exception as e:
            raise translate(e, op="uploading to", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e
    finally:
        view.release()
        pool.give(buf)
    if req.progress:
        req.progress(size)
    etag = _verify(req, size=size, parts=0, crc=crc, composite=None)
    return UploadResult(req.key, size, crc, hasher.sha256_hex, etag, 0, req.caps.checksums_validated)


class _Parts:
    """Bookkeeping shared by the reader and the part workers of one file. Buffers come from the
    process-wide pool (store/buffers.py); at most `limit` of them per file, so one big file cannot
    starve the others of the budget."""

    def __init__(self, limit: int, part_size: int, pool: PartBuffers) -> None:
        self.part_size = part_size
        self.pool = pool
        self.slots = threading.Semaphore(limit)
        self.failed = threading.Event()
        self.done: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def take(self) -> mmap.mmap:
        self.slots.acquire()  # blocks while this file has `limit` parts in flight
        try:
            return self.pool.take(self.part_size)
        except BaseException:
            self.slots.release()
            raise

    def give(self, buf: mmap.mmap) -> None:
        self.pool.give(buf)
        self.slots.release()


def _multipart(req: UploadRequest, f: io.FileIO, before: os.stat_result) -> UploadResult:
    size = before.st_size
    part_size = part_size_for(size, req.transfer.part_size)
    nparts = -(-size // part_size)
    caps = req.caps
    create: dict[str, Any] = {**req.put_args, **_tagging(req.tags)}
    if caps.checksums_validated:
        create["ChecksumAlgorithm"] = "CRC32C"
        if caps.full_object_checksums:
            create["ChecksumType"] = "FULL_OBJECT"
    try:
        upload_id = req.client.create_multipart_upload(Bucket=req.bucket, Key=req.key, **create)["UploadId"]
    except Exception as e:
        raise translate(e, op="starting the upload of", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e

    hasher = StreamHasher(sha256=req.sha256)
    st = _Parts(min(nparts, req.transfer.max_concurrency + 1), part_size, shared(req.transfer.budget))
    futures: list[Future[None]] = []
    pool = ThreadPoolExecutor(req.transfer.max_concurrency, thread_name_prefix="ckptvault-upload")
    try:
        for i in range(nparts):
            buf = st.take()
            if st.failed.is_set():
                st.give(buf)
                break
            want = min(part_size, size - i * part_size)
            view = memoryview(buf)[:want]
            _read_exactly(f, view, req.path)
            part_crc = hasher.update(view)
            futures.append(pool.submit(_upload_part, req, st, upload_id, i + 1, buf, view, part_crc))
        for fut in futures:
            fut.result()  # re-raises the first part failure
        _check_unchanged(f, before, req.path)
        whole = hasher.crc32c_b64
        composite = _complete(req, upload_id, st, nparts, whole)
    except BaseException:
        st.failed.set()
        pool.shutdown(wait=True, cancel_futures=True)
        _abort(req, upload_id)
        raise
    finally:
        pool.shutdown(wait=True)
    if req.tags:
        _retag(req)
    etag = _verify(req, size=size, parts=nparts, crc=whole, composite=composite)
    return UploadResult(req.key, size, whole, hasher.sha256_hex, etag, nparts, caps.checksums_validated)


def _upload_part(
    req: UploadRequest, st: _Parts, upload_id: str, number: int, buf: mmap.mmap, view: memoryview, crc: int
) -> None:
    try:
        if st.failed.is_set():
            return
        extra: dict[str, Any] = {"ChecksumCRC32C": to_b64(crc)} if req.caps.checksums_validated else {}
        try:
            resp = req.client.upload_part(
                Bucket=req.bucket,
                Key=req.key,
                UploadId=upload_id,
                PartNumber=number,
                Body=cast(IO[bytes], BufferReader(view)),
                ContentLength=len(view),
                **extra,
            )
        except Exception as e:
            raise translate(
                e, op=f"uploading part {number} of", bucket=req.bucket, key=req.key, endpoint=req.endpoint
            ) from e
        echoed = resp.get("ChecksumCRC32C")
        if extra and echoed and echoed != extra["ChecksumCRC32C"]:
            raise ChecksumMismatchError(
                f"s3://{req.bucket}/{req.key} part {number}: server stored CRC32C {echoed}, we sent {to_b64(crc)}"
            )
        entry: dict[str, Any] = {"PartNumber": number, "ETag": resp["ETag"], **extra}
        with st.lock:
            st.done[number] = entry
        if req.progress:
            req.progress(len(view))
    except BaseException:
        st.failed.set()
        raise
    finally:
        view.release()
        st.give(buf)


def _complete(req: UploadRequest, upload_id: str, st: _Parts, nparts: int, whole: str) -> str | None:
    parts: Any = [st.done[n] for n in range(1, nparts + 1)]
    extra: dict[str, Any] = {}
    composite = None
    if req.caps.checksums_validated:
        if req.caps.full_object_checksums:
            extra = {"ChecksumCRC32C": whole, "ChecksumType": "FULL_OBJECT"}
        else:
            # S3's composite checksum: CRC32C over the concatenated raw part CRCs, suffixed "-N".
            raw = b"".join(from_b64(p["ChecksumCRC32C"]).to_bytes(4, "big") for p in parts)
            composite = f"{to_b64(crc32c_update(raw))}-{nparts}"
    try:
        req.client.complete_multipart_upload(
            Bucket=req.bucket, Key=req.key, UploadId=upload_id, MultipartUpload={"Parts": parts}, **extra
        )
    except Exception as e:
        raise translate(e, op="completing the upload of", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e
    return composite


def _retag(req: UploadRequest) -> None:
    # Ceph RGW 16.2 drops the Tagging header of CreateMultipartUpload; one PutObjectTagging per
    # multipart object (each is >= one part, tens of MB) is cheap and makes tags uniform everywhere.
    tagset: Any = [{"Key": k, "Value": v} for k, v in (req.tags or {}).items()]
    try:
        req.client.put_object_tagging(Bucket=req.bucket, Key=req.key, Tagging={"TagSet": tagset})
    except Exception as e:
        raise translate(e, op="tagging", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e


def _abort(req: UploadRequest, upload_id: str) -> None:
    with contextlib.suppress(Exception):  # best effort: the abort-incomplete-MPU lifecycle rule is the backstop
        req.client.abort_multipart_upload(Bucket=req.bucket, Key=req.key, UploadId=upload_id)


def _verify(req: UploadRequest, *, size: int, parts: int, crc: str, composite: str | None) -> str:
    """HEAD the new object and compare what the server reports with what we read and sent."""
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
    return etag


COPY_LIMIT = MAX_COPY
COPY_PART = 512 * MIB


def copy_in_place(
    client: S3Client,
    bucket: str,
    key: str,
    storage_class: str,
    sse_args: Mapping[str, Any],
    transfer: TransferConfig,
    *,
    single_limit: int = COPY_LIMIT,
) -> bool:
    """Rewrite an object onto itself in another storage class, server side, keeping metadata and tags.
    Returns False (and does nothing) if it is already in that class. Raises botocore errors untranslated.

    Up to 5 GiB one CopyObject does it (MetadataDirective/TaggingDirective COPY). Above, S3 needs a
    multipart copy (UploadPartCopy), which cannot COPY metadata or tags: we read them first and pass
    them on. Every copy is pinned to the ETag we saw (CopySourceIfMatch), so a concurrent overwrite
    fails the copy instead of mixing two versions.
    """
    head = client.head_object(Bucket=bucket, Key=key)
    if (head.get("StorageClass") or "STANDARD") == storage_class:
        return False
    args: dict[str, Any] = {k: v for k, v in sse_args.items() if k != "ContentType"}
    common: dict[str, Any] = {
        "Bucket": bucket,
        "Key": key,
        "CopySource": {"Bucket": bucket, "Key": key},
        "CopySourceIfMatch": head["ETag"],
    }
    if head["ContentLength"] <= single_limit:
        try:
            client.copy_object(
                **common,
                StorageClass=cast(Any, storage_class),  # custom classes too (Ceph COLD), not just AWS's
                MetadataDirective="COPY",
                TaggingDirective="COPY",
                **args,
            )
        except ClientError as e:
            if error_code(e) != "InvalidRequest":
                raise
            # SeaweedFS refuses a same-key copy that changes only the storage class; restating the
            # same metadata (REPLACE) counts as a change there and means the same thing everywhere.
            client.copy_object(
                **common,
                StorageClass=cast(Any, storage_class),
                MetadataDirective="REPLACE",
                Metadata=head.get("Metadata", {}),
                ContentType=head.get("ContentType", "application/octet-stream"),
                TaggingDirective="COPY",
                **args,
            )
        return True
    tags = {t["Key"]: t["Value"] for t in client.get_object_tagging(Bucket=bucket, Key=key).get("TagSet", [])}
    create: dict[str, Any] = {
        **args,
        "StorageClass": storage_class,
        "Metadata": head.get("Metadata", {}),
        "ContentType": head.get("ContentType", "application/octet-stream"),
        **_tagging(tags),
    }
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    size = head["ContentLength"]
    part = part_size_for(size, max(COPY_PART, transfer.part_size))
    ranges = [(i + 1, s, min(size, s + part) - 1) for i, s in enumerate(range(0, size, part))]

    def copy_part(n: int, first: int, last: int) -> dict[str, Any]:
        resp = client.upload_part_copy(
            **common, UploadId=upload_id, PartNumber=n, CopySourceRange=f"bytes={first}-{last}"
        )
        return {"PartNumber": n, "ETag": resp["CopyPartResult"]["ETag"]}

    try:
        with ThreadPoolExecutor(transfer.max_concurrency, thread_name_prefix="ckptvault-copy") as pool:
            parts: Any = list(pool.map(lambda r: copy_part(*r), ranges))
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
    except BaseException:
        with contextlib.suppress(Exception):  # best effort: the lifecycle rule is the backstop
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise
    if tags:  # Ceph drops CreateMultipartUpload's Tagging header (see _retag)
        tagset: Any = [{"Key": k, "Value": v} for k, v in tags.items()]
        client.put_object_tagging(Bucket=bucket, Key=key, Tagging={"TagSet": tagset})
    return True
