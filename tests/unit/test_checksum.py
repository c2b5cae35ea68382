"""The CRC32C helpers of ckptvault.checksum against the crc32c package (moved from the store
conformance suite: they need no server)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import crc32c
import pytest

from ckptvault.checksum import StreamHasher, crc32c_combine, file_crc32c, from_b64, to_b64
from tests.helpers import crc32c_b64

MIB = 1024 * 1024


def test_crc32c_combine_matches_direct_computation() -> None:
    rng = random.Random(1)
    for _ in range(300):
        a = rng.randbytes(rng.randint(0, 5000))
        b = rng.randbytes(rng.choice([0, 1, 7, rng.randint(0, 70000)]))
        assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)
    # many pieces, in order, as the parallel download combines them
    pieces = [rng.randbytes(rng.randint(1, 3000)) for _ in range(50)]
    crc = 0
    for piece in pieces:
        crc = crc32c_combine(crc, crc32c.crc32c(piece), len(piece))
    assert crc == crc32c.crc32c(b"".join(pieces))


def test_crc32c_encoding_and_stream_hasher(tmp_path: Path) -> None:
    assert to_b64(0) == "AAAAAA=="  # CRC32C of zero bytes
    assert from_b64(to_b64(0xDEADBEEF)) == 0xDEADBEEF
    with pytest.raises(ValueError):
        from_b64("AAAA")
    data = random.Random(2).randbytes(3 * MIB + 17)
    h = StreamHasher(sha256=True)
    view = memoryview(data)
    for off in range(0, len(data), MIB):
        h.update(view[off : off + MIB])
    assert h.crc == crc32c.crc32c(data)
    assert h.sha256_hex == hashlib.sha256(data).hexdigest()
    p = tmp_path / "f"
    p.write_bytes(data)
    assert file_crc32c(p) == crc32c_b64(p)
