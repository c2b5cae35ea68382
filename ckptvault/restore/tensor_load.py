"""Checkpoints whose files only load together: DCP directories read into empty tensors of their
recorded shapes (metadata unpickled with an allowlist), and Orbax items restored with Orbax."""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

from ckptvault.restore.load_result import DCP_BATCH_BYTES, DCP_METADATA, DCP_SUFFIX, FileCheck, has
from ckptvault.restore.pickle_check import check_torch_zip

# --- DCP --------------------------------------------------------------------------------------------------

# What a DCP `.metadata` pickle may name (torch/distributed/checkpoint/metadata.py and filesystem.py,
# torch 2.13): plain dataclasses, an enum, torch.Size and dtypes, the layout lookup, paths.
_DCP_MODULES_ANY = ("torch.distributed.checkpoint.metadata",)
# Megatron-Core's dist_checkpointing also keeps every rank's save plan in it, as `all_local_plans`
# (megatron/core/dist_checkpointing/strategies/state_dict_saver.py, save_state_dict_async_plan, 0.16):
# the plain dataclasses and enum of torch/distributed/checkpoint/planner.py.
_DCP_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.planner", "SavePlan"),
    ("torch.distributed.checkpoint.planner", "WriteItem"),
    ("torch.distributed.checkpoint.planner", "WriteItemType"),
    ("torch.distributed.checkpoint.planner", "TensorWriteData"),
    ("torch.distributed.checkpoint.planner", "BytesIOWriteData"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP `.metadata` constructing only DCP's metadata types (what FileSystemReader's own
    `pickle.load` would run anything for)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module in _DCP_MODULES_ANY or (module, name) in _DCP_ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"names {module}.{name}, which a DCP .metadata does not hold")


def _read_dcp_metadata(path: Path) -> Any:
    from torch.distributed.checkpoint.metadata import Metadata

    with open(path, "rb") as f:
        md = _MetadataUnpickler(f).load()
    if not isinstance(md, Metadata):
        raise pickle.UnpicklingError(f"holds a {type(md).__name__}, not a DCP Metadata")
    return md


def check_dcp_dir(directory: Path, rel: str) -> FileCheck:
    shards = sorted(p.name for p in directory.iterdir() if p.name.endswith(DCP_SUFFIX))
    where = f"{DCP_METADATA} and {len(shards)} {DCP_SUFFIX} file(s)"
    if not has("torch"):
        return FileCheck(
            rel,
            f"{where}: CRC32C only; torch.distributed.checkpoint load not run: torch is not installed on this worker",
            ran=False,
        )
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, StorageMeta, TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    how = f"{where}: metadata unpickled with only DCP's metadata classes allowed"
    try:
        md = _read_dcp_metadata(directory / DCP_METADATA)
    except Exception as e:
        return FileCheck(rel, how, f"{DCP_METADATA} does not read: {e}")

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    byte_checks: list[FileCheck] = []

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            # DCP would torch.load(value, weights_only=False): read it as a torch zip instead
            byte_checks.append(check_torch_zip(value, read_item.dest_index.fqn))

    tensors = {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    blobs = [k for k, v in md.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
    batches: list[list[str]] = [[]]
    size = 0
    for fqn, meta in tensors.items():
        nbytes = meta.size.numel() * torch.empty((), dtype=meta.properties.dtype).element_size()
        if batches[-1] and size + nbytes > DCP_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(fqn)
        size += nbytes
    loaded = 0
    try:
        for i, batch in enumerate(batches):
            state: dict[str, Any] = {
                fqn: torch.empty(tuple(tensors[fqn].size), dtype=tensors[fqn].properties.dtype) for fqn in batch
            }
            if i == 0:
                state.update({fqn: None for fqn in blobs})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized": meant, no process group
                dcp_load(
                    state,
                    storage_reader=Reader(directory),
                    planner=Planner(flatten_state_dict=False, allow_partial_load=True),
                    no_dist=True,
                )
            loaded += len(batch)
            del state
    except Exception as e:
        return FileCheck(rel, how, f"torch.distributed.checkpoint.load fails after {loaded} tensors: {e}")
    bad = [f"{c.path}: {c.problem}" for c in byte_checks if c.problem]
    how += f"; {loaded} tensors loaded into empty tensors by torch.distributed.checkpoint.load (no process group)"
    if blobs:
        refused = sum(1 for c in byte_checks if "opcodes were read" in c.how)
        how += f"; {len(blobs)} non-tensor entries read as torch.save zips with weights_only=True" + (
            f" ({refused} by pickle opcodes, not executed)" if refused else ""
        )
    if len(byte_checks) != len(blobs):
        bad.append(f"{len(blobs)} non-tensor entries in the metadata, {len(byte_checks)} read")
    return FileCheck(rel, how, "; ".join(bad))


# --- Orbax ------------------------------------------------------------------------------------------------


def check_orbax_item(directory: Path, rel: str) -> FileCheck:
    if not (has("orbax.checkpoint") and has("jax")):
        return FileCheck(
            rel,
            "Orbax item: CRC32C only; Orbax restore not run: orbax-checkpoint and jax are not installed on this worker",
            ran=False,
        )
    import jax
    import orbax.checkpoint as ocp

    how = "Orbax item restored with orbax.checkpoint.StandardCheckpointer"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "sharding info not provided": restored onto this host's devices
            with ocp.StandardCheckpointer() as ckptr:
                restored = ckptr.restore(directory.absolute())
        leaves = jax.tree_util.tree_leaves(restored)
        arrays = sum(1 for v in leaves if hasattr(v, "shape"))
        nbytes = sum(int(getattr(v, "nbytes", 0)) for v in leaves)
        del restored, leaves
    except Exception as e:
        return FileCheck(rel, how, f"Orbax restore fails: {type(e).__name__}: {e}")
    return FileCheck(rel, f"{how}: {arrays} arrays ({nbytes} bytes)")
