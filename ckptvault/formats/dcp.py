"""PyTorch Distributed Checkpoint (DCP, torchtitan): a directory of `__<rank>_<n>.distcp` files.

The commit rule is torch's: `torch/distributed/checkpoint/filesystem.py`, `FileSystemWriter.finish`
(torch 2.13), runs on the coordinator after every rank's `write_data` has returned its results (the
gather in `state_dict_saver._save_state_dict`), writes `.metadata.tmp` and renames it to `.metadata`.
So `.metadata` is the commit marker: a step directory without it holds shards that cannot load.

Where: the run root itself (`dcp.save(..., checkpoint_id=<root>/step-<N>)`), or torchtitan's default,
`<job.dump_folder>/<checkpoint.folder>/step-<N>` with `folder = "checkpoint"` (torchtitan
docs/checkpoint.md, `CheckpointManager` in torchtitan/components/checkpoint.py): a source may point at
the dump folder, and its `checkpoint/` is searched too.

`element_bytes` reads which dtypes each `.distcp` file holds out of `.metadata`, for the codec's element
size (ckptvault.codec.hints). `.metadata` is `pickle.dump(Metadata)` (filesystem.py `finish`): dataclasses
whose fields are BUILD state, read by opcodes (ckptvault.formats._pickle), never unpickled.
"""

from __future__ import annotations

import io
import pickletools
import posixpath
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckptvault.formats import _fs, _pickle
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^(?:step[-_])?(\d+)$")
METADATA = ".metadata"
SUFFIX = ".distcp"
TORCHTITAN_FOLDER = "checkpoint"
SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")  # __<rank>_<file of that rank>.distcp
# A larger .metadata is not read for a hint (the trial decides): the opcode reader takes ~6 CPU s and
# ~25 MiB per MiB of it (bench/README.md); 700 tensors on 16 ranks (11,200 chunks) is 1.7 MB.
MAX_METADATA = 2 * 1024 * 1024
_MD = "torch.distributed.checkpoint.metadata."
_FS = "torch.distributed.checkpoint.filesystem."


def _roots(root: Path) -> list[Path]:
    sub = root / TORCHTITAN_FOLDER
    return [root, sub] if sub.is_dir() else [root]


def judge_dcp_dir(path: Path) -> tuple[bool, str]:
    """Completeness of one DCP directory (also used for NeMo's `weights/`)."""
    present = _fs.names(path)
    if METADATA in present:
        return True, ""
    if METADATA + ".tmp" in present:
        return False, ".metadata.tmp present: the coordinator has not renamed it to .metadata yet"
    return False, "no .metadata yet (written last, after every rank's .distcp file)"


def rank_gaps(rels: Iterable[str]) -> list[str]:
    """The ranks without a shard in a directory of `.distcp` files, by name (`rels`: paths inside the
    checkpoint): `DIR/__R_*.distcp` for each R in 0..max that has none. torch's FileSystemWriter
    (single_file_per_rank, the default) writes at least one file per rank, empty or not. A missing
    *last* rank leaves no gap (`.metadata` names it, but it is a pickle, not read here). Used over a
    node-local checkpoint's merged names, where `.metadata` on node 0 says nothing of the others' disks."""
    ranks: dict[str, set[int]] = {}
    for rel in rels:
        d, name = posixpath.split(rel)
        if m := SHARD.match(name):
            ranks.setdefault(d, set()).add(int(m[1]))
    return [
        posixpath.join(d, f"__{r}_*{SUFFIX}") for d, have in sorted(ranks.items()) for r in range(max(have) + 1)
        if r not in have
    ]  # fmt: skip


def _fields(obj: Any, cls: str) -> dict[str, Any]:
    """The fields of a pickled dataclass `cls` (its BUILD state); ValueError if `obj` is not one."""
    if isinstance(obj, _pickle.Call) and obj.func == _pickle.Global(cls) and isinstance(obj.state, dict):
        return obj.state
    raise ValueError(f"not a {cls}: a {type(obj).__name__}")  # not its repr: exponential for shared lists


def _dtype(props: Any) -> Any:
    """TensorProperties' dtype: its `__getstate__` is (dtype, layout, requires_grad, memory format,
    pin_memory) in torch 2.x; a dict of fields is read as well."""
    state = props.state if isinstance(props, _pickle.Call) else None
    if isinstance(state, tuple) and state:
        return state[0]
    return state.get("dtype") if isinstance(state, dict) else None


def element_bytes(metadata: Path) -> dict[str, dict[int, int]]:
    """{data file's relative path: {element size: bytes of the tensors of that size stored in it}} from a
    DCP `.metadata` (`Metadata.state_dict_metadata` gives each item's dtype, `storage_data` maps each
    chunk to `_StorageInfo(relative_path, offset, length)`). Bytes items (pickled objects) and chunks a
    DCP extension transformed (`transform_descriptors`: compressed, not the tensor's bytes) are left
    out. ValueError (or any error of a garbled pickle) if it is not the Metadata torch writes."""
    with metadata.open("rb") as f:
        raw = f.read(MAX_METADATA + 1)  # read whole: genops is faster on bytes than on a file
    if len(raw) > MAX_METADATA:
        raise ValueError(f"{metadata} is over {MAX_METADATA} bytes")
    md = _fields(_pickle.read(raw), _MD + "Metadata")
    sizes: dict[str, int] = {}
    for fqn, item in dict(md["state_dict_metadata"]).items():
        if isinstance(item, _pickle.Call) and item.func == _pickle.Global(_MD + "TensorStorageMetadata"):
            ts = _pickle.dtype_size(_dtype(_fields(item, _MD + "TensorStorageMetadata").get("properties")))
            if ts is not None:
                sizes[fqn] = ts
    out: dict[str, dict[int, int]] = {}
    for index, info in dict(md["storage_data"]).items():
        chunk = _fields(info, _FS + "_StorageInfo")
        fqn = _fields(index, _MD + "MetadataIndex").get("fqn")
        ts = sizes.get(fqn) if isinstance(fqn, str) else None
        path, length = chunk.get("relative_path"), chunk.get("length")
        if ts is None or chunk.get("transform_descriptors") or not isinstance(path, str) or not isinstance(length, int):
            continue
        weight = out.setdefault(path, {})
        weight[ts] = weight.get(ts, 0) + length
    return out


# `Metadata.version` (torch >= 2.5: filesystem.py's CURRENT_DCP_VERSION, set by FileSystemWriter.finish).
# torch's own writer pickles it as the dataclass's last field; megatron-core's writer adds fields after it
# (`all_local_plans`, as large as the plans). So the file's bytes are searched for the field's key, and
# the opcodes from there must be that key, a string, then the next field's name or the end of the
# fields: a fast byte search, not a walk of the pickle (a 1.7 MB .metadata would take seconds to walk).
MAX_VERSION_SCAN = 64 << 20  # a larger .metadata is not searched for its version
_VERSION_KEY = (b"\x8c\x07version", b"X\x07\x00\x00\x00version")  # SHORT_BINUNICODE, BINUNICODE 'version'
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_QUIET = {"BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE", "FRAME"}  # no change to what follows
_AFTER = _STRINGS | {"BINGET", "LONG_BINGET", "GET", "SETITEMS", "SETITEM"}  # a field's name, or the end


def _version_at(data: bytes, at: int) -> str | None:
    """The string value of the `version` key whose opcode starts at byte `at`, if the opcodes from there
    read as a field of the Metadata's dict (key, string value, then a name or the dict's end)."""
    ops: list[tuple[str, object]] = []
    stream = io.BytesIO(data)
    stream.seek(at)
    try:
        for op, arg, _ in pickletools.genops(stream):
            if op.name not in _QUIET:
                ops.append((op.name, arg))
            if len(ops) == 3:
                break
    except (ValueError, EOFError):
        return None
    if len(ops) < 3 or ops[0][1] != "version" or ops[1][0] not in _STRINGS or ops[2][0] not in _AFTER:
        return None
    value = ops[1][1]
    return value if isinstance(value, str) and value else None


def format_version(metadata: Path) -> str | None:
    """The DCP format version a `.metadata` records (`Metadata.version`, e.g. "1.0.0"): its first bytes
    must name torch's Metadata class, and the last `version` key that reads as a field of it (see
    above) gives it; None otherwise (older torch wrote no version, a writer that left it None, a file
    over MAX_VERSION_SCAN bytes, or not torch's Metadata)."""
    try:
        with metadata.open("rb") as f:
            data = f.read(MAX_VERSION_SCAN + 1)
    except OSError:
        return None
    head = data[:256]
    if (
        len(data) > MAX_VERSION_SCAN
        or _MD.rstrip(".").encode() not in head.replace(b" ", b".")
        or b"Metadata" not in head
    ):
        return None
    for key in _VERSION_KEY:
        end = len(data)
        while (at := data.rfind(key, 0, end)) >= 0:
            if (v := _version_at(data, at)) is not None:
                return v
            end = at
    return None


def read_written_by(ckpt: Path) -> dict[str, str]:
    """`{"torch.dcp": version}`: the DCP format version of the checkpoint's `.metadata` (not torch's
    version, which DCP does not record); {} when it records none."""
    v = format_version(ckpt / METADATA)
    return {"torch.dcp": v} if v else {}


class DCPLayout:
    name = "dcp"

    def candidates(self, root: Path) -> list[Candidate]:
        out = []
        for r in _roots(root):
            out += _fs.step_dirs(self.name, r, NAME, lambda e, _step: judge_dcp_dir(Path(e.path)))
        return sorted(out, key=lambda c: (c.step, c.path.name))

    def matches(self, root: Path) -> bool:
        for r in _roots(root):
            for e in _fs.entries(r):
                named = NAME.match(_fs.strip_temp(e.name)) and _fs.is_dir(e)
                if named and _fs.has_suffix_in(Path(e.path), SUFFIX):
                    return True
        return False

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return None


LAYOUT = DCPLayout()
