"""Synthetic checkpoints: realistic, deterministic, streaming, pointer files move forward."""

from __future__ import annotations

import hashlib
import json
import pickle
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from ckptvault.formats import hf
from ckptvault_cli import synthetic
from tests.helpers import simulate_run

FORMATS = list(synthetic.FORMATS)


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def total(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("fmt", FORMATS)
def test_deterministic_per_seed(tmp_path: Path, fmt: str) -> None:
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        simulate_run(tmp_path / name, fmt, [10, 20], 200_000, seed=seed)
    a, b, c = (digest(tmp_path / n) for n in "abc")
    assert a == b
    assert a.keys() == c.keys() and a != c


@pytest.mark.parametrize("fmt", FORMATS)
def test_size_is_approximately_requested(tmp_path: Path, fmt: str) -> None:
    size = 3 << 20
    path = synthetic.write_checkpoint(tmp_path, fmt, 5, size)
    assert size * 0.95 <= total(path) <= size * 1.05 + (64 << 10)


def test_safetensors_are_real(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 100, 1 << 20, shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    loaded: dict[str, np.ndarray] = {}
    for shard in sorted(set(index["weight_map"].values())):
        loaded.update(load_file(d / shard))
    assert set(loaded) == set(index["weight_map"])
    assert all(name.startswith("model.layers.") for name in loaded)
    for arr in loaded.values():
        assert arr.dtype == np.float32 and np.isfinite(arr).all() and 0.01 < float(arr.std()) < 0.03


def test_single_shard_hf_has_no_index(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 100, 1 << 20, shards=1)
    assert (d / "model.safetensors").exists() and not (d / "model.safetensors.index.json").exists()


def test_torch_zip_is_torch_shaped(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "deepspeed", 100, 1 << 20)
    with zipfile.ZipFile(d / "mp_rank_00_model_states.pt") as zf:
        names = zf.namelist()
        assert {"archive/data.pkl", "archive/byteorder", "archive/version", "archive/data/0"} <= set(names)
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
        assert zf.read("archive/byteorder") == b"little"
        meta = pickle.loads(zf.read("archive/data.pkl"))
        assert zf.testzip() is None
    assert set(meta["storages"]) == {"0", "1"}


def test_trainer_state_loss_and_metrics(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 100, 1 << 16, loss=0.75)
    assert hf.read_metrics(d)["loss"] == 0.75
    synthetic.write_checkpoint(tmp_path, "hf", 200, 1 << 16, complete=False)
    synthetic.finish_checkpoint(tmp_path, "hf", 200, loss=0.5)
    assert hf.read_metrics(tmp_path / "checkpoint-200")["loss"] == 0.5
    assert hf.read_metrics(tmp_path / "checkpoint-100")["loss"] == 0.75


@pytest.mark.parametrize(("fmt", "pointer", "expect"), [
    ("deepspeed", "latest", "global_step{}"),
    ("megatron", "latest_checkpointed_iteration.txt", "{}"),
])  # fmt: skip
def test_pointer_files_move_forward(tmp_path: Path, fmt: str, pointer: str, expect: str) -> None:
    simulate_run(tmp_path, fmt, [10, 20], 1 << 16)
    assert (tmp_path / pointer).read_text().strip() == expect.format(20)
    synthetic.write_checkpoint(tmp_path, fmt, 30, 1 << 16, complete=False)
    assert (tmp_path / pointer).read_text().strip() == expect.format(20)
    synthetic.write_checkpoint(tmp_path, fmt, 5, 1 << 16, complete=False)
    synthetic.finish_checkpoint(tmp_path, fmt, 5)  # an old save finishing late must not rewind
    assert (tmp_path / pointer).read_text().strip() == expect.format(20)
    synthetic.finish_checkpoint(tmp_path, fmt, 30)
    assert (tmp_path / pointer).read_text().strip() == expect.format(30)


def test_simulate_run_returns_paths_in_order(tmp_path: Path) -> None:
    paths = simulate_run(tmp_path, "nemo", [3, 1, 2], 1 << 16, shards=1)
    assert [p.name.split("--step=")[1].split("-")[0] for p in paths] == ["3", "1", "2"]
    assert all(p.is_dir() and (p / "weights").is_dir() and (p / "context").is_dir() for p in paths)
    assert not list(tmp_path.glob("*-unfinished"))


def test_nemo_incomplete_has_marker(tmp_path: Path) -> None:
    p = synthetic.write_checkpoint(tmp_path, "nemo", 4, 1 << 16, complete=False)
    assert (tmp_path / (p.name + "-unfinished")).exists()


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown format 'zarr'"):
        synthetic.write_checkpoint(tmp_path, "zarr", 1, 10)
    with pytest.raises(ValueError, match="shards"):
        synthetic.write_checkpoint(tmp_path, "hf", 1, 10, shards=0)


def test_streaming_memory_is_bounded(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path / "warm", "dcp", 1, 1 << 16)  # the pool exists before measuring
    tracemalloc.start()
    try:
        synthetic.write_checkpoint(tmp_path, "lightning", 1, 96 << 20, shards=1)
        synthetic.write_checkpoint(tmp_path, "dcp", 2, 96 << 20, shards=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # slices of the shared pool are written directly, never copied
