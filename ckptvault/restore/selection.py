"""A partial restore's choice of files: `--only model|optimizer|PATTERN` (repeatable, their union) and
`--exclude PATTERN` (repeatable, taken out after), applied to a save's manifest before anything is
planned, thawed or fetched, so the estimate, the thaw and the transfer all cover the part alone.

`model` and `optimizer` are the layout's own split (ckptvault/formats/parts.py). Where the layout keeps
both in one file (a Lightning .ckpt, a ZeRO-3 partition), asking for either is refused naming the
format, the file and why: never a silent full restore. A torch DCP `.distcp` file (dcp, Megatron
`torch_dist`, NeMo 2) is split by its tensors instead (`by_tensor`: ckptvault/restore/tensors.py,
formats/dcp_tensors.py), as is every `.distcp` for `--only-keys PREFIX` (repeatable: FQN prefixes).
A PATTERN is a glob on the manifest's relative paths (`*` also crosses `/`); one without a `/` also
matches a file's name alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import PurePosixPath
from typing import Any

from ckptvault.checkpoint.blocks import FileBlocks
from ckptvault.checkpoint.manifest import FileEntry, Manifest
from ckptvault.restore.copies import CopyStatus
from ckptvault.restore.resolve import RestoreError

PARTS = ("model", "optimizer")
# Written at the root of a partial restore's destination, beside the checkpoint: what was left out
MARKER = "ckptvault-partial.json"
# The node-local protocol restores whole saves only (the command line refuses it first, the flow here)
NODE_LOCAL_REFUSED = "--only/--only-keys/--exclude with --node-local is not supported yet: restore the whole save"


class SelectionError(RestoreError):
    """The selection cannot be served as asked (bad input: exit 2, nothing touched)."""


@dataclass(frozen=True)
class Selection:
    """What `--only` and `--exclude` asked for; empty: the whole save."""

    only: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    only_keys: tuple[str, ...] = ()  # FQN prefixes of a DCP checkpoint's items (tensor level)

    @property
    def whole(self) -> bool:
        return not self.only and not self.exclude and not self.only_keys

    def describe(self) -> str:
        said = [f"--only {o}" for o in self.only] + [f"--only-keys {k}" for k in self.only_keys]
        return " ".join(said + [f"--exclude {e}" for e in self.exclude])


def parse_selection(
    only: Sequence[str] | None, exclude: Sequence[str] | None, only_keys: Sequence[str] | None = None
) -> Selection:
    """The flags (or the flow's parameters) as a Selection; SelectionError on an empty pattern."""
    for flag, values in (("--only", only or ()), ("--exclude", exclude or ())):
        for v in values:
            if not v.strip():
                raise SelectionError(f"{flag} needs a part (model, optimizer) or a glob pattern, not an empty string")
    for k in only_keys or ():
        if not k.strip(".").strip():
            raise SelectionError(f"--only-keys needs a key prefix such as model.layers.0, not {k!r}")
    return Selection(tuple(only or ()), tuple(exclude or ()), tuple(only_keys or ()))


# The formats whose .distcp files are torch DCP's, split by their tensors (formats/dcp_tensors.py)
TENSOR_FORMATS = frozenset({"dcp", "megatron", "nemo"})
DISTCP = ".distcp"


def block_spans(blocks: FileBlocks, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The whole blocks around `ranges` ((offset, length), in order) as [start, end) spans, merged where
    they touch: each block is read once however many ranges it serves."""
    out: list[tuple[int, int]] = []
    for off, n in ranges:
        if n < 1:
            continue
        s, e = blocks.span(off, n)
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


@dataclass(frozen=True)
class TensorFile:
    """One .distcp file of a tensor-level selection: the (offset, length) spans written, coalesced."""

    path: str
    ranges: tuple[tuple[int, int], ...]
    size: int
    # the file's verified block CRC32Cs (checkpoint/blocks.py), where its save has them: only the blocks
    # around the ranges are read, each checked; None: the whole object is read to check its CRC32C
    blocks: FileBlocks | None = field(default=None, compare=False)

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.ranges)

    @property
    def read_bytes(self) -> int:
        """What the restore reads of it (restore/tensors.py): the whole blocks around its ranges, or the whole
        object to verify its CRC32C where it has no blocks, or nothing."""
        if not self.ranges:
            return 0
        if self.blocks is None:
            return self.size
        return sum(e - s for s, e in block_spans(self.blocks, self.ranges))

    def as_dict(self) -> dict[str, Any]:
        verified = (
            "nothing selected in it: not read" if not self.ranges
            else "whole object read, its CRC32C checked" if self.blocks is None
            else "the blocks around its ranges read, each block's CRC32C checked"
        )  # fmt: skip
        return {"path": self.path, "ranges": len(self.ranges), "bytes": self.bytes, "of_bytes": self.size,
                "read_bytes": self.read_bytes, "verified": verified}  # fmt: skip


@dataclass(frozen=True)
class Tensors:
    """The tensor-level part of a selection: which items, and once resolved (restore/tensors.resolve,
    which reads the .metadata) each file's ranges and the counts."""

    parts: tuple[str, ...]  # model, optimizer
    prefixes: tuple[str, ...]  # --only-keys
    files: tuple[TensorFile, ...] = ()
    items: int = 0  # items (tensors and pickled objects) selected
    of_items: int = 0
    tensors: int = 0
    of_tensors: int = 0

    def of_what(self) -> str:
        return " or ".join([*self.parts, *(f"keys {p}" for p in self.prefixes)])

    def as_dict(self) -> dict[str, Any]:
        return {"parts": list(self.parts), "keys": list(self.prefixes), "items": self.items,
                "of_items": self.of_items, "tensors": self.tensors, "of_tensors": self.of_tensors,
                "files": [f.as_dict() for f in self.files]}  # fmt: skip


def _matches(pattern: str, path: str) -> bool:
    return fnmatchcase(path, pattern) or ("/" not in pattern and fnmatchcase(PurePosixPath(path).name, pattern))


@dataclass(frozen=True)
class Selected:
    """The selection applied to one save: the files restored and those left out."""

    selection: Selection
    files: tuple[FileEntry, ...]
    left_out: tuple[FileEntry, ...]
    by_tensor: tuple[str, ...] = ()  # files of `files` of which only some items' ranges are restored
    tensors: Tensors | None = None  # what `by_tensor` takes (None: a file-level selection)

    @property
    def partial(self) -> bool:
        return bool(self.left_out or self.by_tensor)

    @property
    def bytes(self) -> int:
        """What lands on the disk: the whole files, and the ranges of the tensor-level ones."""
        ranged = {t.path: t.bytes for t in self.tensors.files} if self.tensors is not None else {}
        return sum(ranged.get(f.path, f.size) for f in self.files)

    @property
    def read_bytes(self) -> int:
        """What is read from the store: the whole files, and the tensor-level ones read to be verified."""
        ranged = {t.path: t.read_bytes for t in self.tensors.files} if self.tensors is not None else {}
        return sum(ranged.get(f.path, f.size) for f in self.files)

    @property
    def of_bytes(self) -> int:
        return sum(f.size for f in self.files) + sum(f.size for f in self.left_out)

    @property
    def reads(self) -> dict[str, int]:
        """What the restore reads of each tensor-level file, by path ({} for a file-level selection, and
        before the ranges are resolved): the estimate prices its egress on these, and a file of which 0
        is read is neither thawed nor read (restore/complete.py)."""
        return {f.path: f.read_bytes for f in self.tensors.files} if self.tensors is not None else {}

    def narrow(self, manifest: Manifest) -> Manifest:
        """The manifest with only the selected files: what the plan, the thaw and the transfer act on."""
        keep = {f.path for f in self.files}
        return replace(manifest, files=tuple(f for f in manifest.files if f.path in keep))

    def describe(self) -> str:
        """One line for the estimate and the log."""
        from ckptvault import humanize

        n, total = len(self.files), len(self.files) + len(self.left_out)
        said = (
            f"partial restore ({self.selection.describe()}): {n} of {total} files, "
            f"{humanize.size(self.bytes)} of {humanize.size(self.of_bytes)}"
        )
        if self.tensors is not None and not self.tensors.files:  # its .metadata still frozen (restore/tensors.py)
            said += (
                f"; which items of the {len(self.by_tensor)} .distcp files it takes is read from their "
                ".metadata once thawed (it is thawed first; until then the .distcp files count whole)"
            )
        elif self.tensors is not None:
            t = self.tensors
            said += (f"; {t.tensors} of {t.of_tensors} tensors ({t.items} of {t.of_items} items) from "
                     f"{len(self.by_tensor)} .distcp files, read whole to verify them: "
                     f"{humanize.size(self.read_bytes)} read")  # fmt: skip
        return said

    def as_dict(self) -> dict[str, Any]:
        """`restore --json`'s `selection`, and the marker file's body."""
        return {
            "only": list(self.selection.only), "exclude": list(self.selection.exclude),
            "only_keys": list(self.selection.only_keys),
            "files": len(self.files), "of_files": len(self.files) + len(self.left_out),
            "bytes": self.bytes, "of_bytes": self.of_bytes, "read_bytes": self.read_bytes,
            "restored": [f.path for f in self.files], "left_out": [f.path for f in self.left_out],
            "by_tensor": list(self.by_tensor),
            "tensors": None if self.tensors is None else self.tensors.as_dict(),
        }  # fmt: skip

    def marker(self, manifest: Manifest) -> tuple[str, str]:
        """The marker file (name, content) a partial restore leaves at its destination's root: a person or
        a tool finding the directory learns that it is not the whole save, and what is missing."""
        doc = {"run": manifest.run, "step": manifest.step, "save": manifest.save, "format": manifest.format,
               "partial": True, **self.as_dict()}  # fmt: skip
        return MARKER, json.dumps(doc, indent=1) + "\n"


def select(manifest: Manifest, selection: Selection) -> Selected:
    """The save's files that `selection` asks for, or SelectionError naming why it cannot be served. A
    tensor-level selection's ranges are not known here (they are in the .metadata, which is in the
    store): restore/tensors.resolve adds them."""
    # here, not at the module's top: the layouts' modules are not on a whole restore's path
    from ckptvault.formats.parts import Part, classify

    files = list(manifest.files)
    chosen: list[FileEntry] = files
    by_tensor: list[str] = []
    tensor_parts: list[str] = []
    distcp = [f.path for f in files if f.path.endswith(DISTCP)] if manifest.format in TENSOR_FORMATS else []
    if selection.only_keys and not distcp:
        raise SelectionError(
            f"--only-keys selects items inside torch DCP .distcp files; {manifest.run} step {manifest.step} is a "
            f"{manifest.format!r} checkpoint without any: choose files with --only PATTERN"
        )
    if selection.only or selection.only_keys:
        classified = {c.path: c for c in classify(manifest.format, [f.path for f in files])}
        wanted: set[str] = set()
        whole_by_pattern: set[str] = set()
        for only in selection.only:
            if only in PARTS:
                mixed = [c for c in classified.values() if c.part is Part.MIXED]
                if mixed and distcp and all(c.path.endswith(DISTCP) for c in mixed):
                    tensor_parts.append(only)  # each .distcp split by its items' names
                    continue
                if mixed:
                    first = mixed[0]
                    raise SelectionError(
                        f"--only {only}: {manifest.run} step {manifest.step} is a {manifest.format!r} checkpoint whose "
                        f"{first.path}{f' (and {len(mixed) - 1} more)' if len(mixed) > 1 else ''} holds both: "
                        f"{first.why}. Restore it whole (no --only), or choose files with --only PATTERN."
                    )
                wanted |= {p for p, c in classified.items() if c.part.value == only}
            else:
                hits = {f.path for f in files if _matches(only, f.path)}
                if not hits:
                    raise SelectionError(_none_match("--only", only, manifest))
                wanted |= hits
                whole_by_pattern |= hits
        if tensor_parts or selection.only_keys:
            # every file beside the .distcp ones is one a loader reads (.metadata, common.pt, metadata.json,
            # NeMo's context/): small, and whole; each .distcp not asked for whole by a pattern, by its items
            wanted |= {f.path for f in files if not f.path.endswith(DISTCP)}
            by_tensor = [p for p in distcp if p not in whole_by_pattern]
            wanted |= set(by_tensor)
        chosen = [f for f in files if f.path in wanted]
    for pattern in selection.exclude:
        if not any(_matches(pattern, f.path) for f in files):
            raise SelectionError(_none_match("--exclude", pattern, manifest))
        chosen = [f for f in chosen if not _matches(pattern, f.path)]
    if not chosen:
        raise SelectionError(
            f"{selection.describe()} leaves no file of {manifest.run} step {manifest.step} to restore; "
            f"its files: {_some_paths(manifest)}"
        )
    kept = {f.path for f in chosen}
    by_tensor = [p for p in by_tensor if p in kept]
    tensors = Tensors(tuple(dict.fromkeys(tensor_parts)), selection.only_keys) if by_tensor else None
    return Selected(selection, tuple(chosen), tuple(f for f in files if f.path not in kept), tuple(by_tensor),
                    tensors)  # fmt: skip


def _some_paths(manifest: Manifest, n: int = 12) -> str:
    paths = [f.path for f in manifest.files]
    return ", ".join(paths[:n]) + (f" and {len(paths) - n} more" if len(paths) > n else "")


def _none_match(flag: str, pattern: str, manifest: Manifest) -> str:
    return (
        f"{flag} {pattern}: no file of {manifest.run} step {manifest.step} matches (a glob on the paths inside the "
        f"checkpoint, or model / optimizer); its files: {_some_paths(manifest)}"
    )


def narrow_statuses(statuses: Sequence[CopyStatus], selection: Selection) -> tuple[Selected, list[CopyStatus]]:
    """The selection applied to the save (through the first copy that has its manifest: every copy's is
    the same save's) and every copy narrowed to it: its manifest, its objects, and what it misses, so a
    copy that lacks only files left out serves the part in full."""
    usable = [s for s in statuses if s.manifest is not None]
    if not usable:  # copies.choose says why no copy can be read
        return Selected(selection, (), ()), list(statuses)
    assert usable[0].manifest is not None
    selected = select(usable[0].manifest, selection)
    keep = {f.path for f in selected.files}
    return selected, [
        s if s.manifest is None else replace(
            s, manifest=selected.narrow(s.manifest), plans=tuple(p for p in s.plans if p.path in keep),
            missing={k: v for k, v in s.missing.items() if k in keep},
        )
        for s in statuses
    ]  # fmt: skip
