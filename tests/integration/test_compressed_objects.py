"""Objects stored as shuffle-zstd frames (ckptvault/store/framed.py, docs/FORMAT.md "Compressed
files"), through the real adapter against the real servers: multipart of whole frames, the object
decoded by numcodecs alone with ranged GETs as FORMAT.md shows, a corrupted frame named."""

from __future__ import annotations

import base64
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptvault import codec
from ckptvault.checksum import file_crc32c
from ckptvault.config import StoreConfig
from ckptvault.store import ChecksumMismatchError, S3Store

MIB = 1024 * 1024


def _store(endpoint: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)
    cfg = StoreConfig(
        bucket=bucket, endpoint_url=endpoint.url, region=endpoint.region, part_size_mb=5, max_concurrency=2
    )
    return S3Store(cfg)


def bf16_file(path: Path, nbytes: int, seed: int = 0) -> Path:
    """Normally distributed BF16 values (the top halves of float32s), as a model's weights are."""
    f32 = np.random.default_rng(seed).standard_normal(nbytes // 2, dtype=np.float32) * 0.02
    path.write_bytes((f32.view(np.uint32) >> 16).astype(np.uint16).tobytes() + b"\x01" * (nbytes % 2))
    return path


def decode_from_bucket(client: Any, bucket: str, key: str, entry: dict[str, Any], out_path: Path) -> None:
    """docs/FORMAT.md's decoder, line for line: boto3, numcodecs, crc32c and base64; no ckptvault."""
    import crc32c

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import numcodecs.blosc

    with open(out_path, "wb") as out:
        for offset, length, original, crc in entry["frames"]:
            rng = f"bytes={offset}-{offset + length - 1}"
            frame = client.get_object(Bucket=bucket, Key=key, Range=rng)["Body"].read()
            data = numcodecs.blosc.decompress(frame)
            assert len(data) == original
            assert base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode() == crc
            out.write(data)


def _round_trip(store: S3Store, tmp_path: Path) -> None:
    src = bf16_file(tmp_path / "w.bin", 26 * MIB + 3)  # 7 frames, the last short and odd
    sent: list[int] = []
    res = store.upload_file(src, "c/w.bin", typesize=2, progress=sent.append)
    assert sum(sent) == res.size  # progress in original bytes, as the caller's total counts them
    assert (res.codec, res.typesize, res.size, res.crc32c) == ("shuffle-zstd", 2, src.stat().st_size, file_crc32c(src))
    assert res.stored_size is not None and res.stored_size <= 0.75 * res.size
    assert len(res.frames) == 7 and res.parts >= 2  # parts of 5 MiB and more: several, each whole frames
    head = store.head("c/w.bin")
    assert head is not None and head.size == res.stored_size and head.parts == res.parts
    frames = [codec.Frame(*f) for f in res.frames]
    assert codec.check_index(frames, res.size, res.stored_size) == []
    back = tmp_path / "back.bin"
    got: list[int] = []
    store.download_file("c/w.bin", back, size=res.size, crc32c=res.crc32c, frames=res.frames, progress=got.append)
    assert back.read_bytes() == src.read_bytes()
    assert sum(got) == res.size


def test_frames_round_trip_on_seaweedfs(
    seaweedfs: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _round_trip(_store(seaweedfs, bucket_factory(seaweedfs), monkeypatch), tmp_path)


def test_frames_round_trip_on_ceph(
    ceph: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _round_trip(_store(ceph, bucket_factory(ceph), monkeypatch), tmp_path)


def test_the_object_decodes_with_numcodecs_alone_and_a_bad_frame_is_named(
    seaweedfs: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = _store(seaweedfs, bucket_factory(seaweedfs), monkeypatch)
    src = bf16_file(tmp_path / "w.bin", 13 * MIB, seed=1)
    res = store.upload_file(src, "c/w.bin", typesize=2)
    entry = {"frames": [list(f) for f in res.frames]}
    plain = tmp_path / "plain.bin"
    decode_from_bucket(store.client, store.bucket, "c/w.bin", entry, plain)
    assert plain.read_bytes() == src.read_bytes()

    # One byte of frame 2's compressed data changed behind ckptvault's back (same length).
    obj = bytearray(store.client.get_object(Bucket=store.bucket, Key="c/w.bin")["Body"].read())
    offset, length, _, _ = res.frames[2]
    obj[offset + length // 2] ^= 0x40
    store.client.put_object(Bucket=store.bucket, Key="c/w.bin", Body=bytes(obj))
    back = tmp_path / "back.bin"
    with pytest.raises(ChecksumMismatchError, match=r"c/w\.bin: frame 2 \(original bytes 8388608-12582911\)"):
        store.download_file("c/w.bin", back, size=res.size, crc32c=res.crc32c, frames=res.frames)
    assert not back.exists()
