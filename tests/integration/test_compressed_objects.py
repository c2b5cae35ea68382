"""Objects stored as shuffle-zstd frames (ckptvault/store/framed.py, docs/FORMAT.md "Compressed
files"), through the real adapter against the real servers: multipart of whole frames, the object
decoded by numcodecs alone with ranged GETs as FORMAT.md shows, a corrupted frame named."""

from __future__ import annotations

import base64
import time
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


def test_frames_round_trip_on_moto(
    moto_server: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _round_trip(_store(moto_server, bucket_factory(moto_server), monkeypatch), tmp_path)


def _put_with_crc32c(client: Any, bucket: str, key: str, body: bytes) -> None:
    """A PUT behind ckptvault's back whose object the server keeps a CRC32C of (what any S3 tool
    sending x-amz-checksum-crc32c gets): the checksum is there, it is just not ours."""
    import crc32c

    crc = base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode()
    client.put_object(Bucket=bucket, Key=key, Body=body, ChecksumCRC32C=crc)


def _crashed_ingest(endpoint: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A deepspeed checkpoint (FP32 torch zips of 6 MiB: compressed, typesize 4) whose every object is
    up, with compression "auto", and no manifest: what an ingest killed just before its commit leaves."""
    from ckptvault.ingest import steps
    from ckptvault.ingest.discovery import discover
    from ckptvault_cli.synthetic import write_checkpoint

    root = tmp_path / "hot"
    write_checkpoint(root, "deepspeed", 7, 18 * MIB, seed=7)
    found = discover("r", root, "deepspeed", 0, time.time() + 10).found[0]
    store = _store(endpoint, bucket, monkeypatch)
    first = [steps.upload_one(store, j, found, compression="auto") for j in steps.plan_upload(store, "t", found)]
    assert {e.codec for e in first} == {"shuffle-zstd"} and not steps.is_committed(store, "t", found)
    return found, {e.path: e for e in first}


@pytest.mark.parametrize("kind", ["seaweedfs", pytest.param("ceph", marks=pytest.mark.ceph), "moto"])
def test_a_rerun_after_a_crash_keeps_the_complete_compressed_objects(
    kind: str, request: pytest.FixtureRequest, bucket_factory: Callable[[Any], str],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    """The rerun recognises each compressed object the crash left complete (the file encoded again has
    its size and stored CRC32C), uploads none of them, and commits their index; a deleted object and
    one replaced by other bytes of the same size are sent again. Counted in the requests the server got."""
    import dataclasses

    from ckptvault.checkpoint.manifest import checkpoint_prefix
    from ckptvault.ingest import steps
    from tests.faultproxy import FaultProxy

    endpoint = request.getfixturevalue({"seaweedfs": "seaweedfs", "ceph": "ceph", "moto": "moto_server"}[kind])
    bucket = bucket_factory(endpoint)
    found, first = _crashed_ingest(endpoint, bucket, tmp_path, monkeypatch)
    base = checkpoint_prefix("t", "r", 7)
    client = endpoint.client()
    names = sorted(first)
    gone, changed, kept = names[0], names[1], names[2:]
    assert kept, names
    client.delete_object(Bucket=bucket, Key=base + gone)
    body = bytearray(client.get_object(Bucket=bucket, Key=base + changed)["Body"].read())
    body[len(body) // 2] ^= 0x01  # same size, other bytes: not this file's encoding
    _put_with_crc32c(client, bucket, base + changed, bytes(body))

    with FaultProxy(endpoint.url) as proxy:
        store = _store(dataclasses.replace(endpoint, url=proxy.url), bucket, monkeypatch)
        store.capabilities()  # the server's probe (its own PUTs and a multipart upload) before counting
        proxy.requests.clear()
        jobs = steps.plan_upload(store, "t", found)
        entries = [steps.upload_one(store, j, found, compression="auto") for j in jobs]
        steps.commit_manifest(store, "t", found, entries)
        requests = dict(proxy.requests)
    print(f"\n[rerun {kind}] requests: {requests}")
    # one multipart upload each for the deleted and the changed file, nothing for the others
    assert requests.get("CreateMultipartUpload") == 2, requests
    assert requests.get("PutObject") == 1, requests  # the manifest
    again = {e.path: e for e in entries}
    for name in kept:
        assert again[name] == first[name], name  # the same index, stored size and checksums
    for e in entries:
        back = tmp_path / "back" / e.path
        back.parent.mkdir(parents=True, exist_ok=True)
        store.download_file(base + e.path, back, size=e.size, crc32c=e.crc32c, frames=e.frames)
        assert back.read_bytes() == (found.path / e.path).read_bytes(), e.path


@pytest.mark.parametrize("metadata", ["torch", "garbled"])
def test_a_dcp_save_uploads_compressed_with_or_without_a_readable_metadata(
    metadata: str, moto_server: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A real DCP save of BF16 weights: its `.distcp` is stored shuffle-zstd with typesize 2, from the
    `.metadata` or, when that is garbled, from the sampled trial; the upload succeeds either way and
    the checkpoint restores byte-identical."""
    import torch

    from ckptvault.checkpoint.manifest import checkpoint_prefix
    from ckptvault.ingest import steps
    from ckptvault.ingest.discovery import discover
    from tests.helpers import dcp_save, torch_weights

    root = tmp_path / "hot"
    (distcp,) = dcp_save(root / "step-7", {**torch_weights(torch.bfloat16, layers=8), "step": 7})
    meta = root / "step-7" / ".metadata"
    if metadata == "garbled":
        meta.write_bytes(meta.read_bytes()[:-40])  # torn: no STOP
    assert (codec.header_hint(distcp) is None) == (metadata == "garbled")
    found = discover("r", root, "dcp", 0, time.time() + 10).found[0]
    store = _store(moto_server, bucket_factory(moto_server), monkeypatch)
    entries = [steps.upload_one(store, j, found, compression="auto") for j in steps.plan_upload(store, "t", found)]
    manifest = steps.commit_manifest(store, "t", found, entries)
    by_path = {e.path: e for e in manifest.files}
    assert (by_path[distcp.name].codec, by_path[distcp.name].typesize) == ("shuffle-zstd", 2)
    stored = by_path[distcp.name].stored_size
    assert stored is not None and stored <= 0.75 * distcp.stat().st_size
    for e in manifest.files:
        back = tmp_path / "back" / e.path
        back.parent.mkdir(parents=True, exist_ok=True)
        key = checkpoint_prefix("t", "r", 7) + e.path
        store.download_file(key, back, size=e.size, crc32c=e.crc32c, frames=e.frames)
        assert back.read_bytes() == (found.path / e.path).read_bytes(), e.path


def test_eviction_refuses_a_wrong_compressed_object_of_the_right_size(
    seaweedfs: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The re-check before deleting the local copy compares the store's CRC32C of a compressed object
    with the manifest's `stored_crc32c`: one flipped byte, the size unchanged, keeps the local copy."""
    from ckptvault.checkpoint.manifest import checkpoint_prefix
    from ckptvault.ingest import steps
    from ckptvault.tiering.eviction import evict_local, recheck_eviction

    bucket = bucket_factory(seaweedfs)
    found, first = _crashed_ingest(seaweedfs, bucket, tmp_path, monkeypatch)
    store = _store(seaweedfs, bucket, monkeypatch)
    manifest = steps.commit_manifest(store, "t", found, list(first.values()))
    assert all(f.stored_crc32c for f in manifest.files)
    assert recheck_eviction(store, "t", manifest).ok  # as uploaded: may be evicted

    key = checkpoint_prefix("t", "r", 7) + manifest.files[0].path
    client = seaweedfs.client()
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 3] ^= 0x01
    _put_with_crc32c(client, bucket, key, bytes(body))
    out = evict_local(store, "t", manifest)
    assert not out.evicted and out.files == 0
    [mismatch] = out.check.store
    assert mismatch.path == key and mismatch.what.startswith("CRC32C ") and "in the manifest" in mismatch.what
    assert all((found.path / f.path).exists() for f in manifest.files)  # nothing deleted
