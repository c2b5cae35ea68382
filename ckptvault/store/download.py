"""Parallel ranged download with an end-to-end CRC32C check.

The object is fetched as part-sized ranges by a thread pool; each worker streams its range in 4 MiB
chunks straight to its offset in `dest` (os.pwrite), hashing as it goes, so memory is bounded by
concurrency * chunk regardless of object size. The per-range CRCs are combined in order
(ckptvault.checksum.crc32c_combine) into the whole-object CRC32C, compared with the expected value
from the manifest. Each range also checks the total size in Content-Range and its ETag, so an object
that is replaced while we read it is caught even if its new bytes happen to hash right.

Ranges of every file a process downloads share one budget of connections (`connections`, a
process-wide semaphore): four files restored at once get a quarter each, and the one big file left
at the end (optimizer states are often most of a checkpoint) gets them all, instead of idling at
its own per-file share while the others have finished.

Writes bypass the page cache (O_DIRECT) where the destination's filesystem allows it: the body is
read from the socket into a reused page-aligned buffer, hashed there and written from there to the
disk, with no copy into the page cache and no writeback for the kernel to do later. In one
interleaved A/B on the 2-core bench machine (4 GiB, 3 reps) that took the client's CPU from 2.6 to
0.8 s/GB and, the server sharing the same two cores, the library's restore from 350 to 670 MB/s on
SeaweedFS and from 310 to 500 MB/s on Ceph (bench/README.md). A restore is written once and read later by
another job, so caching it would only push out pages somebody is using. The unaligned tail of a
file, and every write on a filesystem that refuses O_DIRECT (tmpfs, some FUSE mounts), go through
the page cache as before; `[store] direct_io = false` turns direct writes off. Buffered ranges are
handed to the kernel for writeback as soon as they are written (sync_file_range where Linux has it),
so the fsync before the rename into place finds little left to flush.

On ext4 and XFS each file's blocks are reserved before its first GET (ckptvault/store/preallocate.py): on ext4
a direct write into a hole holds the inode lock until its I/O completes, so one big file's ranges would
reach the disk one write at a time; into reserved blocks they are overwrites, under a shared lock.

`download_range` fetches one span of an object the same way into a file the caller made, without
truncating it: a restore splits a big file into such spans, one task each on several Dask workers
(ckptvault/restore/ranged.py), and combines their CRCs itself; a span alone has nothing to compare.

A range whose body read fails half-way (connection reset, read timeout) is fetched again from its
start, twice at most: botocore retries requests, not the streaming of a response body.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import http.client
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ckptvault.checksum import crc32c_combine, crc32c_update, from_b64, to_b64
from ckptvault.clock import timing
from ckptvault.errors import InvalidArgumentError
from ckptvault.store import preallocate
from ckptvault.store.botocore_errors import error_code, is_transient, translate
from ckptvault.store.errors import ChecksumMismatchError, StoreError, TransientStoreError
from ckptvault.store.port import FetchedRange, ProgressFn

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CHUNK = 4 * 1024 * 1024  # 1 MiB measured ~30% slower on localhost; memory is concurrency * CHUNK
BODY_ATTEMPTS = 3
# O_DIRECT wants the buffer address, the file offset and the length aligned to the device's logical
# block (512 B or 4 KiB); 4 KiB satisfies both. Ranges start at multiples of the part size (whole MiB).
DIRECT_ALIGN = 4096
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)  # Linux; elsewhere every write is buffered


@dataclass(frozen=True)
class DownloadRequest:
    client: S3Client
    bucket: str
    key: str
    dest: Path
    size: int
    crc32c: str
    part_size: int
    connections: int  # range GETs in flight for the whole process, across every file
    progress: ProgressFn | None
    endpoint: str | None
    direct_io: bool = True  # write around the page cache where the filesystem allows it
    version_id: str | None = None  # a point-in-time read: that version, not the current one

    def version_args(self) -> dict[str, Any]:
        return {"VersionId": self.version_id} if self.version_id else {}


@dataclass
class Written:
    """How the bytes of one downloaded file reached the disk (a range fetched again counts again)."""

    direct: int = 0  # written with O_DIRECT
    buffered: int = 0  # through the page cache: the unaligned tail, or every byte without O_DIRECT


_gates: dict[int, threading.BoundedSemaphore] = {}
_gates_lock = threading.Lock()


def _gate(connections: int) -> threading.BoundedSemaphore:
    with _gates_lock:
        gate = _gates.get(connections)
        if gate is None:
            gate = _gates[connections] = threading.BoundedSemaphore(connections)
        return gate


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None  # not Linux: the final fsync does all the flushing
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    sync: Callable[[int, int, int, int], int] = fn
    return sync


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range; do not wait


def _start_writeback(fd: int, start: int, length: int) -> None:
    if _sync_file_range is not None and length:
        _sync_file_range(fd, start, length, _SYNC_FILE_RANGE_WRITE)  # advisory: a failure costs only time


@dataclass(frozen=True)
class _Range:
    start: int
    end: int  # exclusive


class _Target:
    """The file being written: a buffered descriptor, and an O_DIRECT one when the filesystem has it.
    A direct write the filesystem refuses (EINVAL: it wants a bigger alignment than ours) turns direct
    writes off for the rest of the file instead of failing the restore. Both descriptors stay open
    until close(), after every worker is done: closing one under a worker could let its number be
    reused by another open file, and the worker's pwrite would land there."""

    def __init__(self, path: Path, size: int, direct_io: bool, *, create: bool = True) -> None:
        # create=False: one range of a file other tasks write too, made at its full size by the caller;
        # truncating it would zero their bytes, and creating it would refill a discarded staging area
        flags = os.O_CREAT | os.O_TRUNC if create else 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | flags, 0o644)
        self.dfd = -1
        self.direct = False
        self.written = Written()
        self._lock = threading.Lock()
        try:
            if create:
                os.ftruncate(self.fd, size)  # sized up front so every worker can pwrite at its offset
                preallocate.reserve(self.fd, size, path)  # direct writes as overwrites: see the module
            if direct_io and _O_DIRECT and size >= DIRECT_ALIGN:
                try:
                    self.dfd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | _O_DIRECT)
                    self.direct = True
                except OSError as e:
                    if e.errno != errno.EINVAL:  # EINVAL: this filesystem has no O_DIRECT
                        raise
        except BaseException:
            os.close(self.fd)
            if create:  # made (or emptied) above and never written: not left to look like a restored file
                Path(path).unlink(missing_ok=True)
            raise

    def write(self, view: memoryview, off: int) -> int:
        """Write all of `view` at `off`: the block-aligned part directly, the rest through the cache;
        return the bytes that went through the cache. `view` must lie in a page-aligned buffer (the
        direct path DMAs from it)."""
        n = len(view)
        aligned = n - n % DIRECT_ALIGN if self.direct and off % DIRECT_ALIGN == 0 else 0
        pos = 0
        if aligned:
            try:
                while pos < aligned:
                    pos += os.pwrite(self.dfd, view[pos:aligned], off + pos)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.direct = False  # the rest of this write, and every later one, goes buffered
        direct = pos
        while pos < n:
            pos += os.pwrite(self.fd, view[pos:], off + pos)
        with self._lock:
            self.written.direct += direct
            self.written.buffered += n - direct
        return n - direct

    def close(self) -> None:
        if self.dfd >= 0:
            os.close(self.dfd)
        os.close(self.fd)


class _Buffers:
    """Page-aligned chunk buffers (anonymous mmaps) for one file's ranges, reused from range to range:
    at most one per range in flight, released with the file."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._all: list[mmap.mmap] = []
        self._lock = threading.Lock()

    @contextmanager
    def chunk(self) -> Iterator[memoryview]:
        with self._lock:
            buf = self._free.pop() if self._free else None
            if buf is None:
                buf = mmap.mmap(-1, CHUNK)
                self._all.append(buf)
        try:
            with memoryview(buf) as view:
                yield view
        finally:
            with self._lock:
                self._free.append(buf)

    def close(self) -> None:
        for buf in self._all:
            # A failed range's traceback can still hold a slice of its buffer; that one is unmapped
            # when the traceback goes, the others now.
            with suppress(BufferError):
                buf.close()
        self._all.clear()
        self._free.clear()


def download_file(req: DownloadRequest) -> Written:
    where = f"s3://{req.bucket}/{req.key}"
    try:
        expected = from_b64(req.crc32c)
    except ValueError as e:
        raise StoreError(f"downloading {where}: the expected CRC32C is not valid: {e}") from None
    target = _Target(req.dest, req.size, req.direct_io)
    try:
        got, _ = _fetch_span(req, target, 0, req.size)
        if got != expected:
            raise ChecksumMismatchError(
                f"downloading {where}: CRC32C mismatch: expected {req.crc32c}, got {to_b64(got)}. "
                "The stored object is not what was uploaded"
            )
        # The caller renames the restored tree into place: make the bytes durable first. Direct writes
        # skipped the cache, but the device's own write cache and the file's metadata need this too.
        os.fsync(target.fd)
    except BaseException:
        target.close()
        req.dest.unlink(missing_ok=True)  # never leave a partial or corrupt file that looks whole
        raise
    target.close()
    return target.written


def download_range(req: DownloadRequest, offset: int, length: int) -> FetchedRange:
    """Bytes [offset, offset + length) into the existing `req.dest` at `offset` (the port's
    download_range); `req.crc32c` is not read: a range has no expected CRC, its caller combines them."""
    where = f"s3://{req.bucket}/{req.key}"
    if length <= 0 or offset < 0 or offset + length > req.size:
        raise InvalidArgumentError(
            f"downloading {where}: range {offset}+{length} is not a non-empty range of its {req.size} bytes"
        )
    target = _Target(req.dest, length, req.direct_io, create=False)
    try:
        crc, etag = _fetch_span(req, target, offset, offset + length)
        # Other hosts may write other ranges of this file (a shared file system): this host's bytes
        # must have reached the server before the caller, elsewhere, counts the file as verified.
        os.fsync(target.fd)
    finally:
        target.close()
    return FetchedRange(req.key, offset, length, to_b64(crc), etag)


def _fetch_span(req: DownloadRequest, target: _Target, start: int, end: int) -> tuple[int, str]:
    """CRC32C of bytes [start, end) fetched into `target` as part-sized ranges, and the one ETag seen."""
    buffers = _Buffers()
    try:
        if end == start:  # an empty object: one plain GET, for the size and ETag checks
            return _fetch(req, target, buffers, _Range(0, 0))
        ps = req.part_size
        ranges = [_Range(s, min(end, s + ps)) for s in range(start, end, ps)]
        workers = max(1, min(req.connections, len(ranges)))  # threads; the shared gate caps the GETs
        with ThreadPoolExecutor(workers, thread_name_prefix="ckptvault-download") as pool:
            futures: list[Future[tuple[int, str]]] = [pool.submit(_fetch, req, target, buffers, r) for r in ranges]
            _, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for p in pending:
                p.cancel()
            results = [f.result() for f in futures]  # raises the first failure
    finally:
        buffers.close()
    etags = {etag for _, etag in results}
    if len(etags) > 1:
        raise TransientStoreError(
            f"downloading s3://{req.bucket}/{req.key}: the object was replaced while it was being read; retry"
        )
    crc = 0
    for r, (piece, _) in zip(ranges, results, strict=True):
        crc = crc32c_combine(crc, piece, r.end - r.start)
    return crc, etags.pop()


def _fetch(req: DownloadRequest, target: _Target, buffers: _Buffers, r: _Range) -> tuple[int, str]:
    with _gate(req.connections), buffers.chunk() as buf:
        return _fetch_with_retries(req, target, buf, r)


def _fetch_with_retries(req: DownloadRequest, target: _Target, buf: memoryview, r: _Range) -> tuple[int, str]:
    for attempt in range(BODY_ATTEMPTS):
        try:
            return _fetch_once(req, target, buf, r)
        except Exception as e:
            last = attempt == BODY_ATTEMPTS - 1
            if last or not (isinstance(e, TransientStoreError) or is_transient(e)):
                raise _translate(req, e) from e
    raise AssertionError("unreachable")


def _translate(req: DownloadRequest, e: Exception) -> StoreError:
    if isinstance(e, ClientError) and error_code(e) == "InvalidRange":
        return ChecksumMismatchError(
            f"downloading s3://{req.bucket}/{req.key}: the object is smaller than the expected {req.size} bytes"
        )
    return translate(e, op="downloading", bucket=req.bucket, key=req.key, endpoint=req.endpoint)


def _fetch_once(req: DownloadRequest, target: _Target, buf: memoryview, r: _Range) -> tuple[int, str]:
    args: dict[str, Any] = {"Range": f"bytes={r.start}-{r.end - 1}"} if r.end > r.start else {}
    resp = req.client.get_object(Bucket=req.bucket, Key=req.key, **args, **req.version_args())
    total = _total_size(resp)
    if total != req.size:
        raise ChecksumMismatchError(
            f"downloading s3://{req.bucket}/{req.key}: the object has {total} bytes, expected {req.size}"
        )
    body = resp["Body"]
    read_into, finish = _body_reader(body)
    crc = 0
    off = r.start
    buffered = 0
    try:
        while off < r.end:
            # Fill the whole chunk before writing it: a direct write wants whole blocks, and the
            # socket hands over whatever has arrived.
            want = min(len(buf), r.end - off)
            got = 0
            while got < want and (n := read_into(buf[got:want])):
                got += n
            if not got:
                break
            if off == r.start:  # `--profile`'s first_byte: a GET body's first chunk read (ckptvault/clock/timing.py)
                timing.mark(timing.FIRST_BYTE)
            view = buf[:got]
            crc = crc32c_update(view, crc)
            buffered += target.write(view, off)
            off += got
            if got < want:
                break
        if off == r.end:
            finish()
    finally:
        body.close()
    if off != r.end:
        raise TransientStoreError(
            f"downloading s3://{req.bucket}/{req.key}: range {r.start}-{r.end - 1} ended early at byte {off}"
        )
    if buffered:  # direct writes left nothing for the kernel to write back
        _start_writeback(target.fd, r.start, r.end - r.start)
    if req.progress and r.end > r.start:
        req.progress(r.end - r.start)
    return crc, str(resp.get("ETag", ""))


def _body_reader(body: Any) -> tuple[Callable[[memoryview], int], Callable[[], None]]:
    """(read_into, finish) for a GetObject body. The fast way reads the socket straight into our
    buffer through the http.client response under botocore's StreamingBody and urllib3's response
    (readinto: no bytes object per chunk), then hands the connection back to urllib3's pool, which it
    would otherwise close. Both layers are private API, so anything unexpected (another urllib3,
    a checksum-validating wrapper) takes the public read() and one copy instead."""
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    release = getattr(raw, "release_conn", None)
    if isinstance(fp, http.client.HTTPResponse) and callable(release):

        def finish() -> None:
            if fp.isclosed():  # every byte of the body read: the connection is clean to reuse
                release()

        return fp.readinto, finish

    def read_copy(view: memoryview) -> int:
        data = body.read(len(view))
        view[: len(data)] = data
        return len(data)

    return read_copy, lambda: None


def _total_size(resp: Any) -> int:
    content_range = resp.get("ContentRange")
    if content_range and "/" in content_range:
        tail = content_range.rpartition("/")[2]
        if tail.isdigit():
            return int(tail)
    return int(resp.get("ContentLength", 0))
