"""One file's multipart upload sent by several tasks (`[scale] split_size_mb`): begin in the flow,
ranges of whole parts read and sent where the file is (each range its own task, on any Dask worker
that sees the file, or on the node that holds it), completed once by the flow with every part.

The whole-file CRC32C is combined in part order from the parts' CRCs (each computed from the bytes in
the pass that sent them), so it is the CRC of exactly the bytes the object is assembled from; where
the server checks a FULL_OBJECT checksum (AWS, SeaweedFS) it checks that one against the assembled
object at completion, as for a file sent by one task (ckptvault/store/upload.py). Each range refuses a
file whose size or mtime is not the one discovery listed, before and after its read: the parts all
come from one version of the file, which is what check_unchanged guarantees for an unsplit upload.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ckptvault.checksum import StreamHasher, crc32c_combine, join_pieces, to_b64, wants_blocks
from ckptvault.store.errors import StoreError, TransientStoreError
from ckptvault.store.multipart import abort, complete, create_upload, retag, send_parts
from ckptvault.store.port import SentPart, SplitUpload, UploadResult
from ckptvault.store.upload_request import UploadRequest, check_unchanged, part_size_for, verify


def begin(req: UploadRequest, size: int, mtime: float) -> SplitUpload:
    part_size = part_size_for(size, req.transfer.part_size)
    upload_id = create_upload(req)
    tags = tuple(sorted((req.tags or {}).items()))
    return SplitUpload(req.key, upload_id, str(req.path), size, mtime, part_size, tags)


def source(st: os.stat_result) -> tuple[int, int, int]:
    """Which file a range read: a rename-over changes the inode, a rewrite in place or a utime the ctime."""
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def changed(upload: SplitUpload, st: os.stat_result) -> str | None:
    """Why the file is not the one listed (None: it is)."""
    if st.st_size != upload.size or st.st_mtime != upload.mtime:
        return (
            f"{upload.path} changed since it was listed (size {st.st_size}, was {upload.size}; mtime "
            f"{st.st_mtime}, was {upload.mtime}); not uploading a torn copy. The next pass sends it again"
        )
    return None


def check_range(upload: SplitUpload, first: int, count: int, st: os.stat_result) -> None:
    """StoreError if parts first..first+count-1 are not parts of the upload, or the open file (`st`) is
    not the one listed: what every store checks before it reads a range."""
    if first < 1 or count < 1 or first + count - 1 > upload.parts:
        raise StoreError(f"{upload.path}: parts {first}..{first + count - 1} are not in 1..{upload.parts}")
    problem = changed(upload, st)
    if problem:
        raise StoreError(problem)


def send(req: UploadRequest, upload: SplitUpload, first: int, count: int) -> tuple[SentPart, ...]:
    with req.path.open("rb", buffering=0) as f:
        fd = f.fileno()
        before = os.fstat(fd)
        check_range(upload, first, count, before)
        start = (first - 1) * upload.part_size
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, start, 0, os.POSIX_FADV_SEQUENTIAL)
        f.seek(start)
        numbers = range(first, first + count)
        # each range keeps the block pieces of what it reads: its first part may start inside a block
        hasher = StreamHasher(blocks_at=start if wants_blocks(upload.size) else None)
        st = send_parts(req, f, upload.upload_id, upload.part_size, upload.size, numbers, hasher)
        check_unchanged(f, before, req.path)
    return tuple(
        SentPart(n, str(st.done[n]["ETag"]), *st.crcs[n], source(before), st.pieces.get(n, ())) for n in numbers
    )


def missing(upload: SplitUpload, parts: Sequence[SentPart]) -> str | None:
    """What is wrong with `parts` as the whole of `upload` (None: every part 1..N once, sizes adding up)."""
    numbers = sorted(p.number for p in parts)
    want = list(range(1, upload.parts + 1))
    if numbers != want:
        absent = sorted(set(want) - set(numbers))
        twice = sorted({n for n in numbers if numbers.count(n) > 1})
        extra = sorted(set(numbers) - set(want))
        return (
            f"{upload.path}: cannot complete its upload: parts absent {absent[:10]}, sent twice {twice[:10]}, "
            f"not of this file {extra[:10]}"
        )
    if sum(p.size for p in parts) != upload.size:
        return f"{upload.path}: its parts hold {sum(p.size for p in parts)} bytes, the file {upload.size}"
    if len({p.source for p in parts}) > 1:
        return (
            f"{upload.path} was replaced or rewritten between two of its ranges (same size and mtime, another "
            "file or a changed ctime); not completing a mixed copy. The next pass sends it again"
        )
    return None


def split_blocks(size: int, parts: Sequence[SentPart]) -> tuple[int, ...]:
    """The file's block CRCs joined from its parts' pieces, in part order; () where the file gets none
    or a part brought none (sent by a version before blocks: the completion still stands, without blocks)."""
    ordered = sorted(parts, key=lambda p: p.number)
    if not wants_blocks(size) or any(sum(n for _, n in p.blocks) != p.size for p in ordered):
        return ()
    return join_pieces(piece for p in ordered for piece in p.blocks)


def whole_crc32c(parts: Sequence[SentPart]) -> int:
    crc = 0
    for p in sorted(parts, key=lambda p: p.number):
        crc = crc32c_combine(crc, p.crc32c, p.size)
    return crc


def finish(req: UploadRequest, upload: SplitUpload, parts: Sequence[SentPart]) -> UploadResult:
    problem = missing(upload, parts)
    if problem:
        abort(req, upload.upload_id)
        raise StoreError(problem)
    ordered = sorted(parts, key=lambda p: p.number)
    whole = to_b64(whole_crc32c(ordered))
    checksums = req.caps.checksums_validated
    entries: Any = [
        {"PartNumber": p.number, "ETag": p.etag, **({"ChecksumCRC32C": to_b64(p.crc32c)} if checksums else {})}
        for p in ordered
    ]
    try:
        composite = complete(req, upload.upload_id, entries, whole)
    except TransientStoreError:
        # left open: the store's retry of this call completes it (aborting would throw away every part
        # sent); the flow aborts it once the retries are spent
        raise
    except BaseException:
        abort(req, upload.upload_id)
        raise
    if req.tags:
        retag(req)
    etag = verify(req, size=upload.size, parts=upload.parts, crc=whole, composite=composite)
    blocks = split_blocks(upload.size, ordered)
    return UploadResult(req.key, upload.size, whole, None, etag, upload.parts, checksums, blocks=blocks)
