"""Files in and out of a MemoryStore, with the contracts of S3Store's upload and download.

Upload: one read pass hashing CRC32C (and SHA-256 if asked); up to the multipart threshold one PUT
with metadata `crc32c`, above it a multipart upload whose parts carry their CRC32C and whose whole
object is completed with a FULL_OBJECT checksum; aborted on any failure, a file that changes or
shrinks while it is read refused. Part buffers come from the process-wide budget of
store/buffers.py, so `TransferConfig.buffer_budget` bounds this adapter's transfers too. Parts are
sent one after another: in memory there is no round trip for concurrency to hide.

Download: ranged reads into `dest`, the ranges' CRCs combined and compared with the expected one;
the object's size and ETag checked on every range; `dest` removed on any failure. One range of an
object (download_range) is written into the caller's existing file at its offset, and its CRC
returned for the caller to combine; the file is left to the caller on failure.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ckptvault.checksum import StreamHasher, crc32c_combine, crc32c_update, from_b64, join_pieces, to_b64, wants_blocks
from ckptvault.errors import InvalidArgumentError
from ckptvault.store.buffers import shared
from ckptvault.store.errors import ChecksumMismatchError, StoreError, TransientStoreError
from ckptvault.store.port import FetchedRange, ProgressFn, RangeSource, UploadResult
from ckptvault.store.upload_request import part_size_for

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ckptvault.store.memory_bucket import MemoryBucket


def _read_exactly(f: io.FileIO, view: memoryview, path: Path) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise StoreError(f"{path} shrank while it was being uploaded (got {got} of {len(view)} bytes)")
        got += n


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns


def upload_file(
    store: MemoryBucket,
    path: Path,
    key: str,
    *,
    tags: Mapping[str, str] | None,
    sha256: bool,
    progress: ProgressFn | None,
) -> UploadResult:
    transfer = store.transfer
    pool = shared(transfer.budget)
    with path.open("rb", buffering=0) as f:
        fd = f.fileno()
        before = _identity(fd)
        size = before[0]
        hasher = StreamHasher(sha256=sha256, blocks_at=0 if wants_blocks(size) else None)
        if size <= transfer.multipart_threshold:
            buf = pool.take(max(transfer.multipart_threshold, size, 1))
            try:
                view = memoryview(buf)[:size]
                _read_exactly(f, view, path)
                hasher.update(view)
                data = bytes(view)
                view.release()
            finally:
                pool.give(buf)
            if _identity(fd) != before:
                raise StoreError(f"{path} changed while it was being uploaded; not uploading a torn copy. Retry later")
            store.put_bytes(key, data, tags=tags)
            if progress:
                progress(size)
            info = store.head(key)
            assert info is not None
            return UploadResult(
                key, size, hasher.crc32c_b64, hasher.sha256_hex, info.etag, 0, True, blocks=_blocks(hasher)
            )
        part_size = part_size_for(size, transfer.part_size)
        upload_id = store.uploads.create(key, tags=tags, retention=store.retention)
        try:
            parts: list[tuple[int, str]] = []
            for number, offset in enumerate(range(0, size, part_size), start=1):
                buf = pool.take(part_size)
                try:
                    view = memoryview(buf)[: min(part_size, size - offset)]
                    _read_exactly(f, view, path)
                    part_crc = to_b64(hasher.update(view))
                    parts.append((number, store.uploads.upload_part(key, upload_id, number, bytes(view), part_crc)))
                    sent = len(view)
                    view.release()
                finally:
                    pool.give(buf)
                if progress:
                    progress(sent)
            if _identity(fd) != before:
                raise StoreError(f"{path} changed while it was being uploaded; not uploading a torn copy. Retry later")
            info = store.uploads.complete(key, upload_id, parts, crc32c=hasher.crc32c_b64)
        except BaseException:
            with contextlib.suppress(StoreError):  # already completed or aborted: nothing left to clean
                store.uploads.abort(key, upload_id)
            raise
    if info.size != size or info.parts != len(parts):
        raise ChecksumMismatchError(f"memory://{store.bucket}/{key}: the stored object does not match {path}")
    return UploadResult(
        key, size, hasher.crc32c_b64, hasher.sha256_hex, info.etag, len(parts), True, blocks=_blocks(hasher)
    )


def _blocks(hasher: StreamHasher) -> tuple[int, ...]:
    return join_pieces(hasher.blocks.cut()) if hasher.blocks is not None else ()


def copy_from(
    store: MemoryBucket,
    source: RangeSource,
    source_key: str,
    key: str,
    *,
    size: int,
    crc32c: str,
    tags: Mapping[str, str] | None,
    progress: ProgressFn | None,
) -> UploadResult:
    """S3Store.copy_from's contract: the source's ranges hashed as they come, the CRC32C compared
    before the single PUT or the completion, the multipart upload aborted on any failure."""
    where = f"{source.bucket}/{source_key}"
    transfer = store.transfer

    def mismatch(got: str) -> ChecksumMismatchError:
        return ChecksumMismatchError(
            f"{where}: its bytes' CRC32C is {got}, the manifest says {crc32c}; the copy to {store.where(key)} was "
            "not completed. The primary's object is damaged: restore that save from another copy or re-ingest it"
        )

    if size <= transfer.multipart_threshold:
        data = source.read_range(source_key, 0, size, size=size) if size else b""
        got = to_b64(crc32c_update(data))
        if got != crc32c:
            raise mismatch(got)
        store.put_bytes(key, data, tags=tags)
        if progress:
            progress(size)
        info = store.head(key)
        assert info is not None
        return UploadResult(key, size, got, None, info.etag, 0, True)
    part_size = part_size_for(size, transfer.part_size)
    upload_id = store.uploads.create(key, tags=tags, retention=store.retention)
    crc = 0
    try:
        parts: list[tuple[int, str]] = []
        for number, offset in enumerate(range(0, size, part_size), start=1):
            data = source.read_range(source_key, offset, min(part_size, size - offset), size=size)
            part_crc = crc32c_update(data)
            crc = crc32c_combine(crc, part_crc, len(data))
            parts.append((number, store.uploads.upload_part(key, upload_id, number, data, to_b64(part_crc))))
            if progress:
                progress(len(data))
        if to_b64(crc) != crc32c:
            raise mismatch(to_b64(crc))
        info = store.uploads.complete(key, upload_id, parts, crc32c=crc32c)
    except BaseException:
        with contextlib.suppress(StoreError):  # already completed or aborted: nothing left to clean
            store.uploads.abort(key, upload_id)
        raise
    return UploadResult(key, size, crc32c, None, info.etag, len(parts), True)


def download_file(
    store: MemoryBucket, key: str, dest: Path, *, size: int, crc32c: str, progress: ProgressFn | None
) -> None:
    where = f"memory://{store.bucket}/{key}"
    try:
        expected = from_b64(crc32c)
    except ValueError as e:
        raise StoreError(f"downloading {where}: the expected CRC32C is not valid: {e}") from None
    step = store.transfer.part_size
    try:
        with dest.open("wb") as out:
            crc, etags = 0, set()
            for start in range(0, max(size, 1), step):
                end = min(size, start + step)
                piece, total, etag = store.get_range(key, start, end)
                if total != size:
                    raise ChecksumMismatchError(f"downloading {where}: the object has {total} bytes, expected {size}")
                etags.add(etag)
                out.write(piece)
                crc = crc32c_combine(crc, crc32c_update(piece), len(piece))
                if progress:
                    progress(len(piece))
            if len(etags) > 1:
                raise TransientStoreError(
                    f"downloading {where}: the object was replaced while it was being read; retry"
                )
            if crc != expected:
                raise ChecksumMismatchError(
                    f"downloading {where}: CRC32C mismatch: expected {crc32c}, got {to_b64(crc)}. "
                    "The stored object is not what was uploaded"
                )
            out.flush()
            os.fsync(out.fileno())  # the caller renames the restored tree into place
    except BaseException:
        dest.unlink(missing_ok=True)  # never leave a partial or corrupt file that looks whole
        raise


def download_range(
    store: MemoryBucket,
    key: str,
    dest: Path,
    *,
    offset: int,
    length: int,
    size: int,
    progress: ProgressFn | None,
) -> FetchedRange:
    where = f"memory://{store.bucket}/{key}"
    if length <= 0 or offset < 0 or offset + length > size:
        raise InvalidArgumentError(
            f"downloading {where}: range {offset}+{length} is not a non-empty range of its {size} bytes"
        )
    step = store.transfer.part_size
    end = offset + length
    # never created nor truncated: the caller made it, and other ranges are written into it too
    fd = os.open(dest, os.O_WRONLY | os.O_CLOEXEC)
    try:
        crc, etags = 0, set()
        for start in range(offset, end, step):
            piece, total, etag = store.get_range(key, start, min(end, start + step))
            if total != size:
                raise ChecksumMismatchError(f"downloading {where}: the object has {total} bytes, expected {size}")
            etags.add(etag)
            written = 0
            while written < len(piece):
                written += os.pwrite(fd, memoryview(piece)[written:], start + written)
            crc = crc32c_combine(crc, crc32c_update(piece), len(piece))
            if progress:
                progress(len(piece))
        if len(etags) > 1:
            raise TransientStoreError(f"downloading {where}: the object was replaced while it was being read; retry")
        os.fsync(fd)
    finally:
        os.close(fd)
    return FetchedRange(key, offset, length, to_b64(crc), etags.pop())
