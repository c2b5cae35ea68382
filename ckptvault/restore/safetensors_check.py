"""The drill's load check of a `*.safetensors` file: every tensor read in full (ckptvault.restore.loadcheck)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ckptvault.restore.load_result import FileCheck, has

# Dtypes numpy has no type for: safetensors' numpy reader refuses them ("data type 'bfloat16' not
# understood"), so a healthy BF16 model would fail its drill. Their bytes are read raw instead; the
# header that places them was validated by safe_open (offsets inside the file, sizes matching shapes).
_NUMPY_LACKS = frozenset({"BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"})


def check_safetensors(path: Path, rel: str) -> FileCheck:
    if not (has("safetensors") and has("numpy")):
        return _check_without_safetensors(path, rel)
    from safetensors import safe_open

    try:
        n = 0
        raw: list[str] = []
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if f.get_slice(name).get_dtype() in _NUMPY_LACKS:
                    raw.append(name)
                else:
                    f.get_tensor(name)  # a full read of every tensor: the proof that it loads
                n += 1
        if raw:
            _read_raw_tensors(path, raw)
    except Exception as e:
        return FileCheck(rel, "safetensors: every tensor read", f"safetensors does not load: {e}")
    how = f"; {len(raw)} of a dtype numpy lacks (BF16, FP8) read as bytes" if raw else ""
    return FileCheck(rel, f"safetensors: every tensor read ({n}{how})")


def _read_raw_tensors(path: Path, names: list[str]) -> None:
    """Read every byte of the named tensors, streaming, from where the header places them."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        for name in names:
            start, end = (int(x) for x in header[name]["data_offsets"])
            f.seek(8 + n + start)
            left = end - start
            while left > 0:
                got = len(f.read(min(left, 8 << 20)))
                if not got:
                    raise ValueError(f"tensor {name} ends past the end of the file")
                left -= got


def _check_without_safetensors(path: Path, rel: str) -> FileCheck:
    """Where safetensors is not installed (a drill worker, or `drill --python`'s other environment): the
    header parsed and every tensor's bytes read where it places them, and the check says that safetensors'
    own load did not run (never a silent pass)."""
    how = "safetensors header parsed and every tensor's bytes read; safetensors' load not run: not installed here"
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        names = [k for k in header if k != "__metadata__"]
        _read_raw_tensors(path, names)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        return FileCheck(rel, how, f"safetensors header or data does not read: {e}", ran=False)
    return FileCheck(rel, f"{how} ({len(names)} tensors)", ran=False)
