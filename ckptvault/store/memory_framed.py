"""Shuffle-zstd objects (docs/FORMAT.md, "Compressed files") in a MemoryStore, with the contracts of
store/framed.py: the file read once as 4 MiB frames (ckptvault.codec encodes each and decodes it
back before it may leave), whole frames packed into multipart parts of at least the part size
(the last may be smaller), each part's CRC32C and the FULL_OBJECT one of the stored bytes; the
result's size, crc32c and sha256 are the original file's. Download decodes frame by frame, checks
each frame's CRC32C of the original bytes and then the whole file's, and names a bad frame.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ckptvault import codec
from ckptvault.checksum import StreamHasher, crc32c_combine, crc32c_update, from_b64, to_b64
from ckptvault.store.errors import ChecksumMismatchError, StoreError
from ckptvault.store.port import ProgressFn, UploadResult

if TYPE_CHECKING:
    from ckptvault.store.memory_bucket import MemoryBucket


def upload_framed(
    store: MemoryBucket,
    path: Path,
    key: str,
    *,
    typesize: int,
    tags: Mapping[str, str] | None,
    sha256: bool,
    progress: ProgressFn | None,
) -> UploadResult:
    if typesize not in (1, 2, 4, 8):
        raise StoreError(f"{path}: typesize {typesize} is not one of 1, 2, 4, 8")
    before = os.stat(path)
    enc, frames = codec.encode_file(path, typesize, sha256=sha256)
    stored = StreamHasher()
    upload_id = store.uploads.create(key, tags=tags, retention=store.retention)
    parts: list[tuple[int, str]] = []
    try:
        pending, covered = bytearray(), 0

        def send() -> None:
            nonlocal pending, covered
            data = bytes(pending)
            crc = to_b64(stored.update(data))
            parts.append((len(parts) + 1, store.uploads.upload_part(key, upload_id, len(parts) + 1, data, crc)))
            if progress:
                progress(covered)  # original bytes, as the caller's total counts them
            pending, covered = bytearray(), 0

        for frame in frames:
            pending += frame
            covered += enc.frames[-1].size
            if len(pending) >= store.transfer.part_size:
                send()
        if pending or not parts:
            send()
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise StoreError(f"{path} changed while it was being uploaded; not uploading a torn copy. Retry later")
        info = store.uploads.complete(key, upload_id, parts, crc32c=stored.crc32c_b64)
    except BaseException:
        with contextlib.suppress(StoreError):  # already completed or aborted: nothing left to clean
            store.uploads.abort(key, upload_id)
        raise
    return UploadResult(
        key,
        before.st_size,
        enc.hasher.crc32c_b64,
        enc.hasher.sha256_hex,
        info.etag,
        len(parts),
        True,
        codec=codec.SHUFFLE_ZSTD,
        typesize=typesize,
        stored_size=info.size,
        stored_crc32c=stored.crc32c_b64,
        frames=tuple((f.offset, f.length, f.size, f.crc32c) for f in enc.frames),
    )


def download_framed(
    store: MemoryBucket,
    key: str,
    dest: Path,
    *,
    size: int,
    crc32c: str,
    frames: Sequence[tuple[int, int, int, str]],
    progress: ProgressFn | None,
) -> None:
    where = f"memory://{store.bucket}/{key}"
    index = [codec.Frame(*f) for f in frames]
    stored_size = index[-1].offset + index[-1].length if index else 0
    if problems := codec.check_index(index, size, stored_size):
        raise ChecksumMismatchError(f"downloading {where}: the manifest's frame index is not sound: {problems[0]}")
    try:
        expected = from_b64(crc32c)
    except ValueError as e:
        raise StoreError(f"downloading {where}: the expected CRC32C is not valid: {e}") from None
    try:
        with dest.open("wb") as out:
            crc, start = 0, 0
            for i, fr in enumerate(index):
                piece, total, _ = store.get_range(key, fr.offset, fr.offset + fr.length)
                if total != stored_size:
                    raise ChecksumMismatchError(
                        f"downloading {where}: the object has {total} bytes, the manifest {stored_size}"
                    )
                try:
                    data = codec.decode_checked(piece, fr)
                except codec.CodecError as e:
                    raise ChecksumMismatchError(
                        f"downloading {where}: frame {i} (original bytes {start}-{start + fr.size - 1}): {e}. "
                        "The stored object is not what was uploaded"
                    ) from None
                out.write(data)
                crc = crc32c_combine(crc, crc32c_update(data), len(data))
                start += fr.size
                if progress:
                    progress(fr.size)
            if crc != expected:
                raise ChecksumMismatchError(
                    f"downloading {where}: CRC32C of the decoded file {to_b64(crc)}, the manifest says {crc32c}. "
                    "The frame index does not describe this file"
                )
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
