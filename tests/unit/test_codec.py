"""ckptvault/codec/: the `shuffle-zstd` frames of docs/FORMAT.md, their index, and the choice of codec."""

from __future__ import annotations

import base64
import json
import os
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptvault import codec
from ckptvault.checkpoint.manifest import FileEntry, Manifest, ManifestError
from ckptvault.checksum import file_crc32c
from ckptvault_cli import synthetic


def _normals(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n, dtype=np.float32) * 0.02).astype(np.float32)


def _bf16(f32: np.ndarray) -> np.ndarray:
    return (f32.view(np.uint32) >> 16).astype(np.uint16)


def _safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.uint16): "BF16", np.dtype(np.uint8): "U8"}
    header: dict[str, object] = {}
    off = 0
    for name, a in tensors.items():
        header[name] = {"dtype": dtypes[a.dtype], "shape": [a.size], "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for a in tensors.values():
            f.write(a.tobytes())


def _encode(path: Path, typesize: int, frame_size: int = codec.FRAME_SIZE) -> tuple[codec.Encoded, bytes]:
    enc, frames = codec.encode_file(path, typesize, frame_size=frame_size)
    return enc, b"".join(frames)


def _decode_with_the_library_alone(obj: bytes, entry: dict[str, object], library: str) -> bytes:
    """docs/FORMAT.md's decoder: a Blosc library, the crc32c package and base64; no ckptvault."""
    import crc32c

    if library == "blosc2":
        import blosc2  # the dev extra installs it: a missing one fails here, never skips
        decompress = blosc2.decompress
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import numcodecs.blosc

        decompress = numcodecs.blosc.decompress
    out = bytearray()
    frames = entry["frames"]
    assert isinstance(frames, list)
    for offset, length, original, crc in frames:
        frame = obj[offset : offset + length]  # what a ranged GET of the frame returns
        data = bytes(decompress(frame))
        assert len(data) == original
        assert base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode() == crc
        out += data
    return bytes(out)


@pytest.mark.parametrize("library", ["numcodecs", "blosc2"])
def test_an_object_decodes_with_the_library_alone(tmp_path: Path, library: str) -> None:
    path = tmp_path / "model.safetensors"
    w = _normals(3 * 1024 * 1024 + 7)  # 12 MiB and a bit: three whole frames and a short fourth
    _safetensors(path, {"w": _bf16(w), "m": w})
    choice = codec.choose(path, path.stat().st_size)
    assert choice.codec == codec.SHUFFLE_ZSTD
    enc, obj = _encode(path, choice.typesize)
    # The manifest entry as FORMAT.md specifies it, through JSON as the manifest stores it.
    entry = json.loads(
        json.dumps(
            {
                "size": path.stat().st_size,
                "crc32c": enc.hasher.crc32c_b64,
                "codec": choice.codec,
                "typesize": choice.typesize,
                "stored_size": enc.stored_size,
                "frames": [[f.offset, f.length, f.size, f.crc32c] for f in enc.frames],
            }
        )
    )
    assert entry["stored_size"] == len(obj) < entry["size"]
    back = _decode_with_the_library_alone(obj, entry, library)
    assert back == path.read_bytes()
    assert entry["crc32c"] == file_crc32c(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.binary(min_size=1, max_size=20_000),
    typesize=st.sampled_from([1, 2, 4, 8]),
    frame_size=st.sampled_from([1, 3, 8, 1000, 4096, 65_536]),
)
def test_round_trip_random_bytes_odd_lengths(tmp_path: Path, data: bytes, typesize: int, frame_size: int) -> None:
    path = tmp_path / "blob"
    path.write_bytes(data)
    enc, obj = _encode(path, typesize, frame_size)
    assert [f.size for f in enc.frames] == [n for _, n in codec.frame_layout(len(data), frame_size)]
    assert codec.check_index(enc.frames, len(data), len(obj), frame_size) == []
    back = b"".join(codec.decode_checked(obj[f.offset : f.offset + f.length], f) for f in enc.frames)
    assert back == data
    assert enc.hasher.crc32c_b64 == file_crc32c(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(min_value=1, max_value=3 * 1024 * 1024), typesize=st.sampled_from([2, 4]))
def test_round_trip_tensor_bytes_frames_of_a_mib(tmp_path: Path, n: int, typesize: int) -> None:
    # Compressible bytes, whose blocks really are shuffled and zstd-coded (random bytes are stored raw
    # by c-blosc), cut at every kind of length: the tail frame is rarely a multiple of the typesize.
    raw = _normals(n // 4 + 1).tobytes()[:n]
    path = tmp_path / "t"
    path.write_bytes(raw)
    enc, obj = _encode(path, typesize, 1024 * 1024)
    assert b"".join(codec.decode_checked(obj[f.offset : f.offset + f.length], f) for f in enc.frames) == raw


def test_a_corrupted_frame_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(_normals(600_000).tobytes())
    enc, obj = _encode(path, 4, 1024 * 1024)
    f = enc.frames[1]
    bad = bytearray(obj[f.offset : f.offset + f.length])
    bad[len(bad) // 2] ^= 0x40  # one bit inside the compressed data
    with pytest.raises(codec.CodecError):
        codec.decode_checked(bytes(bad), f)
    with pytest.raises(codec.CodecError, match="holds"):
        codec.decode_checked(obj[f.offset : f.offset + f.length], codec.Frame(f.offset, f.length, f.size - 1, f.crc32c))
    with pytest.raises(codec.CodecError, match="CRC32C"):
        codec.decode_checked(obj[f.offset : f.offset + f.length], codec.Frame(f.offset, f.length, f.size, "AAAAAA=="))
    with pytest.raises(codec.CodecError, match="shorter"):
        codec.decode_frame(b"\x02\x01")


def test_the_safetensors_header_gives_the_element_size(tmp_path: Path) -> None:
    w = _normals(100_000)
    mostly_bf16 = tmp_path / "a.safetensors"
    _safetensors(mostly_bf16, {"w": _bf16(w), "small": w[:1000]})
    assert codec.header_typesize(mostly_bf16) == 2
    mostly_f32 = tmp_path / "b.safetensors"
    _safetensors(mostly_f32, {"w": _bf16(w[:1000]), "m": w})
    assert codec.header_typesize(mostly_f32) == 4
    broken = tmp_path / "c.safetensors"
    broken.write_bytes(b"\xff" * 64)
    assert codec.header_typesize(broken) is None
    assert codec.header_typesize(tmp_path / "missing.safetensors") is None
    assert codec.header_typesize(tmp_path / "x.pt") is None


def test_choice_per_file(tmp_path: Path) -> None:
    st_path = tmp_path / "model.safetensors"
    _safetensors(st_path, {"w": _bf16(_normals(1_000_000))})
    c = codec.choose(st_path, st_path.stat().st_size)
    assert (c.codec, c.typesize) == (codec.SHUFFLE_ZSTD, 2) and c.ratio > 1.3 and "header" in c.why

    zp = tmp_path / "optimizer.pt"
    synthetic.write_torch_zip(zp, 4 * 1024 * 1024, seed=1)  # FP32 storages in a zip: no header hint
    c = codec.choose(zp, zp.stat().st_size)
    assert (c.codec, c.typesize) == (codec.SHUFFLE_ZSTD, 4) and "trial" in c.why

    noise = tmp_path / "rng_state.pth"
    noise.write_bytes(os.urandom(3 * 1024 * 1024))  # incompressible: stays as it is
    c = codec.choose(noise, noise.stat().st_size)
    assert c.codec == codec.NONE and "<" in c.why

    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert codec.choose(empty, 0).codec == codec.NONE


def test_check_index_names_what_is_wrong() -> None:
    good = [codec.Frame(0, 10, 8, "x"), codec.Frame(10, 5, 4, "y")]
    assert codec.check_index(good, 12, 15, frame_size=8) == []
    problems = codec.check_index([codec.Frame(0, 10, 8, "x"), codec.Frame(11, 5, 4, "y")], 12, 15, frame_size=8)
    assert any("starts at 11" in p for p in problems) and any("end at 16" in p for p in problems)
    assert codec.check_index(good[:1], 12, 10, frame_size=8) == ["1 frames for 12 bytes, 2 expected"]


def _manifest(*files: FileEntry) -> Manifest:
    return Manifest(run="r", step=1, format="hf", files=files, created_at=1.0, uploaded_at=2.0, source="/x")


def test_manifest_entries_carry_the_codec_and_old_ones_read_as_none() -> None:
    plain = FileEntry(path="a.bin", size=12, mtime=1.0, crc32c="AAAAAA==")
    doc = json.loads(_manifest(plain).to_json())
    # codec none writes exactly the entry of versions before codecs
    assert set(doc["files"][0]) == {"path", "size", "mtime", "crc32c", "sha256", "mode"}
    back = Manifest.from_json(json.dumps(doc).encode())
    assert back.files[0].codec == "none" and back.files[0].stored_bytes == 12

    packed = FileEntry(
        path="m.safetensors",
        size=12,
        mtime=1.0,
        crc32c="AAAAAA==",
        codec="shuffle-zstd",
        typesize=2,
        stored_size=9,
        frames=((0, 5, 8, "x"), (5, 4, 4, "y")),
    )
    doc = json.loads(_manifest(packed).to_json())
    assert doc["files"][0]["frames"] == [[0, 5, 8, "x"], [5, 4, 4, "y"]]
    back = Manifest.from_json(json.dumps(doc).encode())
    assert back.files[0] == packed and back.files[0].stored_bytes == 9 and back.total_bytes == 12
    assert [codec.Frame(*f) for f in back.files[0].frames][1] == codec.Frame(5, 4, 4, "y")  # as restore reads it

    doc["files"][0]["codec"] = "zfp"
    with pytest.raises(ManifestError, match="codec 'zfp'"):
        Manifest.from_json(json.dumps(doc).encode())
    doc["files"][0]["codec"] = "shuffle-zstd"
    doc["files"][0]["frames"] = [[0, 5, 8]]
    with pytest.raises(ManifestError, match="malformed"):
        Manifest.from_json(json.dumps(doc).encode())


def test_stored_crc32c_is_written_when_known_and_absent_reads_as_before() -> None:
    packed = FileEntry("m.bin", 12, 1.0, "AAAAAA==", codec="shuffle-zstd", typesize=2, stored_size=9,
                       frames=((0, 9, 12, "x"),), stored_crc32c="AAAABw==")  # fmt: skip
    doc = json.loads(_manifest(packed).to_json())
    assert doc["files"][0]["stored_crc32c"] == "AAAABw=="
    assert Manifest.from_json(json.dumps(doc).encode()).files[0] == packed
    del doc["files"][0]["stored_crc32c"]  # a compressed entry written before the field existed
    assert Manifest.from_json(json.dumps(doc).encode()).files[0].stored_crc32c is None
    plain = FileEntry("a.bin", 12, 1.0, "AAAAAA==", stored_crc32c="AAAABw==")  # never written for `none`
    assert "stored_crc32c" not in json.loads(_manifest(plain).to_json())["files"][0]


def test_reencode_gives_exactly_the_index_and_stored_checksum_of_the_upload(tmp_path: Path) -> None:
    """What a rerun compares with the object a crashed ingest left: the same frames, stored size and
    CRC32C of the stored bytes as encode_file's, on any number of threads; None past `limit`."""
    from ckptvault.checksum import StreamHasher

    path = tmp_path / "w.bin"
    path.write_bytes(_normals(3 * 1024 * 1024 + 5).tobytes())  # 12 MiB + 20 bytes: 4 frames
    enc, frames = codec.encode_file(path, 4, sha256=True)
    stored = StreamHasher()
    for fr in frames:
        stored.update(fr)
    for workers in (1, 3):
        got = codec.reencode(path, 4, workers=workers, sha256=True)
        assert got is not None and list(got.frames) == enc.frames
        assert (got.size, got.crc32c, got.sha256) == (path.stat().st_size, file_crc32c(path), enc.hasher.sha256_hex)
        assert (got.stored_size, got.stored_crc32c) == (enc.stored_size, stored.crc32c_b64)
    assert codec.reencode(path, 4, workers=2, limit=enc.stored_size - 1) is None
    other = codec.reencode(path, 2)  # another typesize: other bytes, so an object of typesize 4 is not kept
    assert other is not None and other.stored_crc32c != stored.crc32c_b64


def test_a_torch_save_zip_gives_the_element_size_of_its_storages(tmp_path: Path) -> None:
    """A real torch.save: the storages its data.pkl names (read by opcodes, never unpickled), weighed by
    their bytes in the zip, decide; the pickle is not run even when it would run code."""
    import torch  # the framework tests' dependency: installed wherever the suite runs

    bf16 = {"w": torch.randn(256, 256).to(torch.bfloat16), "step": torch.tensor(3)}
    torch.save(bf16, tmp_path / "model.pt")
    assert codec.header_hint(tmp_path / "model.pt") == (2, "torch storages")
    mixed = {**bf16, "exp_avg": torch.randn(256, 256), "exp_avg_sq": torch.randn(256, 256) ** 2}  # FP32: most bytes
    torch.save(mixed, tmp_path / "optim.pt")
    assert codec.header_typesize(tmp_path / "optim.pt") == 4
    choice = codec.choose(tmp_path / "optim.pt", (tmp_path / "optim.pt").stat().st_size)
    assert choice.typesize == 4 and "torch storages" in choice.why

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    torch.save({"x": torch.zeros(1000, dtype=torch.float16), "evil": Boom()}, tmp_path / "evil.pt")
    assert codec.header_typesize(tmp_path / "evil.pt") == 2 and not (tmp_path / "ran").exists()
    # the synthetic torch zip's pickle names no storage: no hint, the trial decides
    synthetic.write_torch_zip(tmp_path / "synthetic.pt", 64 * 1024)
    assert codec.header_hint(tmp_path / "synthetic.pt") is None
    (tmp_path / "torn.pt").write_bytes((tmp_path / "optim.pt").read_bytes()[:5000])
    assert codec.header_hint(tmp_path / "torn.pt") is None
    # a well-formed zip whose data.pkl is garbage (a pickle the opcode reader chokes on): no hint either
    with zipfile.ZipFile(tmp_path / "garbled.pt", "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02(t\x94\x85R.")  # MARK, TUPLE, MEMOIZE, TUPLE1 on nothing, REDUCE
        z.writestr("archive/data/0", b"\0" * 4096)
    assert codec.header_hint(tmp_path / "garbled.pt") is None
