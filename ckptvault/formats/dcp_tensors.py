"""Which bytes of a torch DCP checkpoint's `.distcp` files hold which tensors, from its `.metadata`, and
which of those tensors are the model's: what a tensor-level `restore --only model|optimizer` and
`--only-keys PREFIX` fetch (ckptvault/restore/tensors.py).

`.metadata` is `pickle.dump(Metadata)` (torch/distributed/checkpoint/filesystem.py `finish`):
`state_dict_metadata` maps each fully-qualified name (FQN: DCP flattens nested dicts with dots, so
`{"model": {"0.weight": t}}` is `model.0.weight`) to a TensorStorageMetadata or a BytesStorageMetadata
(a pickled object), and `storage_data` maps each chunk (`MetadataIndex(fqn, offset, index)`) to
`_StorageInfo(relative_path, offset, length)`: where its bytes sit in which file, relative to the
`.metadata`'s directory. Read without constructing anything it names: by opcodes (`_pickle.read`) up to
MAX_OPCODES, above that (where the opcode reader takes ~6 CPU s per MiB) by the C unpickler with a
stand-in for every class (`_pickle.read_fast`), in a child process (bench/README.md has both speeds).

Model vs optimizer, from the frameworks' own keys: the top-level names of the training state beside
the model (TRAINING_KEYS) are the optimizer's part; every other FQN is the model's.
- torchtitan (torchtitan/components/checkpoint.py, `CheckpointManager`): its state dict holds
  `optimizer`, `lr_scheduler`, `dataloader` and `train_state` beside the model, whose keys it flattens
  to the top level (`_flattened_model_states_sd`: `tok_embeddings.weight`, `layers.0...`); a plain
  `{"model": ..., "optimizer": ...}` save keeps `model.` as a prefix. Both are the model's here.
- Megatron-core `torch_dist` (megatron/core/optimizer: `optimizer.state.<moment>.<param>`,
  `optimizer.distributed.dp_group_idx_N...`) and NeMo 2's `weights/`: the optimizer's ShardedTensors
  are keyed `optimizer.*`, the model's by the module's own names (`decoder.layers...`,
  `module.decoder...`, the test writer's `model.0.weight`); `rng_state` is Megatron's RNG state.
A key no rule names goes with the model, as a file no rule names does (ckptvault/formats/parts.py):
a model restore may bring back a few bytes it did not need, never leave out what a model load reads
(Transformer Engine's `_extra_state` objects are the model's).
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptvault.formats import _pickle
from ckptvault.formats.dcp import _FS, _MD, MAX_METADATA

# The training state's top-level keys: torchtitan's OPTIMIZER, LR_SCHEDULER, DATALOADER, TRAIN_STATE;
# Megatron's `optimizer.*` and `rng_state`.
TRAINING_KEYS = frozenset({"optimizer", "lr_scheduler", "dataloader", "train_state", "rng_state"})
_TOP = re.compile(r"[./]")
MAX_OPCODES = MAX_METADATA  # up to here the opcode reader (no C unpickler on a file's bytes at all)
MAX_FAST = 1 << 30  # a larger .metadata is refused: its chunks would not fit a restore's memory anyway


@dataclass(frozen=True)
class Chunk:
    """One stored chunk of one item: bytes [offset, offset + length) of `path` (relative to the
    `.metadata`'s directory)."""

    fqn: str
    tensor: bool  # a tensor's bytes; False: a pickled object's (BytesStorageMetadata)
    path: str
    offset: int
    length: int


def part_of(fqn: str) -> str:
    """`model` or `optimizer`: the part an FQN belongs to (see the module's docstring)."""
    # a Megatron ShardedObject's item is `<key>/shard_<offsets>_<shape>` (`rng_state/shard_0.0_1.1`)
    return "optimizer" if _TOP.split(fqn, 1)[0] in TRAINING_KEYS else "model"


def key_matches(prefix: str, fqn: str) -> bool:
    """`--only-keys PREFIX`: the FQN itself or one below it (`model.0` selects `model.0.weight`, not
    `model.01.weight`); a prefix ending in `.` selects below it only."""
    if prefix.endswith("."):
        return fqn.startswith(prefix)
    return fqn == prefix or fqn.startswith(prefix + ".")


def _state(obj: Any, cls: str) -> dict[str, Any]:
    """The fields of a pickled dataclass `cls`, as either reader gives it: BUILD's dict, or (dict, slots)
    where the class has __slots__. ValueError if `obj` is not one."""
    if isinstance(obj, _pickle.Call) and obj.func == _pickle.Global(cls):
        state = obj.state
    elif isinstance(obj, _pickle.Obj) and obj.name == cls:
        state = obj.__dict__  # the C unpickler set both halves of a (dict, slots) state as attributes
    else:
        raise ValueError(f"not a {cls}")
    if isinstance(state, tuple) and len(state) == 2:
        state = {**(state[0] or {}), **(state[1] or {})}
    if not isinstance(state, dict):
        raise ValueError(f"not a {cls}")
    return state


def _is(obj: Any, cls: str) -> bool:
    return (isinstance(obj, _pickle.Call) and obj.func == _pickle.Global(cls)) or (
        isinstance(obj, _pickle.Obj) and obj.name == cls
    )


def chunks(metadata: Path) -> list[Chunk]:
    """Every stored chunk the `.metadata` at `metadata` records, in its order. ValueError naming the
    file if it is not the Metadata torch writes, or is over MAX_FAST bytes. Up to MAX_OPCODES bytes
    by opcodes in this process; above, by the C unpickler with stand-ins in a child process (`_child`):
    a hostile pickle that nests a dict key deep enough to overflow the C stack (or takes all memory)
    ends that child, not the restore, which refuses the file."""
    size = metadata.stat().st_size
    if size > MAX_FAST:
        raise ValueError(f"{metadata.name} has {size} bytes, over the {MAX_FAST} this reader takes")
    if size > MAX_OPCODES:
        return _in_child(metadata)
    return _chunks(_pickle.read(metadata.read_bytes()), metadata.name)


def _chunks(root: Any, name: str) -> list[Chunk]:
    try:
        md = _state(root, _MD + "Metadata")
        tensors = {fqn for fqn, item in dict(md["state_dict_metadata"]).items() if _is(item, _TSM)}
        out: list[Chunk] = []
        for index, info in dict(md["storage_data"]).items():
            fqn = _state(index, _MD + "MetadataIndex").get("fqn")
            where = _state(info, _FS + "_StorageInfo")
            path, offset, length = where.get("relative_path"), where.get("offset"), where.get("length")
            if not (isinstance(fqn, str) and isinstance(path, str) and isinstance(offset, int)
                    and isinstance(length, int)) or offset < 0 or length < 0:  # fmt: skip
                raise ValueError(f"a chunk of {fqn!r} has no file, offset or length")
            out.append(Chunk(fqn, fqn in tensors, path, offset, length))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{name} is not the Metadata torch writes ({e})") from None
    return out


_TSM = _MD + "TensorStorageMetadata"
CHILD_TIMEOUT_S = 600.0


def _in_child(metadata: Path) -> list[Chunk]:
    try:
        proc = subprocess.run([sys.executable, "-m", "ckptvault.formats.dcp_tensors", str(metadata)],
                              capture_output=True, timeout=CHILD_TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ValueError(f"{metadata.name} took over {CHILD_TIMEOUT_S:.0f} s to read") from None
    except OSError as e:
        raise ValueError(f"{metadata.name}: its reader could not start ({e})") from None
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise ValueError(f"{metadata.name} could not be read: {said[0]}")
    return [Chunk(str(f), bool(t), str(p), int(o), int(n)) for f, t, p, o, n in json.loads(proc.stdout)]


def _child(path: str) -> None:
    """`python -m ckptvault.formats.dcp_tensors FILE`: its chunks as JSON on stdout (what `_in_child` reads)."""
    p = Path(path)
    got = _chunks(_pickle.read_fast(p.read_bytes()), p.name)
    json.dump([[c.fqn, c.tensor, c.path, c.offset, c.length] for c in got], sys.stdout)


def coalesce(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) spans merged where they touch or overlap, in offset order; empty ones dropped."""
    out: list[tuple[int, int]] = []
    for off, n in sorted(s for s in spans if s[1] > 0):
        if out and off <= out[-1][0] + out[-1][1]:
            start, length = out[-1]
            out[-1] = (start, max(length, off + n - start))
        else:
            out.append((off, n))
    return out


@dataclass(frozen=True)
class Picked:
    """The chunks a selection takes from one DCP directory's files."""

    ranges: dict[str, list[tuple[int, int]]]  # data file (relative to the .metadata's directory) -> spans
    items: int  # items (tensors and objects) selected
    of_items: int
    tensors: int  # of them tensors
    of_tensors: int


def pick(all_chunks: Sequence[Chunk], parts: Iterable[str], prefixes: Iterable[str]) -> Picked:
    """The coalesced spans of every chunk whose FQN is in one of `parts` (model, optimizer) or under one
    of `prefixes`, per file."""
    want_parts, want_keys = set(parts), list(prefixes)
    spans: dict[str, list[tuple[int, int]]] = {}
    items, tensors, chosen, chosen_tensors = set(), set(), set(), set()
    for c in all_chunks:
        items.add(c.fqn)
        if c.tensor:
            tensors.add(c.fqn)
        if part_of(c.fqn) in want_parts or any(key_matches(p, c.fqn) for p in want_keys):
            spans.setdefault(c.path, []).append((c.offset, c.length))
            chosen.add(c.fqn)
            if c.tensor:
                chosen_tensors.add(c.fqn)
    return Picked({p: coalesce(s) for p, s in spans.items()}, len(chosen), len(items), len(chosen_tensors),
                  len(tensors))  # fmt: skip


if __name__ == "__main__":  # the child of `_in_child`
    try:
        _child(sys.argv[1])
    except (OSError, ValueError) as e:
        print(e, file=sys.stderr)
        sys.exit(1)


def part_bytes(root: Path, fmt: str, files: Sequence[tuple[str, int]]) -> dict[str, int] | None:
    """`{"model": BYTES, "optimizer": BYTES}` of a DCP-layout save on disk at `root` (`files`: its relative
    paths and sizes): each `.distcp` split by its items' lengths, read from the `.metadata` beside it
    (`part_of`, as `restore --only` splits it), every other file classed by its name (formats/parts.py).
    None when there is no `.distcp`, a `.distcp` has no readable `.metadata` beside it, or its items'
    lengths do not add up to its size (bytes no item names: which part they are is not known)."""
    # here, not at the module's top: parts imports this module
    from ckptvault.formats.parts import Part, classify

    out = {"model": 0, "optimizer": 0}
    by_dir: dict[str, list[tuple[str, int]]] = {}
    rest: list[tuple[str, int]] = []
    for path, size in files:
        (by_dir.setdefault(posixpath.dirname(path), []) if path.endswith(".distcp") else rest).append((path, size))
    if not by_dir:  # not a DCP layout: events.parts classes its files from the manifest's paths
        return None
    for d, data in by_dir.items():
        try:
            found = chunks(root / d / ".metadata")
        except (OSError, ValueError):
            return None
        lengths: dict[str, dict[str, int]] = {}
        for c in found:
            per = lengths.setdefault(c.path, {"model": 0, "optimizer": 0})
            per[part_of(c.fqn)] += c.length
        for path, size in data:
            per = lengths.get(posixpath.basename(path), {"model": 0, "optimizer": 0})
            if sum(per.values()) != size:
                return None
            for k, v in per.items():
                out[k] += v
    for cls, (_, size) in zip(classify(fmt, [p for p, _ in rest]), rest, strict=True):
        if cls.part is Part.MIXED:
            return None
        out[cls.part.value] += size
    return out
