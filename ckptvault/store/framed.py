"""Objects stored as shuffle-zstd frames (docs/FORMAT.md, "Compressed files"): upload and download.

Upload: the reading thread reads the file one frame (4 MiB of the original) at a time, hashes it in
file order (the manifest's CRC32C stays the original file's), and hands it to a pool of encoder
threads, one per core: c-blosc compresses with the GIL released, so the frames of one file compress
in parallel. Each encoder decodes its frame again and compares the CRC32C before the frame may leave
(ckptvault.codec). The reader takes the encoded frames back in file order and packs whole frames into
part buffers from the process-wide budget (store/buffers.py), so a part is always a run of whole
frames and memory stays the budget plus a few frames in the encoders. Parts carry the CRC32C of their
STORED bytes (what S3 checks); the whole-object checksum the server sees is the stored object's too.
Every compressed file goes up as a multipart upload (one part is allowed to be small), so a frame
never waits in memory for the file's end.

Download: runs of consecutive frames of about one part are fetched as ranged GETs in parallel under
the process-wide connection gate (store/download.py), each frame decoded as its bytes arrive, checked
against its CRC32C of the original bytes, and written at its original offset. The whole file's CRC32C
is the frames' combined, compared with the manifest's. A frame that fails names the key and the frame.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from ckptvault import codec
from ckptvault.checksum import StreamHasher, crc32c_combine, from_b64, to_b64
from ckptvault.store import download, multipart
from ckptvault.store.botocore_errors import is_transient
from ckptvault.store.buffers import shared
from ckptvault.store.errors import ChecksumMismatchError, StoreError, TransientStoreError
from ckptvault.store.limits import MIN_PART
from ckptvault.store.port import ProgressFn, UploadResult
from ckptvault.store.upload_request import UploadRequest, check_unchanged, part_size_for, verify


def _fixed_mmap_threshold() -> None:
    """Frames are 4 MiB bytes objects made and freed by many threads. glibc raises its mmap threshold
    after the first such free, so later ones come from per-thread heap arenas that keep the memory:
    +80-170 MiB of RSS measured in bench/compression.py. A fixed threshold (1 MiB) keeps every frame an
    mmap of its own, returned to the system when freed."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1024 * 1024)  # M_MMAP_THRESHOLD; setting it turns off the dynamic adjustment
    except (OSError, AttributeError):
        pass  # not glibc: its allocator has its own policy


_fixed_mmap_threshold()


def encoder_threads() -> int:
    """One encoder per core this process may run on (a Dask worker pinned to some cores gets those)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _encode(data: bytes, typesize: int, crc: int, index: int, path: object) -> bytes:
    stored = codec.encode_frame(data, typesize)
    try:
        codec.decode_checked(stored, codec.Frame(0, len(stored), len(data), to_b64(crc)))
    except codec.CodecError as e:
        raise codec.CodecError(f"{path}: frame {index} does not round-trip: {e}") from None
    return stored


def upload_framed(req: UploadRequest, typesize: int) -> UploadResult:
    """Upload `req.path` encoded with `typesize`; the result's size and crc32c are the original's."""
    if typesize not in (1, 2, 4, 8):
        raise StoreError(f"{req.path}: typesize {typesize} is not one of 1, 2, 4, 8")
    with req.path.open("rb", buffering=0) as f:
        before = os.fstat(f.fileno())
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return _upload(req, f, before, typesize)


def _upload(req: UploadRequest, f: Any, before: os.stat_result, typesize: int) -> UploadResult:
    size = before.st_size
    nframes = -(-size // codec.FRAME_SIZE)
    # A part is flushed once the next frame might not fit, so it holds at least `least` stored bytes:
    # sized for S3's 10,000 parts even if nothing compresses, and never under S3's 5 MiB minimum.
    least = max(MIN_PART, part_size_for(size + nframes * codec.MAX_OVERHEAD, req.transfer.part_size))
    worst_frame = codec.FRAME_SIZE + codec.MAX_OVERHEAD
    capacity = max(least + worst_frame, req.transfer.part_size)
    caps = req.caps
    upload_id = multipart.create_upload(req)
    original = StreamHasher(sha256=req.sha256)
    stored_hash = StreamHasher()
    frames: list[codec.Frame] = []
    limit = req.transfer.max_concurrency + 1
    st = multipart.Parts(limit, capacity, shared(req.transfer.budget))
    senders = ThreadPoolExecutor(req.transfer.max_concurrency, thread_name_prefix="ckptvault-upload")
    workers = encoder_threads()
    encoders = ThreadPoolExecutor(workers, thread_name_prefix="ckptvault-encode")
    sent: list[Future[None]] = []
    nparts = 0
    try:
        encoding: deque[tuple[Future[bytes], int, int]] = deque()  # (encoded, original length, crc)
        buf = None
        fill = covered = 0  # stored bytes in the part buffer, original bytes they decode to

        def flush() -> None:
            nonlocal buf, fill, covered, nparts
            assert buf is not None
            view = memoryview(buf)[:fill]
            nparts += 1
            part_crc = stored_hash.update(view)
            # progress counts original bytes, as the caller's total does, once the part is up
            part_req = dataclasses.replace(req, progress=_report(req, covered))
            sent.append(senders.submit(multipart.upload_part, part_req, st, upload_id, nparts, buf, view, part_crc))
            buf, fill, covered = None, 0, 0

        def place(fut: Future[bytes], n: int, crc: int) -> None:
            nonlocal buf, fill, covered
            stored = fut.result()
            if buf is None:
                buf = st.take()
                if st.failed.is_set():
                    st.give(buf)
                    buf = None
                    for s in sent:
                        s.result()  # raises the part failure that set the flag
                    raise StoreError(f"uploading {req.key}: a part failed")
            buf[fill : fill + len(stored)] = stored
            prev = frames[-1].offset + frames[-1].length if frames else 0
            frames.append(codec.Frame(prev, len(stored), n, to_b64(crc)))
            fill += len(stored)
            covered += n
            if fill + worst_frame > capacity:
                flush()

        for i in range(nframes):
            data = upload_read(f, min(codec.FRAME_SIZE, size - i * codec.FRAME_SIZE), req)
            crc = original.update(data)
            encoding.append((encoders.submit(_encode, data, typesize, crc, i, req.path), len(data), crc))
            if len(encoding) > workers:  # a few frames in the encoders, not the file
                place(*encoding.popleft())
        while encoding:
            place(*encoding.popleft())
        if buf is not None:
            flush()
        for s in sent:
            s.result()
        check_unchanged(f, before, req.path)
        stored_crc = stored_hash.crc32c_b64
        composite = multipart.complete(req, upload_id, [st.done[n] for n in range(1, nparts + 1)], stored_crc)
    except BaseException:
        st.failed.set()
        encoders.shutdown(wait=True, cancel_futures=True)
        senders.shutdown(wait=True, cancel_futures=True)
        multipart.abort(req, upload_id)
        raise
    finally:
        encoders.shutdown(wait=True)
        senders.shutdown(wait=True)
    if req.tags:
        multipart.retag(req)
    stored_size = stored_hash.size
    etag = verify(req, size=stored_size, parts=nparts, crc=stored_crc, composite=composite)
    return UploadResult(
        req.key,
        size,
        original.crc32c_b64,
        original.sha256_hex,
        etag,
        nparts,
        caps.checksums_validated,
        codec=codec.SHUFFLE_ZSTD,
        typesize=typesize,
        stored_size=stored_size,
        stored_crc32c=stored_crc,
        frames=tuple((fr.offset, fr.length, fr.size, fr.crc32c) for fr in frames),
    )


def _report(req: UploadRequest, original: int) -> ProgressFn | None:
    progress = req.progress
    if progress is None:
        return None
    return lambda _stored: progress(original)


def upload_read(f: Any, n: int, req: UploadRequest) -> bytes:
    data = codec._read_full(f, n)
    if len(data) != n:
        raise StoreError(f"{req.path} shrank while it was being uploaded; not uploading a torn copy. Retry later")
    return data


def _groups(frames: Sequence[codec.Frame], part_size: int) -> list[range]:
    """Runs of consecutive frames of about `part_size` stored bytes: one ranged GET each."""
    out: list[range] = []
    start, got = 0, 0
    for i, fr in enumerate(frames):
        got += fr.length
        if got >= part_size:
            out.append(range(start, i + 1))
            start, got = i + 1, 0
    if start < len(frames):
        out.append(range(start, len(frames)))
    return out


def download_framed(req: download.DownloadRequest, frames: Sequence[codec.Frame]) -> None:
    """Fetch, decode and check every frame into `req.dest` (removed on any failure)."""
    where = f"s3://{req.bucket}/{req.key}"
    try:
        expected = from_b64(req.crc32c)
    except ValueError as e:
        raise StoreError(f"downloading {where}: the expected CRC32C is not valid: {e}") from None
    stored_size = frames[-1].offset + frames[-1].length if frames else 0
    problems = codec.check_index(list(frames), req.size, stored_size)
    if problems:
        raise ChecksumMismatchError(f"downloading {where}: the manifest's frame index is not sound: {problems[0]}")
    starts = [0]
    for fr in frames[:-1]:
        starts.append(starts[-1] + fr.size)
    # Frames decode into reused page-aligned buffers of one frame (download.CHUNK), so every whole
    # frame goes to disk with O_DIRECT like an uncompressed range; only a file's short tail is buffered.
    assert download.CHUNK >= codec.FRAME_SIZE
    target = download._Target(req.dest, req.size, req.direct_io)
    buffers = download._Buffers()
    try:
        groups = _groups(frames, req.part_size)
        workers = max(1, min(req.connections, len(groups)))
        with ThreadPoolExecutor(workers, thread_name_prefix="ckptvault-download") as pool:
            futures = [pool.submit(_fetch_group, req, target, buffers, frames, starts, g, stored_size) for g in groups]
            _, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for p in pending:
                p.cancel()
            etags = {fut.result() for fut in futures}
        if len(etags) > 1:
            raise TransientStoreError(f"downloading {where}: the object was replaced while it was being read; retry")
        crc = 0
        for fr in frames:
            crc = crc32c_combine(crc, from_b64(fr.crc32c), fr.size)
        if crc != expected:
            raise ChecksumMismatchError(
                f"downloading {where}: CRC32C of the decoded file {to_b64(crc)}, the manifest says {req.crc32c}. "
                "The frame index does not describe this file"
            )
        os.fsync(target.fd)
    except BaseException:
        target.close()
        req.dest.unlink(missing_ok=True)
        raise
    finally:
        buffers.close()
    target.close()


def _fetch_group(
    req: download.DownloadRequest,
    target: download._Target,
    buffers: download._Buffers,
    frames: Sequence[codec.Frame],
    starts: Sequence[int],
    group: range,
    stored_size: int,
) -> str:
    with download._gate(req.connections), buffers.chunk() as out:
        for attempt in range(download.BODY_ATTEMPTS):
            try:
                return _fetch_group_once(req, target, out, frames, starts, group, stored_size)
            except Exception as e:
                last = attempt == download.BODY_ATTEMPTS - 1
                if last or not (isinstance(e, TransientStoreError) or is_transient(e)):
                    if isinstance(e, StoreError):
                        raise
                    raise download._translate(req, e) from e
    raise AssertionError("unreachable")


def _fetch_group_once(
    req: download.DownloadRequest,
    target: download._Target,
    out: memoryview,
    frames: Sequence[codec.Frame],
    starts: Sequence[int],
    group: range,
    stored_size: int,
) -> str:
    where = f"s3://{req.bucket}/{req.key}"
    first, last = frames[group[0]], frames[group[-1]]
    resp = req.client.get_object(
        Bucket=req.bucket,
        Key=req.key,
        Range=f"bytes={first.offset}-{last.offset + last.length - 1}",
        **req.version_args(),
    )
    total = download._total_size(resp)
    if total != stored_size:
        raise ChecksumMismatchError(f"downloading {where}: the object has {total} bytes, the manifest {stored_size}")
    body = resp["Body"]
    read_into, finish = download._body_reader(body)
    try:
        for i in group:
            fr = frames[i]
            raw = bytearray(fr.length)
            view = memoryview(raw)
            got = 0
            while got < fr.length and (n := read_into(view[got:])):
                got += n
            if got < fr.length:
                raise TransientStoreError(f"downloading {where}: frame {i} ended early at byte {got} of {fr.length}")
            try:
                data = codec.decode_into(raw, fr, out)
            except codec.CodecError as e:
                raise ChecksumMismatchError(
                    f"downloading {where}: frame {i} (original bytes {starts[i]}-{starts[i] + fr.size - 1}): {e}. "
                    "The stored object is not what was uploaded"
                ) from None
            target.write(data, starts[i])
        finish()
    finally:
        body.close()
    if req.progress:
        req.progress(sum(frames[i].size for i in group))
    return str(resp.get("ETag", ""))
