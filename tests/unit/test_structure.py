"""Structural checks: each problem names the file, what is wrong and what was expected."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest

from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.ingest.discovery import discover, walk
from ckptvault.ingest.structure import check_structure
from ckptvault_cli import synthetic
from tests.helpers import simulate_run

FORMATS = list(synthetic.FORMATS)
SIZE = 256 << 10


def files_of(path: Path) -> list[LocalFile]:
    if path.is_file():
        st = path.stat()
        return [LocalFile(path.name, path, st.st_size, st.st_mtime)]
    problems: list[str] = []
    files, _, _ = walk(path, problems)
    assert problems == []
    return files


def check(fmt: str, path: Path) -> list[str]:
    return check_structure(fmt, path, files_of(path))


def truncate(path: Path, by: int) -> None:
    os.truncate(path, path.stat().st_size - by)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shards", [1, 3])
def test_valid_synthetic_checkpoints_have_no_problems(tmp_path: Path, fmt: str, shards: int) -> None:
    path = synthetic.write_checkpoint(tmp_path, fmt, 100, SIZE, shards=shards)
    assert check(fmt, path) == []


def test_via_discovery_too(tmp_path: Path) -> None:
    simulate_run(tmp_path, "hf", [1, 2], SIZE)
    for f in discover("r", tmp_path, "hf", 60, time.time() + 3600).found:
        assert check_structure("hf", f.path, f.files) == []


def test_truncated_safetensors_shard(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 1, SIZE)
    shard = d / "model-00002-of-00002.safetensors"
    size = shard.stat().st_size
    truncate(shard, 100)
    (msg,) = check("hf", d)
    assert msg.startswith("model-00002-of-00002.safetensors: truncated")
    assert f"describes {size} bytes" in msg and f"has {size - 100}" in msg and "100 bytes missing" in msg


def test_safetensors_extra_bytes(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 1, SIZE, shards=1)
    with open(d / "model.safetensors", "ab") as f:
        f.write(b"\0" * 16)
    (msg,) = check("hf", d)
    assert msg.startswith("model.safetensors: 16 extra bytes")


def test_safetensors_truncated_inside_header(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 1, SIZE, shards=1)
    os.truncate(d / "model.safetensors", 40)
    (msg,) = check("hf", d)
    assert msg.startswith("model.safetensors: header length field says") and "has 40" in msg


def test_safetensors_bad_json_and_bad_offsets(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 8) + b"{nope!!}")
    odd = tmp_path / "odd.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    odd.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    problems = check_structure("hf", tmp_path, files_of(tmp_path))
    assert any(p.startswith("bad.safetensors: safetensors header is not valid JSON") for p in problems)
    assert any(p.startswith("odd.safetensors: tensor 'w' (F32 [3]) needs 12 bytes") for p in problems)


def test_zero_byte_file(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "deepspeed", 1, SIZE)
    (d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"")
    (msg,) = check("deepspeed", d)
    assert msg.startswith("zero_pp_rank_1_mp_rank_00_optim_states.pt: zero-byte file")


def test_shard_missing_from_index(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 1, SIZE, shards=3)
    (d / "model-00003-of-00003.safetensors").unlink()
    (msg,) = check("hf", d)
    assert msg == "model.safetensors.index.json: names shard model-00003-of-00003.safetensors, " + (
        "which is missing from the checkpoint"
    )


def test_unreadable_index(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 1, SIZE, shards=2)
    (d / "model.safetensors.index.json").write_text("[]")
    (msg,) = check("hf", d)
    assert msg.startswith("model.safetensors.index.json: cannot read its weight_map")


@pytest.mark.parametrize("cut", [22, 2000])
def test_corrupt_pt_zip(tmp_path: Path, cut: int) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 1, SIZE)
    truncate(d / "optimizer.pt", cut)  # 22 bytes: the end-of-central-directory record is gone
    (msg,) = check("hf", d)
    assert msg.startswith("optimizer.pt: torch.save zip central directory cannot be read")


def test_pt_that_is_not_a_zip_or_pickle(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "megatron", 1, SIZE)
    (d / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"hello world")
    (msg,) = check("megatron", d)
    assert msg.startswith("mp_rank_00/model_optim_rng.pt: neither a torch.save zip")


def test_legacy_pickle_pt_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "old.bin").write_bytes(b"\x80\x02}q\x00.")
    assert check_structure("hf", tmp_path, files_of(tmp_path)) == []


def test_lightning_truncated_ckpt(tmp_path: Path) -> None:
    p = synthetic.write_checkpoint(tmp_path, "lightning", 1, SIZE)
    truncate(p, 10)
    (msg,) = check("lightning", p)
    assert msg.startswith(f"{p.name}: torch.save zip central directory cannot be read")


def test_dcp_metadata_missing_or_empty(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "dcp", 1, SIZE)
    (d / ".metadata").write_bytes(b"")
    assert check("dcp", d) == [".metadata: zero-byte file; every checkpoint file should hold data"]
    (d / ".metadata").unlink()
    (msg,) = check("dcp", d)
    assert ".metadata" in msg and "no .metadata" in msg


def test_nemo_weights_without_metadata(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "nemo", 1, SIZE)
    (d / "weights" / ".metadata").unlink()
    (msg,) = check("nemo", d)
    assert msg.startswith("weights/: has .distcp shards but no .metadata")


def test_every_problem_is_reported(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 1, SIZE, shards=3)
    truncate(d / "model-00001-of-00003.safetensors", 4)
    (d / "model-00002-of-00003.safetensors").unlink()
    (d / "config.json").write_bytes(b"")
    truncate(d / "optimizer.pt", 22)
    problems = check("hf", d)
    assert len(problems) == 4
    for name in ("model-00001-of-00003", "model-00002-of-00003", "config.json", "optimizer.pt"):
        assert any(name in p for p in problems), name


def _bytes_read_by_this_process() -> int:
    """/proc/self/io rchar: every byte this process (all its threads) got from read(2), pread(2) and
    kin, whatever Python layer asked, so no wrapper around one open() can be bypassed unseen."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_only_headers_are_read(tmp_path: Path) -> None:
    """A sparse 4 GiB safetensors file is checked by its header alone: the process reads a few KiB, not
    the data. (Its speed is bench/micro.py header-read's to measure.)"""
    n = 1 << 30  # 4 GiB of F32
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    big = tmp_path / "big.safetensors"
    with open(big, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 4 * n)
    files = files_of(tmp_path)
    before = _bytes_read_by_this_process()
    assert check_structure("hf", tmp_path, files) == []
    read = _bytes_read_by_this_process() - before
    # The header plus one buffered block or so; a margin for anything else this process reads meanwhile,
    # still 4,000 times less than the data.
    assert read < 1 << 20, f"{read} bytes read to check a file with a {len(header)}-byte header"


def test_non_zip_bin_is_not_judged_but_corrupt_zip_bin_is(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.bin").write_bytes(b"\x00\x01spm")
    synthetic.write_torch_zip(tmp_path / "pytorch_model.bin", 4096)
    assert check_structure("hf", tmp_path, files_of(tmp_path)) == []
    truncate(tmp_path / "pytorch_model.bin", 22)
    (msg,) = check_structure("hf", tmp_path, files_of(tmp_path))
    assert msg.startswith("pytorch_model.bin: torch.save zip central directory cannot be read")
