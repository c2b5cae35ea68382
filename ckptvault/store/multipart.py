"""Multipart upload of one file: the reading thread fills part buffers and hashes them in file order,
a thread pool sends them (UploadPart), and CompleteMultipartUpload carries the whole-file or the
composite CRC32C where the server checks it (ckptvault/store/upload.py says which and why). The
framed upload (store/framed.py) sends its parts through the same pieces.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any, cast

from ckptvault.checksum import Piece, StreamHasher, crc32c_update, from_b64, join_pieces, to_b64, wants_blocks
from ckptvault.store.botocore_errors import translate
from ckptvault.store.buffers import PartBuffers, shared
from ckptvault.store.errors import ChecksumMismatchError
from ckptvault.store.port import UploadResult
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


class Parts:
    """Bookkeeping shared by the reader and the part workers of one file. Buffers come from the
    process-wide pool (store/buffers.py); at most `limit` of them per file, so one big file cannot
    starve the others of the budget."""

    def __init__(self, limit: int, part_size: int, pool: PartBuffers) -> None:
        self.part_size = part_size
        self.pool = pool
        self.slots = threading.Semaphore(limit)
        self.failed = threading.Event()
        self.done: dict[int, dict[str, Any]] = {}  # CompleteMultipartUpload's entry of each part sent
        self.crcs: dict[int, tuple[int, int]] = {}  # part number -> (CRC32C, size) of the bytes read
        self.pieces: dict[int, tuple[Piece, ...]] = {}  # part number -> its block pieces, where the hasher keeps blocks
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


def create_upload(req: UploadRequest) -> str:
    """Start the multipart upload of `req` (its object arguments and tags); parts then carry CRC32C,
    whole-object where the server validates that. Returns the upload id."""
    create: dict[str, Any] = {**req.put_args, **tagging(req.tags)}
    if req.caps.checksums_validated:
        create["ChecksumAlgorithm"] = "CRC32C"
        if req.caps.full_object_checksums:
            create["ChecksumType"] = "FULL_OBJECT"
    try:
        return req.client.create_multipart_upload(Bucket=req.bucket, Key=req.key, **create)["UploadId"]
    except Exception as e:
        raise translate(e, op="starting the upload of", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e


def upload_multipart(req: UploadRequest, f: io.FileIO, before: os.stat_result) -> UploadResult:
    size = before.st_size
    part_size = part_size_for(size, req.transfer.part_size)
    nparts = -(-size // part_size)
    caps = req.caps
    upload_id = create_upload(req)
    hasher = StreamHasher(sha256=req.sha256, blocks_at=0 if wants_blocks(size) else None)
    try:
        st = send_parts(req, f, upload_id, part_size, size, range(1, nparts + 1), hasher)
        check_unchanged(f, before, req.path)
        whole = hasher.crc32c_b64
        composite = complete(req, upload_id, [st.done[n] for n in range(1, nparts + 1)], whole)
    except BaseException:
        abort(req, upload_id)
        raise
    if req.tags:
        retag(req)
    etag = verify(req, size=size, parts=nparts, crc=whole, composite=composite)
    blocks = (
        join_pieces(p for n in range(1, nparts + 1) for p in st.pieces.get(n, ())) if hasher.blocks is not None else ()
    )
    return UploadResult(req.key, size, whole, hasher.sha256_hex, etag, nparts, caps.checksums_validated, blocks=blocks)


def send_parts(
    req: UploadRequest, f: io.RawIOBase, upload_id: str, part_size: int, size: int, numbers: range, hasher: StreamHasher
) -> Parts:
    """Read parts `numbers` of the file from where `f` stands, in order, hashing each (its CRC32C is
    its UploadPart checksum and goes into `Parts.crcs`), and send them on a pool of
    `max_concurrency` threads. Returns once every part is stored; the first failure stops the reading
    and is raised (the caller aborts or leaves the upload, not this)."""
    st = Parts(min(len(numbers), req.transfer.max_concurrency + 1), part_size, shared(req.transfer.budget))
    futures: list[Future[None]] = []
    pool = ThreadPoolExecutor(req.transfer.max_concurrency, thread_name_prefix="ckptvault-upload")
    try:
        for number in numbers:
            buf = st.take()
            if st.failed.is_set():
                st.give(buf)
                break
            want = min(part_size, size - (number - 1) * part_size)
            view = memoryview(buf)[:want]
            try:
                read_exactly(f, view, req.path)
            except BaseException:
                view.release()
                st.give(buf)  # the pool is the process's: a lost buffer shrinks every later upload's budget
                raise
            part_crc = hasher.update(view)
            with st.lock:
                st.crcs[number] = (part_crc, want)
                if hasher.blocks is not None:
                    st.pieces[number] = hasher.blocks.cut()
            futures.append(pool.submit(upload_part, req, st, upload_id, number, buf, view, part_crc))
        for fut in futures:
            fut.result()  # re-raises the first part failure
    except BaseException:
        st.failed.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
    return st


def upload_part(
    req: UploadRequest, st: Parts, upload_id: str, number: int, buf: mmap.mmap, view: memoryview, crc: int
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
                **integrity(req, view),
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


def complete(req: UploadRequest, upload_id: str, parts: Any, whole: str) -> str | None:
    """CompleteMultipartUpload of `parts` (its entries, in order); returns S3's composite checksum
    where the server reports one instead of the whole-object CRC32C."""
    nparts = len(parts)
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


def retag(req: UploadRequest) -> None:
    # Ceph RGW 16.2 drops the Tagging header of CreateMultipartUpload; one PutObjectTagging per
    # multipart object (each is >= one part, tens of MB) is cheap and makes tags uniform everywhere.
    # Where the server keeps no CRC32C of the object (Ceph among them), verify puts these tags with
    # the CRC32C tag right after its HEAD instead: a kill before that tag makes a rerun send the file
    # again (its killed version left behind), so no request goes between the completion and it but the HEAD.
    if not req.caps.checksums_validated:
        return
    tagset: Any = [{"Key": k, "Value": v} for k, v in (req.tags or {}).items()]
    try:
        req.client.put_object_tagging(Bucket=req.bucket, Key=req.key, Tagging={"TagSet": tagset})
    except Exception as e:
        raise translate(e, op="tagging", bucket=req.bucket, key=req.key, endpoint=req.endpoint) from e


def abort(req: UploadRequest, upload_id: str) -> None:
    with contextlib.suppress(Exception):  # best effort: the abort-incomplete-MPU lifecycle rule is the backstop
        req.client.abort_multipart_upload(Bucket=req.bucket, Key=req.key, UploadId=upload_id)
