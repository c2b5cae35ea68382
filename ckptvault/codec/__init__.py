"""Lossless, tensor-aware compression of one stored file: codec `shuffle-zstd` (docs/FORMAT.md).

A file is encoded as independently decodable frames, each covering FRAME_SIZE bytes of the original
(the last one the rest), each a c-blosc 1 chunk: byte shuffle by the element size, then zstd level 1.
Shuffling groups the sign/exponent bytes of every number together, which is what makes tensors
compress (bench/README.md: 1.46x on BF16, 1.19x on FP32, against 1.28x and 1.08x for zstd alone).
The library is numcodecs (its bundled c-blosc): no byte of the shuffle moves in Python, and the
compression runs with the GIL released, so frames compress in parallel threads.

Pure: no boto3 here (only ckptvault.store talks to S3). Streaming: `encode_file` reads one frame at a
time, so memory is a few frames whatever the file's size.
"""

from __future__ import annotations

import struct
import warnings
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from ckptvault.checksum import StreamHasher, crc32c_update, to_b64
from ckptvault.codec.hints import header_hint, header_typesize
from ckptvault.errors import CkptvaultError

if TYPE_CHECKING:
    from typing_extensions import Buffer

with warnings.catch_warnings():
    # numcodecs 0.16 warns at import that it finds the `crc32c` package (ours) instead of google-crc32c.
    warnings.simplefilter("ignore", DeprecationWarning)
    from numcodecs import blosc as _blosc

# Serial, per-call contexts (blosc_compress_ctx): with the global thread pool, concurrent callers
# would share c-blosc's one global state under a lock.
_blosc.use_threads = False

Codec = Literal["none", "shuffle-zstd"]
NONE: Final[Codec] = "none"
SHUFFLE_ZSTD: Final[Codec] = "shuffle-zstd"

FRAME_SIZE = 4 * 1024 * 1024  # original bytes per frame: a ranged GET of a few MiB, a small index
# c-blosc 1's block. Fixed, not automatic: its automatic block at level 1 is so small that zstd finds
# no more than it does unshuffled (1.08x on FP32 instead of 1.19x; bench/README.md).
BLOCK_SIZE = 1024 * 1024
LEVEL = 1
MAX_OVERHEAD = 16  # c-blosc's BLOSC_MAX_OVERHEAD: a frame is at most its original length + 16
MIN_RATIO = 1.05  # a file whose sample compresses less than this stays `none`: not worth the CPU
SAMPLE_FRAMES = 3  # frames of the file the trial compresses (start, middle, end of the data)
SAMPLE_BYTES = 1024 * 1024  # of each
TYPESIZES = (1, 2, 4)  # the trial's candidates when the file's header names no element size
__all__ = ["header_hint", "header_typesize"]  # re-exported: where the element size comes from



class CodecError(CkptvaultError, ValueError):
    """A frame that does not decode to what the manifest says it holds."""


@dataclass(frozen=True)
class Frame:
    """One frame of a stored object, as the manifest's `frames` lists it."""

    offset: int  # in the stored object
    length: int  # stored bytes
    size: int  # original bytes
    crc32c: str  # of the original bytes, base64 big-endian like the file's


@dataclass(frozen=True)
class Choice:
    codec: Codec
    typesize: int
    ratio: float  # the trial's (1.0 when nothing was tried)
    why: str


def encode_frame(data: Buffer, typesize: int) -> bytes:
    """One c-blosc 1 chunk of `data` (at most 2 GiB; frames are FRAME_SIZE)."""
    out: bytes = _blosc.compress(data, b"zstd", LEVEL, _blosc.SHUFFLE, BLOCK_SIZE, typesize)
    return out


def decode_frame(frame: Buffer, size: int | None = None) -> bytes:
    """The original bytes of one chunk; `size`, when given, is what the manifest says it holds."""
    view = memoryview(frame)
    if view.nbytes < MAX_OVERHEAD:
        raise CodecError(f"a frame of {view.nbytes} bytes is shorter than a Blosc header")
    header_size = struct.unpack_from("<I", view, 4)[0]
    if size is not None and header_size != size:
        raise CodecError(f"the frame says it holds {header_size} bytes, the manifest {size}")
    try:
        out: bytes = _blosc.decompress(view)
    except RuntimeError as e:
        raise CodecError(f"the frame does not decode ({e})") from None
    return out


def decode_checked(frame: Buffer, expected: Frame) -> bytes:
    """Decode one frame and check its length and its CRC32C of the original bytes."""
    data = decode_frame(frame, expected.size)
    got = to_b64(crc32c_update(data))
    if len(data) != expected.size or got != expected.crc32c:
        raise CodecError(f"CRC32C of the decoded bytes {got}, the manifest says {expected.crc32c}")
    return data


def decode_into(frame: Buffer, expected: Frame, out: memoryview) -> memoryview:
    """`decode_checked` into `out` (at least expected.size bytes): the slice holding the original bytes.
    Restore decodes into its reused page-aligned buffers, so decoded frames can go to disk with O_DIRECT."""
    view = memoryview(frame)
    if view.nbytes < MAX_OVERHEAD:
        raise CodecError(f"a frame of {view.nbytes} bytes is shorter than a Blosc header")
    header_size = struct.unpack_from("<I", view, 4)[0]
    if header_size != expected.size or len(out) < expected.size:
        raise CodecError(f"the frame says it holds {header_size} bytes, the manifest {expected.size}")
    dest = out[: expected.size]
    try:
        _blosc.decompress(view, dest)
    except RuntimeError as e:
        raise CodecError(f"the frame does not decode ({e})") from None
    got = to_b64(crc32c_update(dest))
    if got != expected.crc32c:
        raise CodecError(f"CRC32C of the decoded bytes {got}, the manifest says {expected.crc32c}")
    return dest


def _samples(path: Path, size: int) -> list[bytes]:
    """Up to SAMPLE_FRAMES slices of SAMPLE_BYTES: at the start, the middle and the end of the file,
    each starting on an 8-byte boundary so every candidate typesize sees whole elements."""
    n = min(SAMPLE_BYTES, size)
    starts = sorted({0, (size // 2 - n // 2) // 8 * 8, max(0, size - n) // 8 * 8})[:SAMPLE_FRAMES]
    out = []
    with path.open("rb") as f:
        for s in starts:
            f.seek(s)
            out.append(f.read(n))
    return out


def choose(path: Path, size: int, *, min_ratio: float = MIN_RATIO, use_header: bool = True) -> Choice:
    """Decide a file's codec from a few MiB of it (reads at most SAMPLE_FRAMES * SAMPLE_BYTES).
    `use_header` False: the sampled trial even where the header names the element size (the bench's
    comparison)."""
    if size == 0:
        return Choice(NONE, 1, 1.0, "empty")
    hint = header_hint(path) if use_header else None
    hinted = hint[0] if hint is not None else None
    candidates = (hinted,) if hinted is not None else TYPESIZES
    samples = _samples(path, size)
    raw = sum(len(s) for s in samples)
    best_ts, best = 1, 0.0
    for ts in candidates:
        stored = sum(len(encode_frame(s, ts)) for s in samples)
        ratio = raw / stored if stored else 1.0
        if ratio > best:
            best_ts, best = ts, ratio
    source = hint[1] if hint is not None else "sampled trial"
    if best < min_ratio:
        return Choice(NONE, best_ts, best, f"sampled ratio {best:.3f} < {min_ratio} (typesize {best_ts}, {source})")
    return Choice(SHUFFLE_ZSTD, best_ts, best, f"sampled ratio {best:.3f} with typesize {best_ts} ({source})")


@dataclass
class Encoded:
    """What `encode_file` produced, filled in as frames are yielded."""

    hasher: StreamHasher  # of the original bytes, in the same read pass
    frames: list[Frame]

    @property
    def stored_size(self) -> int:
        return self.frames[-1].offset + self.frames[-1].length if self.frames else 0


def encode_file(
    path: Path, typesize: int, *, frame_size: int = FRAME_SIZE, sha256: bool = False
) -> tuple[Encoded, Iterator[bytes]]:
    """Stream `path` as encoded frames. The iterator yields each frame's stored bytes in order; the
    returned `Encoded` gains each frame's index entry and the file's CRC32C (SHA-256) as it goes.
    Every frame is decoded again and compared before it is yielded: a library bug that returned wrong
    bytes (one such exists in another Blosc binding, bench/README.md) fails the upload instead of
    being found at the first restore, when the original is gone."""
    enc = Encoded(StreamHasher(sha256=sha256), [])

    def frames() -> Iterator[bytes]:
        offset = 0
        with path.open("rb", buffering=0) as f:
            while True:
                data = _read_full(f, frame_size)
                if not data:
                    return
                crc = enc.hasher.update(data)
                stored = encode_frame(data, typesize)
                frame = Frame(offset, len(stored), len(data), to_b64(crc))
                try:
                    decode_checked(stored, frame)
                except CodecError as e:
                    raise CodecError(f"{path}: frame {len(enc.frames)} does not round-trip: {e}") from None
                enc.frames.append(frame)
                offset += len(stored)
                yield stored
                if len(data) < frame_size:
                    return

    return enc, frames()


@dataclass(frozen=True)
class Reencoded:
    """What uploading a file with a typesize would store, computed without uploading it."""

    frames: tuple[Frame, ...]
    size: int  # original bytes read
    crc32c: str  # of the original bytes
    sha256: str | None
    stored_size: int
    stored_crc32c: str  # of the stored bytes: what a server's whole-object checksum of the object is


def reencode(
    path: Path, typesize: int, *, workers: int = 1, sha256: bool = False, limit: int | None = None
) -> Reencoded | None:
    """Encode `path` again, on `workers` threads, keeping only the index and the checksums: how a rerun
    recognises the complete compressed object a crashed ingest left (c-blosc's output is a function
    of the bytes and the parameters). None as soon as the stored bytes exceed `limit` (the object
    there is smaller, so it is not this file's encoding): no need to read the rest."""
    original, stored = StreamHasher(sha256=sha256), StreamHasher()
    frames: list[Frame] = []
    pending: deque[tuple[Future[bytes], int, int]] = deque()

    def take() -> bool:
        fut, n, crc = pending.popleft()
        data = fut.result()
        frames.append(Frame(stored.size, len(data), n, to_b64(crc)))
        stored.update(data)
        return limit is None or stored.size <= limit

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="ckptvault-reencode") as pool:
        try:
            with path.open("rb", buffering=0) as f:
                while data := _read_full(f, FRAME_SIZE):
                    pending.append((pool.submit(encode_frame, data, typesize), len(data), original.update(data)))
                    if len(pending) > workers and not take():
                        return None
            while pending:
                if not take():
                    return None
        finally:
            for fut, _, _ in pending:
                fut.cancel()
    return Reencoded(
        tuple(frames), original.size, original.crc32c_b64, original.sha256_hex, stored.size, stored.crc32c_b64
    )


def _read_full(f: Any, n: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < n:
        piece = f.read(n - got)
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def frame_layout(size: int, frame_size: int = FRAME_SIZE) -> list[tuple[int, int]]:
    """(original offset, original length) of each frame of a file of `size` bytes."""
    return [(s, min(frame_size, size - s)) for s in range(0, size, frame_size)]


def check_index(frames: list[Frame], size: int, stored_size: int, frame_size: int = FRAME_SIZE) -> list[str]:
    """Problems of a manifest's frame index against the file's size and the object's (empty if sound)."""
    problems = []
    layout = frame_layout(size, frame_size)
    if len(frames) != len(layout):
        problems.append(f"{len(frames)} frames for {size} bytes, {len(layout)} expected")
    offset = 0
    for i, fr in enumerate(frames):
        if fr.offset != offset:
            problems.append(f"frame {i} starts at {fr.offset}, the one before ends at {offset}")
        if i < len(layout) and fr.size != layout[i][1]:
            problems.append(f"frame {i} holds {fr.size} bytes, {layout[i][1]} expected")
        if not 0 < fr.length <= fr.size + MAX_OVERHEAD:
            problems.append(f"frame {i} is {fr.length} stored bytes for {fr.size} original")
        offset = fr.offset + fr.length
    if offset != stored_size:
        problems.append(f"the frames end at {offset}, stored_size is {stored_size}")
    return problems
