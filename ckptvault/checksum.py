"""CRC32C helpers: S3's base64 spelling, a same-pass hasher, and CRC combination.

CRC32C is the checksum of record (manifest, S3 object checksum, restore and drill checks). The
`crc32c` package hashes any buffer (memoryview of an mmap included) without copying, at ~15 GB/s a
core; `google-crc32c` copies to bytes first, so it is not used. No boto3 here: only ckptvault.store
talks to S3.

`crc32c_combine` lets parallel code hash pieces independently (one ranged GET or one upload part
each) and still get the whole-object CRC without a second pass over the bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import mmap
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import crc32c as _crc32c

from ckptvault.errors import InvalidArgumentError

if TYPE_CHECKING:
    from typing_extensions import Buffer

# Reflected CRC-32C (Castagnoli) polynomial.
_POLY = 0x82F63B78


def crc32c_update(data: Buffer, crc: int = 0) -> int:
    """CRC32C of `data` continuing from `crc` (0 to start). Accepts memoryviews without copying."""
    return int(_crc32c.crc32c(data, crc))


def to_b64(crc: int) -> str:
    """S3's spelling of a CRC32C: base64 of the 4 big-endian bytes (x-amz-checksum-crc32c)."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def from_b64(value: str) -> int:
    """Inverse of `to_b64`; ValueError if `value` is not the base64 of exactly 4 bytes."""
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error as e:
        raise InvalidArgumentError(f"{value!r} is not base64: {e}") from None
    if len(raw) != 4:
        raise InvalidArgumentError(f"{value!r} is not a CRC32C: it decodes to {len(raw)} bytes, not 4")
    return int.from_bytes(raw, "big")


def _times(mat: list[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _square(mat: list[int]) -> list[int]:
    return [_times(mat, mat[n]) for n in range(32)]


def _zero_operators() -> list[list[int]]:
    # ops[k] advances a CRC register over 2**k zero bytes (zlib's crc32_combine, GF(2) matrices).
    # Precomputed once so a combine costs a handful of matrix-vector products, not ~60 squarings.
    one_bit = [_POLY] + [1 << n for n in range(31)]
    m = _square(_square(_square(one_bit)))  # 8 zero bits = one zero byte
    ops = [m]
    for _ in range(63):
        m = _square(m)
        ops.append(m)
    return ops


_OPS: list[list[int]] | None = None


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of A+B given crc1 = CRC32C(A), crc2 = CRC32C(B) and len2 = len(B)."""
    global _OPS
    if len2 < 0:
        raise InvalidArgumentError(f"len2 must be >= 0, got {len2}")
    if len2 == 0:
        return crc1
    if _OPS is None:
        _OPS = _zero_operators()  # benign race: two threads may both build the same table
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _times(_OPS[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


# The block of docs/FORMAT.md "Block checksums": the compressed frames' size, so a ranged reader cuts a
# file the same way whatever its codec.
BLOCK_SIZE = 4 * 1024 * 1024
# Only files over this get block CRCs: a file of at most two blocks is read whole for the cost of a
# ranged read of it, and a checkpoint's many small files add nothing to the sidecar.
BLOCKS_MIN_SIZE = 2 * BLOCK_SIZE

# A CRC32C of a run of bytes that lies inside one block, and the run's length: what a reader of part of
# a file hands on when the block goes on in bytes another reader has (a split upload's next range).
Piece = tuple[int, int]


def wants_blocks(size: int) -> bool:
    """Whether a file of `size` bytes stored as it is gets block CRCs (docs/FORMAT.md)."""
    return size > BLOCKS_MIN_SIZE


class BlockCrcs:
    """The CRC32C of every BLOCK_SIZE block of a stream fed in order, from byte `start` of the file (a
    split upload's range starts where its first part does, not on a block). Each piece read is hashed
    once, cut at the file's block boundaries: a piece's own CRC is combined from its cuts, so the blocks
    cost no second pass over the bytes (a few `crc32c_combine` per part, each ~10 us)."""

    def __init__(self, start: int = 0, block_size: int = BLOCK_SIZE) -> None:
        self.block_size = block_size
        self.pos = start
        self._pieces: list[Piece] = []  # closed since the last `cut`
        self._crc = 0  # of the open block's bytes read so far
        self._len = 0

    def update(self, data: Buffer) -> int:
        """Feed the next bytes; returns their CRC32C (as crc32c_update(data) would)."""
        view = memoryview(data).cast("B")
        n = len(view)
        whole = 0
        i = 0
        while i < n:
            take = min(self.block_size - self.pos % self.block_size, n - i)
            c = crc32c_update(view[i : i + take])
            self._crc = crc32c_combine(self._crc, c, take) if self._len else c
            self._len += take
            whole = crc32c_combine(whole, c, take) if i else c
            i += take
            self.pos += take
            if self.pos % self.block_size == 0:
                self._pieces.append((self._crc, self._len))
                self._crc, self._len = 0, 0
        view.release()
        return whole

    def cut(self) -> tuple[Piece, ...]:
        """The pieces fed since the last cut, in order, the open block's bytes as the last one: each a
        whole block, or part of one whose other bytes come before or after (`join_pieces`)."""
        if self._len:
            self._pieces.append((self._crc, self._len))
            self._crc, self._len = 0, 0
        out = tuple(self._pieces)
        self._pieces.clear()
        return out


def join_pieces(pieces: Iterable[Piece], block_size: int = BLOCK_SIZE) -> tuple[int, ...]:
    """The block CRCs of a file from the pieces of its bytes in order from byte 0, each cut at block
    boundaries (BlockCrcs.cut of consecutive readers): pieces of one block combined, the last block short."""
    out: list[int] = []
    crc = length = 0
    for c, n in pieces:
        crc = crc32c_combine(crc, c, n) if length else c
        length += n
        if length == block_size:
            out.append(crc)
            crc = length = 0
        elif length > block_size:
            raise InvalidArgumentError(f"a piece of {n} bytes crosses a block boundary ({block_size} bytes)")
    if length:
        out.append(crc)
    return tuple(out)


def combine_blocks(crcs: Iterable[int], size: int, block_size: int = BLOCK_SIZE) -> int:
    """The whole file's CRC32C from its block CRCs (every block `block_size` bytes but the last)."""
    whole = 0
    left = size
    for c in crcs:
        n = min(block_size, left)
        whole = crc32c_combine(whole, c, n)
        left -= n
    return whole


class StreamHasher:
    """Running CRC32C (and optionally SHA-256) of bytes fed in file order, in the reading pass. With
    `blocks_at` (the stream's offset in the file) it also keeps the file's block CRCs (`blocks`)."""

    def __init__(self, sha256: bool = False, blocks_at: int | None = None) -> None:
        self.crc = 0
        self.size = 0
        self._sha = hashlib.sha256() if sha256 else None
        self.blocks = BlockCrcs(blocks_at) if blocks_at is not None else None

    def update(self, data: Buffer) -> int:
        """Feed the next piece; returns the piece's own CRC32C (handy as a per-part checksum)."""
        piece = crc32c_update(data) if self.blocks is None else self.blocks.update(data)
        n = memoryview(data).nbytes
        self.crc = crc32c_combine(self.crc, piece, n)
        self.size += n
        if self._sha is not None:
            self._sha.update(data)
        return piece

    @property
    def crc32c_b64(self) -> str:
        return to_b64(self.crc)

    @property
    def sha256_hex(self) -> str | None:
        return self._sha.hexdigest() if self._sha is not None else None


def file_crc32c(path: str | os.PathLike[str], chunk: int = 8 * 1024 * 1024) -> str:
    """Base64 CRC32C of a whole file, read once into a page-aligned buffer (mmap: ~5x faster to
    read into than a bytearray here)."""
    return file_crc32c_blocks(path, chunk, blocks=False)[0]


def file_crc32c_blocks(
    path: str | os.PathLike[str], chunk: int = 8 * 1024 * 1024, *, blocks: bool = True
) -> tuple[str, tuple[int, ...]]:
    """Base64 CRC32C of a whole file and, with `blocks` and a file over BLOCKS_MIN_SIZE, its block
    CRCs, from one read pass (empty where it gets none)."""
    buf = mmap.mmap(-1, chunk)
    view = memoryview(buf)
    crc = 0
    acc: BlockCrcs | None = None
    try:
        with Path(path).open("rb", buffering=0) as f:
            if blocks and wants_blocks(os.fstat(f.fileno()).st_size):
                acc = BlockCrcs()
            while n := f.readinto(view):
                piece = view[:n]
                crc = crc32c_update(piece, crc) if acc is None else crc32c_combine(crc, acc.update(piece), n)
                piece.release()
    finally:
        view.release()
        buf.close()
    return to_b64(crc), join_pieces(acc.cut()) if acc is not None else ()
