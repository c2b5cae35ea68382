"""What a drill proves about a restored checkpoint beyond its CRC32Cs, and how, file by file.

Nothing read from the bucket is ever executed. A pickle is either loaded by an unpickler that
constructs only an allowlist of plain data types (`torch.load(weights_only=True)`; DCP's `.metadata`
with `_MetadataUnpickler`), or its opcodes are read with `pickletools.genops` to the STOP opcode and
never run. `weights_only=False` is never used on restored bytes.

Per file (or per checkpoint directory, for DCP and Orbax, whose files only load together):

- `*.safetensors`: every tensor read in full (safetensors, numpy).
- torch.save zips (`.pt`, `.pth`, `.bin`, `.ckpt`): every member's CRC, then
  `torch.load(weights_only=True)` where torch is installed. A file that weights_only refuses because
  its pickle names a framework's class (HF `training_args.bin` holds a `TrainingArguments`, DeepSpeed's
  optimizer states a `LossScaler`, Lightning's `.ckpt` its callbacks' state) is not a failure: its
  pickle is read as opcodes (a truncated or garbled pickle fails, every storage it names must be in
  the zip) and the classes it names are listed. Where torch is not installed, the same opcode read
  runs and the check says that `torch.load` did not.
- DCP directories (`.metadata` + `*.distcp`, also Megatron-Core's torch_dist): the metadata is
  unpickled with only DCP's metadata classes (and the save plans Megatron-Core adds) allowed, then
  `torch.distributed.checkpoint.load` (no process group) reads every tensor into an empty tensor
  of its recorded shape and dtype, in batches of at most `DCP_BATCH_BYTES`.
  Non-tensor entries (DCP stores them as torch.save bytes, which DCP itself would load with
  `weights_only=False`) are checked like a torch zip above instead.
- Orbax items (directories with `_METADATA`): restored with `orbax.checkpoint.StandardCheckpointer`
  (arrays read through tensorstore; no pickles) and counted.
- `*.json` and Orbax's `_CHECKPOINT_METADATA`: parsed.
- Anything else: only its CRC32C, and the check says so.

A framework that is not installed on the worker is never a silent pass: the check says which load
it could not run (`ran = False`), and the drill result carries that line.
"""

from __future__ import annotations

import importlib.util
import io
import json
import pickle
import pickletools
import re
import warnings
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
DCP_METADATA = ".metadata"
DCP_SUFFIX = ".distcp"
ORBAX_ITEM_METADATA = "_METADATA"
JSON_NAMES = ("_CHECKPOINT_METADATA",)
DCP_BATCH_BYTES = 512 << 20  # tensors allocated per dcp.load call: the check's memory stays bounded
_NAMES_SHOWN = 4


@dataclass(frozen=True)
class FileCheck:
    """What was checked for one file (or one directory, path ending in '/') and how."""

    path: str
    how: str
    problem: str = ""  # empty when the check passed
    ran: bool = True  # False: a load check that applies could not run here (its framework is not installed)

    @property
    def ok(self) -> bool:
        return not self.problem

    def describe(self) -> str:
        return f"{self.path}: {self.how}" + (f"; FAILED: {self.problem}" if self.problem else "")


@dataclass(frozen=True)
class LoadReport:
    checks: tuple[FileCheck, ...]

    @property
    def problems(self) -> list[str]:
        return [f"{c.path}: {c.problem}" for c in self.checks if c.problem]

    @property
    def not_run(self) -> list[str]:
        return [c.describe() for c in self.checks if not c.ran]

    def descriptions(self) -> list[str]:
        return [c.describe() for c in self.checks]


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# --- pickles, read and never run ----------------------------------------------------------------------


@dataclass(frozen=True)
class PickleScan:
    globals: tuple[str, ...]  # every class or function the pickle names, as module.qualname, in order
    storages: tuple[str, ...]  # torch.save storage keys named by its persistent ids
    trailing: int  # bytes after the STOP opcode


_MARK = object()
_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
               "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"}  # fmt: skip
_INT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}


def scan_pickle(data: bytes) -> PickleScan:
    """Read a pickle's opcodes to its STOP with `pickletools.genops`, tracking the stack only as far as
    needed to name what it references: nothing is constructed, imported or called. Raises ValueError
    for a pickle that is truncated or garbled (an unknown opcode, a stack or memo that does not add
    up, no STOP)."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    names: list[str] = []
    storages: list[str] = []
    end = None
    for op, arg, pos in pickletools.genops(data):
        name = op.name
        before, after = op.stack_before, op.stack_after
        items: list[Any] = []
        if name == "MARK":
            stack.append(_MARK)
            continue
        if name == "POP" and stack and stack[-1] is _MARK:  # POP may drop a mark (pickle.py's load_pop)
            stack.pop()
            continue
        if pickletools.markobject in before:  # pops back to the newest mark (and what lies below it)
            if _MARK not in stack:
                raise ValueError(f"opcode {name} at byte {pos} finds no mark on the stack")
            k = len(stack) - 1 - stack[::-1].index(_MARK)
            items = stack[k + 1 :]
            del stack[k:]
            below = before.index(pickletools.markobject)
        else:
            below = len(before)
        if below:
            if len(stack) < below or any(v is _MARK for v in stack[-below:]):
                raise ValueError(f"opcode {name} at byte {pos} pops {below} item(s) from a stack of {len(stack)}")
            popped = stack[-below:]
            del stack[-below:]
        else:
            popped = []
        value: Any = None
        if name in _STRING_OPS or name in _INT_OPS:
            value = arg
        elif name == "GLOBAL":
            value = str(arg).replace(" ", ".", 1)
            names.append(value)
        elif name == "STACK_GLOBAL":
            mod, qual = popped
            value = f"{mod}.{qual}" if isinstance(mod, str) and isinstance(qual, str) else "<computed name>"
            names.append(value)
        elif name in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"):
            value = tuple(items if name == "TUPLE" else popped)
        elif name == "EMPTY_TUPLE":
            value = ()
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise ValueError(f"opcode {name} at byte {pos} reads memo slot {arg}, never written")
            value = memo[arg]
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):  # MEMOIZE pops and pushes its item, PUT peeks
            top = popped[-1] if popped else (stack[-1] if stack else _MARK)
            if top is _MARK:
                raise ValueError(f"opcode {name} at byte {pos} memoizes from an empty stack")
            memo[len(memo) if name == "MEMOIZE" else int(arg or 0)] = value = top
        elif name in ("BINPERSID", "PERSID"):
            pid = popped[0] if popped else arg
            if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[2], str):
                storages.append(pid[2])
        elif name == "STOP":
            if len(popped) != 1 or stack:
                raise ValueError(f"STOP at byte {pos} with {len(stack) + len(popped)} items on the stack, not 1")
            end = (pos or 0) + 1
            break
        stack.extend([value] + [None] * (len(after) - 1) if after else [])
    if end is None:
        raise ValueError("no STOP opcode: the pickle is truncated")
    return PickleScan(tuple(names), tuple(storages), len(data) - end)


def _outside_torch(names: Iterable[str]) -> list[str]:
    plain = ("torch.", "collections.", "builtins.", "_codecs.", "copyreg.")
    return sorted({n for n in names if not n.startswith(plain)})


def _name_list(names: list[str]) -> str:
    shown = ", ".join(names[:_NAMES_SHOWN])
    return shown + (f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else "")


def _scan_torch_zip(z: zipfile.ZipFile) -> tuple[str, str]:
    """(what the opcode read found, problem) for a torch.save zip whose CRCs passed."""
    pkls = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkls) != 1:
        return "", f"{len(pkls)} data.pkl members; a torch.save zip has exactly one"
    base = pkls[0][: -len("data.pkl")]
    try:
        scan = scan_pickle(z.read(pkls[0]))
    except ValueError as e:
        return "", f"{pkls[0]} is not a complete pickle: {e}"
    members = set(z.namelist())
    missing = sorted({k for k in scan.storages if f"{base}data/{k}" not in members})
    if missing:
        return "", f"its pickle names storage(s) absent from the zip: {_name_list([f'data/{k}' for k in missing])}"
    if scan.trailing:
        return "", f"{scan.trailing} bytes after the pickle's STOP opcode"
    outside = _outside_torch(scan.globals)
    what = f"names {_name_list(outside)}" if outside else "names only torch and builtin types"
    return f"{what}; {len(set(scan.storages))} storages present", ""


def _is_weights_only_refusal(e: Exception) -> bool:
    return isinstance(e, pickle.UnpicklingError) and "weights only" in str(e).lower()


def _refused_name(e: Exception) -> str:
    """The global torch's weights_only unpickler stopped at ("Unsupported global: GLOBAL x.y ...")."""
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
    return f"it refuses {m[1]}" if m else "it refuses the pickle"


def check_torch_zip(source: Path | IO[bytes], rel: str) -> FileCheck:
    """A torch.save zip: member CRCs, then torch.load(weights_only=True), or the opcode read where
    weights_only refuses the file or torch is not installed."""
    try:
        with zipfile.ZipFile(source) as z:
            bad = z.testzip()
            if bad is not None:
                return FileCheck(rel, "zip CRCs", f"zip member {bad} fails its CRC")
            opcodes, problem = _scan_torch_zip(z)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return FileCheck(rel, "zip CRCs", f"not a readable torch.save zip: {e}")
    if problem:
        return FileCheck(rel, "zip CRCs and pickle opcodes read, not executed", problem)
    if not has("torch"):
        return FileCheck(
            rel,
            f"zip CRCs; pickle opcodes read, not executed: {opcodes}; "
            "torch.load(weights_only=True) not run: torch is not installed on this worker",
            ran=False,
        )
    import torch

    if not isinstance(source, Path):
        source.seek(0)
    try:
        if isinstance(source, Path):
            torch.load(source, weights_only=True, map_location="cpu", mmap=True)
        else:
            torch.load(source, weights_only=True, map_location="cpu")
    except Exception as e:
        if _is_weights_only_refusal(e):
            return FileCheck(
                rel,
                f"zip CRCs; torch.load(weights_only=True): {_refused_name(e)}, so its pickle opcodes were read, "
                f"not executed: {opcodes}",
            )
        return FileCheck(rel, "zip CRCs; torch.load(weights_only=True)", f"torch.load(weights_only=True) fails: {e}")
    return FileCheck(rel, "zip CRCs; torch.load(weights_only=True)")


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


# --- the whole checkpoint ---------------------------------------------------------------------------------


def _check_file(path: Path, rel: str) -> FileCheck:
    name = path.name
    if name.endswith(".safetensors"):
        from ckptvault.restore.safetensors_check import check_safetensors  # needs FileCheck from here

        return check_safetensors(path, rel)
    if name.endswith(TORCH_SUFFIXES):
        if zipfile.is_zipfile(path):
            return check_torch_zip(path, rel)
        if name.endswith((".pt", ".ckpt")):
            return FileCheck(rel, "torch file", "not a zip-format torch file")
        return FileCheck(rel, "CRC32C only (not a torch.save zip; no load check for it)")
    if name.endswith(".json") or name in JSON_NAMES:
        try:
            json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            return FileCheck(rel, "JSON parsed", f"not valid JSON: {e}")
        return FileCheck(rel, "JSON parsed")
    return FileCheck(rel, "CRC32C only (no load check for this kind of file)")


def _units(root: Path, files: list[Path]) -> tuple[list[tuple[Path, str]], set[Path]]:
    """Directories checked as a whole, as (dir, kind), and the files they cover: a DCP directory's
    `.metadata` and `.distcp` files; everything under an Orbax item."""
    dirs = sorted({p.parent for p in files})
    units: list[tuple[Path, str]] = []
    for d in dirs:
        names = {p.name for p in files if p.parent == d}
        if DCP_METADATA in names and any(n.endswith(DCP_SUFFIX) for n in names):
            units.append((d, "dcp"))
        elif ORBAX_ITEM_METADATA in names:
            units.append((d, "orbax"))
    dcp = {d for d, kind in units if kind == "dcp"}
    orbax = [d for d, kind in units if kind == "orbax"]
    covered = {
        p
        for p in files
        if (p.parent in dcp and (p.name == DCP_METADATA or p.name.endswith(DCP_SUFFIX)))
        or any(d in p.parents for d in orbax)
    }
    return units, covered


def _rel(root: Path, p: Path, is_file_ckpt: bool) -> str:
    if is_file_ckpt:
        return p.name
    rel = PurePosixPath(p.relative_to(root).as_posix())
    return str(rel)


def check(ckpt_path: Path) -> LoadReport:
    """Every load check of the restored checkpoint `ckpt_path` (a directory or one file)."""
    if ckpt_path.is_file():
        return LoadReport((_check_file(ckpt_path, ckpt_path.name),))
    files = sorted(p for p in ckpt_path.rglob("*") if p.is_file())
    units, covered = _units(ckpt_path, files)
    checks: list[FileCheck] = []
    for d, kind in units:
        rel = (d.relative_to(ckpt_path).as_posix() + "/") if d != ckpt_path else "./"
        checks.append(check_dcp_dir(d, rel) if kind == "dcp" else check_orbax_item(d, rel))
    for p in files:
        if p not in covered:
            checks.append(_check_file(p, _rel(ckpt_path, p, False)))
    dangling = sorted({p.parent for p in files if p.name.endswith(DCP_SUFFIX)} - {d for d, k in units if k == "dcp"})
    for d in dangling:
        rel = (d.relative_to(ckpt_path).as_posix() + "/") if d != ckpt_path else "./"
        checks.append(FileCheck(rel, "DCP shards", f"{DCP_SUFFIX} shards without {DCP_METADATA}: they cannot load"))
    return LoadReport(tuple(sorted(checks, key=lambda c: c.path)))
