"""A tensor-level partial restore of a torch DCP checkpoint (dcp, Megatron `torch_dist`, NeMo 2's
`weights/`): `--only model|optimizer` and `--only-keys PREFIX` bring back every small file a loader
reads (`.metadata`, `common.pt`, `metadata.json`, configs) whole, and of each `.distcp` file only the
byte ranges of the chosen items, written at their offsets into a sparse file of the file's full size.
`torch.distributed.checkpoint.load` of a state dict with only those keys reads exactly those bytes;
a loader that asks for other keys reads the holes as zeros, which is why the destination carries
the partial marker (restore/selection.py MARKER) and `restore --json` says so.

Two steps: `resolve` (before anything is fetched, in the restore's first half) downloads each DCP
directory's `.metadata`, verified, reads which chunks the selection takes (formats/dcp_tensors.py)
and records the coalesced ranges per file on the selection; `fetch_ranges` (one call per `.distcp`,
run by the submitter like every download) fills one file.

Verification: a manifest has one CRC32C per file, which no range alone can be checked against. So
`fetch_ranges` reads the whole object, streamed a part at a time (never whole in memory), checks its
CRC32C as any restore does, and writes only the selected ranges: the disk is spared, the network is
not (`restore --json`'s `read_bytes` says so per file). A file from which nothing is selected is not
read at all. `fetch_ranges` is the one place to change when per-block CRC32Cs exist: fetch the blocks
around each range, check each, write the range.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.checksum import crc32c_update, from_b64, to_b64
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.selection import Selected, SelectionError, TensorFile
from ckptvault.restore.steps import set_attributes, staged_path
from ckptvault.store import ChecksumMismatchError, ObjectStore, ProgressFn

READ_PIECE = 8 << 20  # bytes per ranged GET of a whole-object read: one of these in memory per file at a time


def resolve(selected: Selected, store: ObjectStore, plans: Sequence[ObjectPlan]) -> Selected:
    """`selected` with the ranges of each of its tensor-level files (`selected.by_tensor`), read from the
    `.metadata` beside them (`plans`: every object of the save on `store`, selected or not).
    SelectionError (exit 2, nothing written) when a directory has no `.metadata` or it cannot be read."""
    # here, not at the module's top: the layouts' modules are not on a whole restore's path
    from ckptvault.formats import dcp_tensors
    from ckptvault.formats.dcp import METADATA

    assert selected.tensors is not None
    by_path = {p.path: p for p in plans}
    dirs = sorted({posixpath.dirname(p) for p in selected.by_tensor})
    files: list[TensorFile] = []
    items = of_items = tensors = of_tensors = 0
    flag = selected.selection.describe()
    with tempfile.TemporaryDirectory(prefix="ckptvault-dcp-") as tmp:
        for d in dirs:
            meta = posixpath.join(d, METADATA) if d else METADATA
            plan = by_path.get(meta)
            if plan is None:
                where = d or "the checkpoint"
                raise SelectionError(f"{flag}: {meta} is not in this save: without it the tensors of {where}'s "
                                     ".distcp files cannot be found; restore it whole")  # fmt: skip
            local = Path(tmp) / f"{len(files)}.metadata"
            # CRC32C checked (decoded first if compressed: its frames)
            store.download_file(plan.key, local, size=plan.size, crc32c=plan.crc32c, frames=plan.frames)
            try:
                picked = dcp_tensors.pick(dcp_tensors.chunks(local), selected.tensors.parts, selected.tensors.prefixes)
            except ValueError as e:
                raise SelectionError(
                    f"{flag}: {meta} cannot be read for its tensors ({e}); restore the save whole (no --only)"
                ) from None
            items, of_items = items + picked.items, of_items + picked.of_items
            tensors, of_tensors = tensors + picked.tensors, of_tensors + picked.of_tensors
            for path in selected.by_tensor:
                if posixpath.dirname(path) == d:
                    rel = posixpath.relpath(path, d) if d else path
                    files.append(TensorFile(path, tuple(picked.ranges.get(rel, ())), by_path[path].size))
    if items == 0:
        raise SelectionError(
            f"{flag}: no item of {selected.tensors.of_what()} in {', '.join(m or '.' for m in dirs)}'s .metadata "
            f"({of_items} items); a key is a dotted name such as model.layers.0 (DCP flattens nested dicts)"
        )
    done = replace(selected.tensors, files=tuple(files), items=items, of_items=of_items, tensors=tensors,
                   of_tensors=of_tensors)  # fmt: skip
    return replace(selected, tensors=done)


def fetch_ranges(
    store: ObjectStore, plan: ObjectPlan, into: Path, manifest: Manifest, ranges: Sequence[tuple[int, int]],
    progress: ProgressFn | None = None,
) -> str:  # fmt: skip
    """One `.distcp` file into the staging directory: created sparse at its full size (ftruncate, no
    block reservation: a weights restore must not reserve the optimizer's bytes), then `ranges`
    ((offset, length), coalesced, in order) written at their offsets. Today: the whole object read a
    piece at a time and its CRC32C checked against the manifest (ChecksumMismatchError naming the file
    and the object: the file is removed). Nothing selected in it: created, nothing read."""
    target = staged_path(into, plan, manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: a second call (a task run again) fails rather than truncate what the first wrote
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.ftruncate(fd, plan.size)
        if ranges:
            if plan.frames:
                _from_decoded(store, plan, fd, target, ranges, progress)
            else:
                _from_object(store, plan, fd, ranges, progress)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        target.unlink(missing_ok=True)
        raise
    os.close(fd)
    set_attributes(target, plan)
    return plan.path


def _write_overlap(fd: int, data: memoryview, at: int, ranges: Sequence[tuple[int, int]]) -> None:
    """The bytes of `data` (the file's bytes from offset `at`) that fall inside `ranges`, at their offsets."""
    end = at + len(data)
    for off, n in ranges:
        lo, hi = max(off, at), min(off + n, end)
        if lo < hi:
            view = data[lo - at : hi - at]
            while view:
                written = os.pwrite(fd, view, lo)
                view, lo = view[written:], lo + written


def _from_object(
    store: ObjectStore, plan: ObjectPlan, fd: int, ranges: Sequence[tuple[int, int]], progress: ProgressFn | None
) -> None:
    crc, at = 0, 0
    while at < plan.size:
        n = min(READ_PIECE, plan.size - at)
        piece = memoryview(store.read_range(plan.key, at, n, size=plan.size))
        if len(piece) != n:
            raise ChecksumMismatchError(f"downloading {plan.key}: {len(piece)} bytes at {at}, expected {n}")
        crc = crc32c_update(piece, crc)
        _write_overlap(fd, piece, at, ranges)
        if progress is not None:
            progress(n)
        at += n
    if crc != from_b64(plan.crc32c):
        raise ChecksumMismatchError(
            f"downloading {plan.key} ({plan.path}): CRC32C mismatch: expected {plan.crc32c}, got {to_b64(crc)}. "
            "The stored object is not what was uploaded"
        )


def _from_decoded(
    store: ObjectStore, plan: ObjectPlan, fd: int, target: Path, ranges: Sequence[tuple[int, int]],
    progress: ProgressFn | None,
) -> None:  # fmt: skip
    """A compressed object decodes only from its frames' starts: the adapter decodes and checks the whole
    file into a scratch file beside the target, whose ranges are copied, then it is removed."""
    scratch = target.with_name(target.name + ".ckptvault-whole")
    try:
        store.download_file(plan.key, scratch, size=plan.size, crc32c=plan.crc32c, frames=plan.frames,
                            progress=progress)  # fmt: skip
        with scratch.open("rb") as f:
            for off, n in ranges:
                f.seek(off)
                _write_overlap(fd, memoryview(f.read(n)), off, [(off, n)])
    finally:
        scratch.unlink(missing_ok=True)


def ranges_of(selected: Selected | None) -> Mapping[str, Sequence[tuple[int, int]]]:
    """The tensor-level files of a resolved selection and their ranges ({} for a file-level one)."""
    if selected is None or selected.tensors is None:
        return {}
    return {f.path: f.ranges for f in selected.tensors.files}
