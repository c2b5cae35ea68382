"""A MemoryStore's split uploads (the port's begin_upload / upload_parts / complete_upload /
abort_upload), with S3Store's contracts: parts read from the file as listed and sent with their
CRC32C, completed once with every part and the combined whole-file CRC32C (FULL_OBJECT, checked by
the store against the assembled bytes), aborted when completion fails. The checks that do not depend
on the server (which parts, the file unchanged, the combined CRC) are S3Store's own functions.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ckptvault.checksum import BlockCrcs, crc32c_update, to_b64, wants_blocks
from ckptvault.store.buffers import shared
from ckptvault.store.errors import ChecksumMismatchError, StoreError
from ckptvault.store.port import ProgressFn, SentPart, SplitUpload, UploadResult
from ckptvault.store.split_upload import changed, check_range, missing, source, split_blocks, whole_crc32c
from ckptvault.store.upload_request import part_size_for, read_exactly

if TYPE_CHECKING:
    from ckptvault.store.memory_bucket import MemoryBucket


def begin(
    store: MemoryBucket, path: Path, key: str, *, size: int, mtime: float, tags: Mapping[str, str] | None
) -> SplitUpload:
    part_size = part_size_for(size, store.transfer.part_size)
    upload_id = store.uploads.create(key, tags=tags, retention=store.retention)
    return SplitUpload(key, upload_id, str(path), size, mtime, part_size, tuple(sorted((tags or {}).items())))


def send(
    store: MemoryBucket, upload: SplitUpload, first: int, count: int, progress: ProgressFn | None
) -> tuple[SentPart, ...]:
    pool = shared(store.transfer.budget)
    out = []
    path = Path(upload.path)
    with path.open("rb", buffering=0) as f:
        before = os.fstat(f.fileno())
        check_range(upload, first, count, before)
        f.seek((first - 1) * upload.part_size)
        for number in range(first, first + count):
            want = min(upload.part_size, upload.size - (number - 1) * upload.part_size)
            buf = pool.take(upload.part_size)
            try:
                with memoryview(buf)[:want] as view:
                    read_exactly(f, view, path)
                    if wants_blocks(upload.size):  # the part's block pieces from the same hashing (S3Store's)
                        blocks = BlockCrcs((number - 1) * upload.part_size)
                        crc = blocks.update(view)
                        pieces = blocks.cut()
                    else:
                        crc, pieces = crc32c_update(view), ()
                    etag = store.uploads.upload_part(upload.key, upload.upload_id, number, bytes(view), to_b64(crc))
            finally:
                pool.give(buf)
            out.append(SentPart(number, etag, crc, want, source(before), pieces))
            if progress:
                progress(want)
        problem = changed(upload, os.fstat(f.fileno()))
        if problem:
            raise StoreError(problem)
    return tuple(out)


def finish(store: MemoryBucket, upload: SplitUpload, parts: Sequence[SentPart]) -> UploadResult:
    problem = missing(upload, parts)
    whole = to_b64(whole_crc32c(parts))
    try:
        if problem:
            raise StoreError(problem)
        ordered = sorted(parts, key=lambda p: p.number)
        info = store.uploads.complete(upload.key, upload.upload_id, [(p.number, p.etag) for p in ordered], crc32c=whole)
    except BaseException:
        abort(store, upload)
        raise
    if info.size != upload.size or info.parts != upload.parts:
        raise ChecksumMismatchError(f"{store.where(upload.key)}: the stored object does not match {upload.path}")
    blocks = split_blocks(upload.size, parts)
    return UploadResult(upload.key, upload.size, whole, None, info.etag, upload.parts, True, blocks=blocks)


def abort(store: MemoryBucket, upload: SplitUpload) -> None:
    with contextlib.suppress(StoreError):  # completed or aborted already: nothing left to clean
        store.uploads.abort(upload.key, upload.upload_id)
