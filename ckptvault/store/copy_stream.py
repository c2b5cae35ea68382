"""One object streamed from another store into this S3 store, without local disk (a replica's copy:
docs/FORMAT.md, "Replicas"). The source is read as one sequential file of ranged GETs, a few in
flight (RangeReader), and fed to the very pieces an upload of a hot file goes through: one PutObject
up to the multipart threshold (upload.put_single), else multipart.send_parts, so per-part checksums,
Content-MD5 on a locked write, the store's lock and storage class, the `crc32c` tag and the HEAD
verification are the upload's own. The one difference: the CRC32C of the bytes read is compared with
the one the caller expects (the manifest's) before the upload is completed, and a mismatch aborts it.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ckptvault.checksum import StreamHasher, crc32c_update, to_b64
from ckptvault.store.errors import ChecksumMismatchError
from ckptvault.store.multipart import abort, complete, create_upload, retag, send_parts
from ckptvault.store.port import UploadResult
from ckptvault.store.upload import put_single
from ckptvault.store.upload_request import UploadRequest, part_size_for, verify

# (offset, length) -> those bytes of the source object: one ranged GET
ReadFn = Callable[[int, int], bytes]


class RangeReader(io.RawIOBase):
    """The source object as a file read front to back: ranged GETs of `chunk` bytes, at most `ahead`
    in flight or waiting to be read, so memory is `ahead` chunks whatever the object's size."""

    def __init__(self, read: ReadFn, size: int, chunk: int, ahead: int) -> None:
        super().__init__()
        self._read, self._size, self._chunk, self._ahead = read, size, chunk, max(1, ahead)
        self._pool = ThreadPoolExecutor(self._ahead, thread_name_prefix="ckptvault-copy-get")
        self._pending: deque[Future[bytes]] = deque()
        self._next = 0  # offset of the next GET to start
        self._buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while len(self._pending) < self._ahead and self._next < self._size:
            n = min(self._chunk, self._size - self._next)
            self._pending.append(self._pool.submit(self._read, self._next, n))
            self._next += n

    def readinto(self, b: Any) -> int:
        if not len(self._buf):
            self._fill()
            if not self._pending:
                return 0
            self._buf = memoryview(self._pending.popleft().result())
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        for f in self._pending:
            f.cancel()
        self._pool.shutdown(wait=True)
        super().close()


def _mismatch(source: str, got: str, crc32c: str, req: UploadRequest) -> ChecksumMismatchError:
    return ChecksumMismatchError(
        f"{source}: its bytes' CRC32C is {got}, the manifest says {crc32c}; the copy to s3://{req.bucket}/{req.key} "
        "was not completed. The primary's object is damaged: restore that save from another copy or re-ingest it"
    )


def copy_object(req: UploadRequest, read: ReadFn, *, size: int, crc32c: str, source: str) -> UploadResult:
    """Write `size` bytes read through `read` as `req.key`, checked against `crc32c` before completion."""
    if size <= req.transfer.multipart_threshold:
        data = read(0, size) if size else b""
        got = to_b64(crc32c_update(data))
        if got != crc32c:
            raise _mismatch(source, got, crc32c, req)
        put_single(req, memoryview(data), got)
        if req.progress:
            req.progress(size)
        etag = verify(req, size=size, parts=0, crc=got, composite=None)
        return UploadResult(req.key, size, got, None, etag, 0, req.caps.checksums_validated)
    part_size = part_size_for(size, req.transfer.part_size)
    nparts = -(-size // part_size)
    upload_id = create_upload(req)
    hasher = StreamHasher()
    reader = RangeReader(read, size, part_size, req.transfer.max_concurrency)
    try:
        st = send_parts(req, reader, upload_id, part_size, size, range(1, nparts + 1), hasher)
        whole = hasher.crc32c_b64
        if whole != crc32c:
            raise _mismatch(source, whole, crc32c, req)
        composite = complete(req, upload_id, [st.done[n] for n in range(1, nparts + 1)], whole)
    except BaseException:
        abort(req, upload_id)
        raise
    finally:
        reader.close()
    if req.tags:
        retag(req)
    etag = verify(req, size=size, parts=nparts, crc=whole, composite=composite)
    return UploadResult(req.key, size, whole, None, etag, nparts, req.caps.checksums_validated)
