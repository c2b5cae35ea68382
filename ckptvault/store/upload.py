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
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from ckptvault.checksum import StreamHasher, join_pieces, wants_blocks
from ckptvault.store import object_lock
from ckptvault.store.botocore_errors import error_code, translate
from ckptvault.store.buffers import shared
from ckptvault.store.limits import MAX_COPY, MIB
from ckptvault.store.multipart import upload_multipart
from ckptvault.store.port import TransferConfig, UploadResult
from ckptvault.store.upload_request import (
    BufferReader,
    UploadRequest,
    check_unchanged,
    integrity,
    part_size_for,
    read_exactly,
    tagging,
    verify,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def upload_file(req: UploadRequest) -> UploadResult:
    with req.path.open("rb", buffering=0) as f:
        fd = f.fileno()
        before = os.fstat(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # deeper readahead on the hot tier
        if before.st_size <= req.transfer.multipart_threshold:
            return _single(req, f, before)
        return upload_multipart(req, f, before)


def _single(req: UploadRequest, f: io.FileIO, before: os.stat_result) -> UploadResult:
    size = before.st_size
    hasher = StreamHasher(sha256=req.sha256, blocks_at=0 if wants_blocks(size) else None)
    pool = shared(req.transfer.budget)
    # Files up to the threshold: one buffer of the part size, so small and big files share one
    # kind of buffer in the pool.
    buf = pool.take(max(req.transfer.multipart_threshold, size, 1))
    view = memoryview(buf)[:size]
    try:
        read_exactly(f, view, req.path)
        hasher.update(view)
        check_unchanged(f, before, req.path)
        crc = hasher.crc32c_b64
        put_single(req, view, crc)
    finally:
        view.release()
        pool.give(buf)
    if req.progress:
        req.progress(size)
    etag = verify(req, size=size, parts=0, crc=crc, composite=None)
    blocks = join_pieces(hasher.blocks.cut()) if hasher.blocks is not None else ()
    return UploadResult(req.key, size, crc, hasher.sha256_hex, etag, 0, req.caps.checksums_validated, blocks=blocks)


def put_single(req: UploadRequest, view: memoryview, crc: str) -> None:
    """PutObject of `view` (CRC32C `crc`, already computed): the CRC as metadata and, where the server
    validates it, as the checksum header; Content-MD5 where a locked write needs it. The caller verifies."""
    extra: dict[str, Any] = {"ChecksumCRC32C": crc} if req.caps.checksums_validated else {}
    try:
        req.client.put_object(
            Bucket=req.bucket,
            Key=req.key,
            Body=cast(IO[bytes], BufferReader(view)),
            ContentLength=len(view),
            Metadata={"crc32c": crc},
            **tagging(req.tags),
            **req.put_args,
            **extra,
            **integrity(req, view),
        )
    except Exception as e:
        raise translate(e, op="uploading to", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e


COPY_LIMIT = MAX_COPY
COPY_PART = 512 * MIB


def _copy_object(
    client: S3Client, common: Mapping[str, Any], head: Mapping[str, Any], storage_class: str, args: Mapping[str, Any]
) -> None:
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
    An Object Lock retention or legal hold on the object is kept on the copy (docs/FORMAT.md).

    Up to 5 GiB one CopyObject does it (MetadataDirective/TaggingDirective COPY). Above, S3 needs a
    multipart copy (UploadPartCopy), which cannot COPY metadata or tags: we read them first and pass
    them on. Every copy is pinned to the ETag we saw (CopySourceIfMatch), so a concurrent overwrite
    fails the copy instead of mixing two versions.
    """
    head = client.head_object(Bucket=bucket, Key=key)
    if (head.get("StorageClass") or "STANDARD") == storage_class:
        return False
    args: dict[str, Any] = {k: v for k, v in sse_args.items() if k != "ContentType"}
    lock = object_lock.carried(head)
    common: dict[str, Any] = {
        "Bucket": bucket,
        "Key": key,
        "CopySource": {"Bucket": bucket, "Key": key},
        "CopySourceIfMatch": head["ETag"],
    }
    if head["ContentLength"] <= single_limit:
        try:
            _copy_object(client, common, head, storage_class, args | lock)
        except ClientError as e:
            if not lock or error_code(e) != object_lock.MISSING_INTEGRITY_HEADER:
                raise
            # moto wants Content-MD5 on a locked CopyObject, which has no body to hash (and no such
            # parameter): copy unlocked, then lock the copy below. The version it replaces stays locked.
            _copy_object(client, common, head, storage_class, args)
        object_lock.keep_after_copy(client, bucket, key, head)
        return True
    tags = {t["Key"]: t["Value"] for t in client.get_object_tagging(Bucket=bucket, Key=key).get("TagSet", [])}
    create: dict[str, Any] = {
        **args,
        **lock,
        "StorageClass": storage_class,
        "Metadata": head.get("Metadata", {}),
        "ContentType": head.get("ContentType", "application/octet-stream"),
        **tagging(tags),
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
    if tags:  # Ceph drops CreateMultipartUpload's Tagging header (see multipart.retag)
        tagset: Any = [{"Key": k, "Value": v} for k, v in tags.items()]
        client.put_object_tagging(Bucket=bucket, Key=key, Tagging={"TagSet": tagset})
    object_lock.keep_after_copy(client, bucket, key, head)
    return True
