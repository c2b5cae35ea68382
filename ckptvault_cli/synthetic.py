"""Realistic synthetic checkpoints of every supported layout (tests, `make demo`, benchmarks).

Files have the real on-disk structure (safetensors headers, torch.save-style zips, DCP `.metadata`,
pointer files, markers) so discovery and structural checks see what a framework would write. Bulk
bytes are float32 normals from one pre-generated pool, streamed in 8 MiB slices: writing 16 GiB costs a
few MiB of memory, runs near disk speed, and the same seed always yields the same bytes.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np

from ckptvault.errors import InvalidArgumentError

CHUNK = 8 << 20
_SLACK = 1 << 20  # the pool is CHUNK + _SLACK so each file can start at its own offset
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so archives are byte-identical for a given seed
FORMATS = ("hf", "dcp", "megatron", "deepspeed", "orbax", "lightning", "nemo")


class _Pool:
    """Deterministic bytes: one pool per seed, sliced at a per-file offset (small, cached)."""

    _cache: ClassVar[dict[int, memoryview]] = {}

    @classmethod
    def get(cls, seed: int) -> memoryview:
        if seed not in cls._cache:
            rng = np.random.default_rng(seed)
            data = (rng.standard_normal((CHUNK + _SLACK) // 4, dtype=np.float32) * 0.02).tobytes()
            cls._cache = {seed: memoryview(data)}  # keep one pool: memory stays bounded
        return cls._cache[seed]


def _stream(out: BinaryIO, nbytes: int, seed: int, key: str) -> None:
    pool = _Pool.get(seed)
    offset = (zlib.crc32(key.encode()) % (_SLACK // 4)) * 4  # 4-aligned: slices stay valid float32
    while nbytes > 0:
        n = min(nbytes, CHUNK)
        out.write(pool[offset : offset + n])
        nbytes -= n
        offset = (offset + 4096) % _SLACK


def _raw(path: Path, nbytes: int, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        _stream(f, max(nbytes, 64), seed, path.name)


def _text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _tensors(prefix: str, nbytes: int, count: int = 4, first: int = 0) -> list[tuple[str, list[int]]]:
    """Names and float32 shapes of `count` tensors totalling ~nbytes (each at least one element)."""
    elems = max(nbytes // 4, count)
    kinds = (
        "self_attn.q_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    )
    out = []
    for i in range(count):
        n = elems // count + (elems % count if i == count - 1 else 0)
        shape = [n // 256, 256] if n % 256 == 0 else [n]
        j = first + i
        out.append((f"{prefix}.layers.{j // len(kinds)}.{kinds[j % len(kinds)]}", shape))
    return out


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def write_safetensors(path: Path, tensors: Sequence[tuple[str, list[int]]], seed: int = 0) -> int:
    """A valid float32 safetensors file; returns its size."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        size = _numel(shape) * 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8 bytes with spaces
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        _stream(f, offset, seed, path.name)
    return 8 + len(raw) + offset


def write_torch_zip(path: Path, nbytes: int, seed: int = 0, storages: int = 2) -> None:
    """A torch.save-style zip (ZIP_STORED, `archive/` prefix). The pickle is a plain dict describing
    the storages, not torch tensors: readable without torch, structurally what torch writes."""
    sizes = [max(nbytes // storages, 4) for _ in range(storages)]
    meta = {
        "format": "ckptvault-synthetic",
        "storages": {str(i): {"dtype": "float32", "nbytes": s} for i, s in enumerate(sizes)},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(zipfile.ZipInfo("archive/data.pkl", _ZIP_TIME), pickle.dumps(meta, protocol=2))
        zf.writestr(zipfile.ZipInfo("archive/byteorder", _ZIP_TIME), b"little")
        for i, size in enumerate(sizes):
            info = zipfile.ZipInfo(f"archive/data/{i}", _ZIP_TIME)
            info.file_size = size
            with zf.open(info, "w", force_zip64=size >= zipfile.ZIP64_LIMIT) as w:
                _stream(w, size, seed, f"{path.name}/{i}")  # type: ignore[arg-type]
        zf.writestr(zipfile.ZipInfo("archive/version", _ZIP_TIME), b"3\n")
        zf.writestr(zipfile.ZipInfo("archive/.data/serialization_id", _ZIP_TIME), f"{seed:040d}".encode())


def _dcp_metadata(path: Path, ranks: int, names: Sequence[str]) -> None:
    # Real DCP pickles a Metadata dataclass; a plain dict keeps the file a valid, non-empty pickle.
    doc = {"state_dict_metadata": {n: {"ranks": ranks} for n in names}, "storage_data": {}}
    path.write_bytes(pickle.dumps(doc, protocol=2))


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (total % parts if i == parts - 1 else 0) for i in range(parts)]


def default_loss(step: int) -> float:
    """A plausible, decreasing loss curve."""
    return round(4.0 / float((1.0 + step / 1000.0) ** 0.5), 6)


def _trainer_state(step: int, loss: float | None) -> str:
    last = default_loss(step) if loss is None else loss
    steps = sorted({max(step // 2, 1), step})
    history: list[dict[str, Any]] = []
    for s in steps:
        history.append(
            {
                "epoch": s / 1000,
                "grad_norm": 1.25,
                "learning_rate": 3e-4,
                "step": s,
                "loss": last if s == step else default_loss(s),
            }
        )
    history.append({"epoch": step / 1000, "eval_loss": last * 1.05, "step": step})
    doc = {
        "global_step": step,
        "epoch": step / 1000,
        "max_steps": max(step * 10, 1000),
        "log_history": history,
        "best_metric": None,
        "is_world_process_zero": True,
    }
    return json.dumps(doc, indent=2)  # json writes NaN as NaN, like the Trainer


# --- per-format writers: (run_root, step, size, shards, seed, complete, loss) -> checkpoint path ---


def _hf(root: Path, step: int, size: int, shards: int, seed: int, complete: bool, loss: float | None) -> Path:
    d = root / f"checkpoint-{step}"
    model = size // 3
    weight_map: dict[str, str] = {}
    total = 0
    for i, part in enumerate(_split(model, shards)):
        name = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = _tensors("model", part, first=4 * i)
        total += write_safetensors(d / name, tensors, seed)
        weight_map.update({t: name for t, _ in tensors})
    if shards > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _text(d / "model.safetensors.index.json", json.dumps(index, indent=2))
    _text(d / "config.json", json.dumps({"model_type": "llama", "hidden_size": 256, "torch_dtype": "float32"}))
    write_torch_zip(d / "optimizer.pt", size - model, seed)
    write_torch_zip(d / "scheduler.pt", 1024, seed, storages=1)
    write_torch_zip(d / "rng_state.pth", 4096, seed, storages=1)
    write_torch_zip(d / "training_args.bin", 2048, seed, storages=1)
    if complete:
        _text(d / "trainer_state.json", _trainer_state(step, loss))  # the Trainer writes it last
    return d


def _dcp(root: Path, step: int, size: int, shards: int, seed: int, complete: bool, loss: float | None) -> Path:
    d = root / f"step-{step}"
    for rank, part in enumerate(_split(size, shards)):
        _raw(d / f"__{rank}_0.distcp", part, seed)
    _dcp_metadata(d / (".metadata" if complete else ".metadata.tmp"), shards, ["model", "optimizer"])
    return d


def _megatron(root: Path, step: int, size: int, shards: int, seed: int, complete: bool, loss: float | None) -> Path:
    d = root / f"iter_{step:07d}"
    for rank, part in enumerate(_split(size, shards)):
        write_torch_zip(d / f"mp_rank_{rank:02d}" / "model_optim_rng.pt", part, seed)
    if complete:
        _advance_pointer(root / "latest_checkpointed_iteration.txt", step, str(step))
    return d


def _deepspeed(root: Path, step: int, size: int, shards: int, seed: int, complete: bool, loss: float | None) -> Path:
    d = root / f"global_step{step}"
    write_torch_zip(d / "mp_rank_00_model_states.pt", size // 3, seed)
    for rank, part in enumerate(_split(size - size // 3, shards)):
        write_torch_zip(d / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", part, seed)
    if complete:
        _advance_pointer(root / "latest", step, d.name)
    return d


def _orbax_tmp(root: Path, step: int) -> Path:
    return root / f"{step}.orbax-checkpoint-tmp-{step}"


def _orbax_commit(d: Path, step: int) -> None:
    meta = {
        "item_handlers": {"default": "orbax.checkpoint.PyTreeCheckpointHandler"},
        "metrics": {},
        "performance_metrics": {},
        "init_timestamp_nsecs": step,
        "commit_timestamp_nsecs": step + 1,
    }
    _text(d / "_CHECKPOINT_METADATA", json.dumps(meta))
    _text(d / "commit_success.txt", f"Checkpoint commit was successful for step {step}")


def _orbax(root: Path, step: int, size: int, shards: int, seed: int, complete: bool, loss: float | None) -> Path:
    d = root / str(step) if complete else _orbax_tmp(root, step)
    item = d / "default"
    for proc, part in enumerate(_split(size, shards)):
        _raw(item / f"ocdbt.process_{proc}" / "d" / f"{zlib.crc32(f'{step}/{proc}'.encode()):08x}", part, seed)
    _text(item / "_METADATA", json.dumps({"tree_metadata": {"params": {"kernel": {"value_type": "jax.Array"}}}}))
    _text(item / "manifest.ocdbt", f"ocdbt manifest for {shards} process(es)\n")
    _text(item / "_sharding", json.dumps({"params.kernel": {"sharding_type": "NamedSharding"}}))
    if complete:
        _orbax_commit(d, step)
    return d


def _lightning_name(step: int) -> str:
    return f"epoch={step // 1000}-step={step}.ckpt"


def _lightning(root: Path, step: int, size: int, shards: int, seed: int, complete: bool, loss: float | None) -> Path:
    path = root / (_lightning_name(step) + ("" if complete else ".tmp"))
    write_torch_zip(path, size, seed, storages=max(shards, 1))
    return path


def _nemo_name(step: int) -> str:
    return f"model--step={step}-consumed_samples={step * 8}.0"


def _nemo(root: Path, step: int, size: int, shards: int, seed: int, complete: bool, loss: float | None) -> Path:
    d = root / _nemo_name(step)
    marker = root / (d.name + "-unfinished")
    root.mkdir(parents=True, exist_ok=True)
    marker.touch()  # NeMo creates the marker before writing anything
    for rank, part in enumerate(_split(size, shards)):
        _raw(d / "weights" / f"__{rank}_0.distcp", part, seed)
    write_torch_zip(d / "weights" / "common.pt", 2048, seed, storages=1)
    _text(
        d / "weights" / "metadata.json",
        json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}),
    )
    _dcp_metadata(d / "weights" / ".metadata", shards, ["model"])
    _text(d / "context" / "io.json", json.dumps({"root": {"type": "nemo.collections.llm.GPTModel"}}))
    _text(d / "context" / "model.yaml", "_target_: nemo.collections.llm.GPTModel\nconfig:\n  num_layers: 2\n")
    if complete:
        marker.unlink()
    return d


_WRITERS = {
    "hf": _hf,
    "dcp": _dcp,
    "megatron": _megatron,
    "deepspeed": _deepspeed,
    "orbax": _orbax,
    "lightning": _lightning,
    "nemo": _nemo,
}


def _advance_pointer(path: Path, step: int, content: str) -> None:
    """Pointer files only move forward: finishing an old save must not rewind the run."""
    current = path.read_text().strip() if path.exists() else ""
    digits = "".join(ch for ch in current if ch.isdigit())
    if not digits or int(digits) <= step:
        tmp = path.with_name(path.name + ".tmp-ckptvault")
        tmp.write_text(content + "\n")
        os.replace(tmp, path)


def write_checkpoint(
    run_root: Path,
    fmt: str,
    step: int,
    size_bytes: int,
    *,
    shards: int = 2,
    seed: int = 0,
    complete: bool = True,
    loss: float | None = None,
) -> Path:
    """Write one checkpoint of `fmt` for `step` (~size_bytes in total) under `run_root`; returns its path
    (the directory, or the file for lightning). `complete=False` leaves it as a crashed or ongoing
    save would: per the format's commit rule, not yet committed."""
    if fmt not in _WRITERS:
        raise InvalidArgumentError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if shards < 1 or step < 0 or size_bytes < 0:
        raise InvalidArgumentError("shards must be >= 1, step and size_bytes >= 0")
    run_root.mkdir(parents=True, exist_ok=True)
    return _WRITERS[fmt](run_root, step, size_bytes, shards, seed, complete, loss)


def finish_checkpoint(run_root: Path, fmt: str, step: int, *, loss: float | None = None) -> None:
    """Commit a checkpoint written with complete=False, the way its framework would."""
    if fmt == "hf":
        _text(run_root / f"checkpoint-{step}" / "trainer_state.json", _trainer_state(step, loss))
    elif fmt == "dcp":
        d = run_root / f"step-{step}"
        os.replace(d / ".metadata.tmp", d / ".metadata")
    elif fmt == "megatron":
        _advance_pointer(run_root / "latest_checkpointed_iteration.txt", step, str(step))
    elif fmt == "deepspeed":
        _advance_pointer(run_root / "latest", step, f"global_step{step}")
    elif fmt == "orbax":
        final = run_root / str(step)
        _orbax_commit(_orbax_tmp(run_root, step), step)
        os.replace(_orbax_tmp(run_root, step), final)
    elif fmt == "lightning":
        path = run_root / _lightning_name(step)
        os.replace(path.with_name(path.name + ".tmp"), path)
    elif fmt == "nemo":
        (run_root / (_nemo_name(step) + "-unfinished")).unlink(missing_ok=True)
    else:
        raise InvalidArgumentError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
