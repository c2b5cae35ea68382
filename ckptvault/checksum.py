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


class StreamHasher:
    """Running CRC32C (and optionally SHA-256) of bytes fed in file order, in the reading pass."""

    def __init__(self, sha256: bool = False) -> None:
        self.crc = 0
        self.size = 0
        self._sha = hashlib.sha256() if sha256 else None

    def update(self, data: Buffer) -> int:
        """Feed the next piece; returns the piece's own CRC32C (handy as a per-part checksum)."""
        piece = crc32c_update(data)
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
    buf = mmap.mmap(-1, chunk)
    view = memoryview(buf)
    crc = 0
    try:
        with Path(path).open("rb", buffering=0) as f:
            while n := f.readinto(view):
                crc = crc32c_update(view[:n], crc)
    finally:
        view.release()
        buf.close()
    return to_b64(crc)
