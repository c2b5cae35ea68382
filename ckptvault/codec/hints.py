"""Where a file's element size comes from when its own header declares it (ckptvault.codec.choose).

A byte shuffle groups the bytes of each element by position, so it needs the element size: 2 for
BF16/FP16, 4 for FP32. Read from the file's header, it is exact and costs no trial encodes:
- safetensors: the dtype holding most of the data bytes (the header's dtypes and offsets);
- a torch.save zip (`.pt`, `.bin`, DeepSpeed and Megatron shards...): the storages its `data.pkl`
  names, each `torch.<Dtype>Storage` weighed by its member's size in the zip. The pickle is read by
  its opcodes (ckptvault.formats._pickle): nothing is unpickled, imported or run;
- a DCP `__<rank>_<n>.distcp`: the dtypes of the items stored in it, which the `.metadata` beside it
  lists (ckptvault.formats.dcp.element_bytes, read by opcodes the same way), weighed by their lengths.
Anything else (raw shards, a zip whose pickle names no storage, a `.distcp` without a readable
`.metadata`) has no hint: the sampled trial decides.
"""

from __future__ import annotations

import functools
import json
import struct
import threading
import zipfile
from pathlib import Path

from ckptvault.formats import _pickle, dcp

# safetensors dtype -> bytes per element (the format's own list)
_ST_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "F4": 1,
    "F6_E2M3": 1,
    "F6_E3M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
_ST_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference reader's limit


def header_typesize(path: Path) -> int | None:
    """The element size the file's own header declares, or None (see header_hint)."""
    hint = header_hint(path)
    return hint[0] if hint is not None else None


def header_hint(path: Path) -> tuple[int, str] | None:
    """(element size holding most of the file's data bytes, which header said so), or None."""
    if path.suffix == ".safetensors":
        ts = _safetensors(path)
        return (ts, "safetensors header") if ts is not None else None
    if path.suffix == dcp.SUFFIX:
        ts = _distcp(path)
        return (ts, "DCP metadata") if ts is not None else None
    ts = _torch_zip(path)
    return (ts, "torch storages") if ts is not None else None


def _heaviest(weight: dict[int, int]) -> int | None:
    return max(weight, key=lambda t: weight[t]) if weight else None


def _safetensors(path: Path) -> int | None:
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if n > _ST_MAX_HEADER:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # the structural check reports a broken header; here it only means "no hint"
    if not isinstance(header, dict):
        return None
    weight: dict[int, int] = {}
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        ts = _ST_SIZES.get(str(info.get("dtype")))
        offsets = info.get("data_offsets")
        if ts is None or not isinstance(offsets, list) or len(offsets) != 2:
            continue
        try:
            weight[ts] = weight.get(ts, 0) + max(0, int(offsets[1]) - int(offsets[0]))
        except (TypeError, ValueError):
            continue
    return _heaviest(weight)


def _torch_zip(path: Path) -> int | None:
    try:
        if not zipfile.is_zipfile(path):
            return None
        with zipfile.ZipFile(path) as z:
            pkls = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if len(pkls) != 1:
                return None
            prefix = pkls[0][: -len("data.pkl")]
            sizes = {i.filename: i.file_size for i in z.infolist()}
            weight: dict[int, int] = {}
            for cls, key in dict.fromkeys(_pickle.storages(z, pkls[0])):  # a storage shared by tensors: once
                ts, n = _pickle.element_size(cls), sizes.get(f"{prefix}data/{key}")
                if ts is not None and n is not None:
                    weight[ts] = weight.get(ts, 0) + n
    except Exception:  # a hint only: a torn or hostile zip or pickle must never fail the upload
        return None  # not a zip we can read: no hint, the trial decides (the drill reports a broken one)
    return _heaviest(weight)


# Uploads ask from parallel threads: one reads `.metadata` while the others wait for its answer
_DCP_LOCK = threading.Lock()


def _distcp(path: Path) -> int | None:
    meta = path.parent / dcp.METADATA
    try:
        st = meta.stat()
    except OSError:
        return None
    if st.st_size > dcp.MAX_METADATA:  # from stat, before any open: the trial decides
        return None
    with _DCP_LOCK:
        by_file = _dcp_element_bytes(str(meta), st.st_mtime_ns, st.st_size)
    return _heaviest(by_file.get(path.name, {}))


@functools.lru_cache(maxsize=4)  # every .distcp of a save asks about the one .metadata: read it once
def _dcp_element_bytes(meta: str, _mtime_ns: int, _size: int) -> dict[str, dict[int, int]]:
    try:
        return dcp.element_bytes(Path(meta))
    except Exception:  # a hint only, as for a zip: a torn or hostile .metadata means no hint, remembered,
        return {}  # so its parse (seconds for a large one) is not repeated for each .distcp of the save
