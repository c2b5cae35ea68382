"""Structural checks that need no training framework and never read a file's bulk data.

Each check reads at most a header (safetensors) or a zip central directory (torch.save files), so a
whole checkpoint is checked in milliseconds before its bytes are read once for upload. Every problem
is reported, not just the first, each naming the file (relative path), what is wrong and what was
expected.
"""

from __future__ import annotations

import json
import posixpath
import struct
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckptvault.checkpoint.local_files import LocalFile

SAFETENSORS_MAX_HEADER = 100 << 20  # the reference implementation refuses larger headers too
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
INDEX_SUFFIX = ".index.json"
ZIP_MAGIC = b"PK\x03\x04"
PICKLE_MAGIC = b"\x80"  # legacy (non-zip) torch.save files start with a pickle protocol opcode


def _safetensors_tensor(rel: str, name: str, info: Any) -> tuple[list[str], int]:
    """Problems with one header entry and the end of its data."""
    if not isinstance(info, dict) or not isinstance(info.get("data_offsets"), list) or len(info["data_offsets"]) != 2:
        return [f"{rel}: tensor {name!r} has no valid data_offsets [begin, end] in the header"], 0
    begin, end = info["data_offsets"]
    if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
        return [f"{rel}: tensor {name!r} has data_offsets {info['data_offsets']}; expected 0 <= begin <= end"], 0
    width = DTYPE_BYTES.get(str(info.get("dtype")))
    shape = info.get("shape")
    if width is not None and isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
        numel = 1
        for d in shape:
            numel *= d
        if numel * width != end - begin:
            return [
                f"{rel}: tensor {name!r} ({info['dtype']} {shape}) needs {numel * width} bytes "
                f"but its data_offsets span {end - begin}"
            ], end
    return [], end


def check_safetensors(path: Path, rel: str, size: int) -> list[str]:
    if size < 8:
        return [f"{rel}: {size} bytes, too short for a safetensors file (8-byte header length expected)"]
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > SAFETENSORS_MAX_HEADER or 8 + header_len > size:
            return [
                f"{rel}: header length field says {header_len} bytes but the file has {size} "
                "(truncated, or not a safetensors file)"
            ]
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        return [f"{rel}: safetensors header is not valid JSON ({e})"]
    if not isinstance(header, dict):
        return [f"{rel}: safetensors header is a {type(header).__name__}; expected a JSON object"]
    problems: list[str] = []
    data_end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        found, end = _safetensors_tensor(rel, name, info)
        problems += found
        data_end = max(data_end, end)
    expected = 8 + header_len + data_end
    if expected > size:
        problems.append(
            f"{rel}: truncated: the header describes {expected} bytes but the file has {size} "
            f"({expected - size} bytes missing)"
        )
    elif expected < size:
        problems.append(f"{rel}: {size - expected} extra bytes after the last tensor (expected size {expected})")
    return problems


def check_torch_file(path: Path, rel: str, size: int) -> list[str]:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != ZIP_MAGIC:
        if magic.startswith(PICKLE_MAGIC) or rel.endswith(".bin"):
            return []  # a legacy torch.save pickle (nothing cheap to check), or a `.bin` of another kind
        return [f"{rel}: neither a torch.save zip (PK\\x03\\x04) nor a legacy pickle (starts with {magic!r})"]
    try:
        with zipfile.ZipFile(path) as zf:  # reads only the end record and central directory
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        return [f"{rel}: torch.save zip central directory cannot be read ({e}); truncated or corrupt"]
    problems = []
    for info in infos:
        # local header (30 bytes + name) plus stored data must fit before the end of the file
        end = info.header_offset + 30 + len(info.filename.encode()) + info.compress_size
        if end > size:
            problems.append(f"{rel}: zip entry {info.filename} ends at byte {end}, past the file size {size}")
    if infos and not any(i.filename.endswith("data.pkl") for i in infos):
        problems.append(f"{rel}: zip has no */data.pkl entry; not a torch.save archive")
    return problems


def check_index(path: Path, rel: str, present: set[str]) -> list[str]:
    try:
        doc = json.loads(path.read_bytes())
        weight_map = doc["weight_map"]
        shards = sorted({str(v) for v in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return [f"{rel}: cannot read its weight_map ({type(e).__name__}: {e}); expected JSON with a weight_map"]
    base = posixpath.dirname(rel)
    return [
        f"{rel}: names shard {shard}, which is missing from the checkpoint"
        for shard in shards
        if posixpath.join(base, shard) not in present
    ]


def _check_file(f: LocalFile, present: set[str]) -> list[str]:
    if f.size == 0:
        return [f"{f.rel}: zero-byte file; every checkpoint file should hold data"]
    name = f.rel.rsplit("/", 1)[-1]
    try:
        if name.endswith(".safetensors"):
            return check_safetensors(f.path, f.rel, f.size)
        if name.endswith(TORCH_SUFFIXES):
            return check_torch_file(f.path, f.rel, f.size)
        if name.endswith(INDEX_SUFFIX):
            return check_index(f.path, f.rel, present)
    except OSError as e:
        return [f"{f.rel}: cannot be read ({e.strerror})"]
    return []


def _check_dcp_dirs(present: set[str]) -> list[str]:
    """Every directory holding `.distcp` shards needs its `.metadata` (DCP, NeMo weights/, Megatron
    torch_dist): without it the shards cannot be loaded."""
    dirs = {posixpath.dirname(rel) for rel in present if rel.endswith(".distcp")}
    return [
        f"{d or '.'}/: has .distcp shards but no .metadata (expected {posixpath.join(d, '.metadata')})"
        for d in sorted(dirs)
        if posixpath.join(d, ".metadata") not in present
    ]


def check_structure(fmt: str, ckpt_path: Path, files: Sequence[LocalFile]) -> list[str]:
    """Every structural problem in one checkpoint (empty list = structurally sound)."""
    return check_names(fmt, ckpt_path, files, readable=files)


def check_names(
    fmt: str, ckpt_path: Path, files: Sequence[LocalFile], readable: Sequence[LocalFile]
) -> list[str]:
    """The checks over the whole checkpoint's names and sizes, plus the per-file checks of the files
    this process can read (`readable`: all of them, or for a node-local source those its own node
    holds; the other nodes check their own: ckptvault.ingest.nodes.list_node)."""
    present = {f.rel for f in files}
    problems: list[str] = []
    if not files:
        problems.append(f"{ckpt_path}: checkpoint has no files")
    for f in readable:
        problems += _check_file(f, present)
    problems += _check_dcp_dirs(present)
    if fmt == "dcp" and ".metadata" not in present and not any(r.endswith(".distcp") for r in present):
        problems.append(".metadata: missing; a DCP checkpoint is unreadable without it")
    return problems
