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

Verification: where the save has block CRC32Cs (checkpoint/blocks.py; the sidecar's lists are checked
against the manifest's whole-file CRC32C before they are trusted), `fetch_ranges` reads only the whole
blocks around the ranges and checks each before writing; a manifest's one CRC32C per file cannot check
a range alone, so without blocks it reads the whole object, streamed a part at a time (never whole in
memory), checks its CRC32C as any restore does, and writes only the selected ranges: the disk is
spared, the network is not (`restore --json`'s `read_bytes` says which per file). A file from which
nothing is selected is not read at all.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from ckptvault.checkpoint.blocks import BlockMismatchError, FileBlocks, fetch_verified_range, load_blocks
from ckptvault.checkpoint.manifest import Manifest
from ckptvault.checksum import crc32c_update, from_b64, to_b64
from ckptvault.restore.copies import CopyStatus
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.selection import Selected, SelectionError, TensorFile, block_spans
from ckptvault.restore.steps import set_attributes, staged_path
from ckptvault.store import ChecksumMismatchError, ObjectStore, ProgressFn

READ_PIECE = 8 << 20  # bytes per ranged GET of a whole-object read: one of these in memory per file at a time


def resolve(
    selected: Selected, store: ObjectStore, plans: Sequence[ObjectPlan], blocks: Mapping[str, FileBlocks] | None = None
) -> Selected:
    """`selected` with the ranges of each of its tensor-level files (`selected.by_tensor`), read from the
    `.metadata` beside them (`plans`: every object of the save on `store`, selected or not), and each
    file's verified block CRC32Cs where `blocks` (checkpoint/blocks.load_blocks) has them.
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
                    got = (blocks or {}).get(path)
                    files.append(TensorFile(path, tuple(picked.ranges.get(rel, ())), by_path[path].size, got))
    if items == 0:
        raise SelectionError(
            f"{flag}: no item of {selected.tensors.of_what()} in {', '.join(m or '.' for m in dirs)}'s .metadata "
            f"({of_items} items); a key is a dotted name such as model.layers.0 (DCP flattens nested dicts)"
        )
    done = replace(selected.tensors, files=tuple(files), items=items, of_items=of_items, tensors=tensors,
                   of_tensors=of_tensors)  # fmt: skip
    return replace(selected, tensors=done)


def frozen_metadata(selected: Selected, plans: Sequence[ObjectPlan]) -> tuple[ObjectPlan, ...]:
    """The `.metadata` objects `resolve` must read that are in an archival class and not yet thawed: a
    tensor-level restore from the archive thaws them first (they are small), learns from them which
    `.distcp` files and ranges it needs, then thaws only those files (restore/complete.py)."""
    from ckptvault.formats.dcp import METADATA

    dirs = {posixpath.dirname(p) for p in selected.by_tensor}
    wanted = {posixpath.join(d, METADATA) if d else METADATA for d in dirs}
    return tuple(p for p in plans if p.path in wanted and not p.thawed)


def copies_blocks(ordered: Sequence[CopyStatus]) -> dict[str, FileBlocks]:
    """The verified block CRC32Cs of the first copy in `ordered` that has a sidecar (the primary's: a
    replica keeps none). Each list is checked against the manifest's whole-file CRC32C, so it describes the
    file's bytes and checks the ranges of whichever copy they are read from; {} when no copy has them."""
    for s in ordered:
        if s.store is not None and s.manifest is not None and (got := load_blocks(s.store, s.manifest, s.prefix)):
            return got
    return {}


def fetch_ranges(
    store: ObjectStore, plan: ObjectPlan, into: Path, manifest: Manifest, ranges: Sequence[tuple[int, int]],
    progress: ProgressFn | None = None, blocks: FileBlocks | None = None,
) -> str:  # fmt: skip
    """One `.distcp` file into the staging directory: created sparse at its full size (ftruncate, no
    block reservation: a weights restore must not reserve the optimizer's bytes), then `ranges`
    ((offset, length), coalesced, in order) written at their offsets. With `blocks` (the file's verified
    block CRC32Cs) and an object stored as it is: only the whole blocks around the ranges are read, each
    checked. Without: the whole object read a piece at a time and its CRC32C checked against the
    manifest. A mismatch is ChecksumMismatchError naming the file (and the block): the file is removed.
    Nothing selected in it: created, nothing read."""
    target = staged_path(into, plan, manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: a second call (a task run again) fails rather than truncate what the first wrote
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.ftruncate(fd, plan.size)
        if ranges:
            if plan.frames:
                _from_decoded(store, plan, fd, target, ranges, progress)
            elif blocks is not None:
                _from_blocks(store, plan, fd, ranges, blocks, progress)
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


def _from_blocks(
    store: ObjectStore, plan: ObjectPlan, fd: int, ranges: Sequence[tuple[int, int]], blocks: FileBlocks,
    progress: ProgressFn | None,
) -> None:  # fmt: skip
    """The blocks around `ranges`, READ_PIECE at a time (whole blocks: one ranged GET each), up to the
    store's `max_concurrency` GETs in flight (memory: that many pieces), each block's CRC32C checked
    before a byte of it is written."""
    step = max(blocks.block_size, READ_PIECE // blocks.block_size * blocks.block_size)
    pieces = [(at, min(step, end - at)) for start, end in block_spans(blocks, ranges) for at in range(start, end, step)]

    def one(at: int, n: int) -> None:
        try:
            data = fetch_verified_range(store, plan.key, blocks, at, n)
        except BlockMismatchError as e:  # the fallback tries the next copy on a mismatch, as for a whole file
            raise ChecksumMismatchError(f"downloading {plan.key}: {e}") from None
        if len(data) != n:
            raise ChecksumMismatchError(f"downloading {plan.key}: {len(data)} bytes at {at}, expected {n}")
        _write_overlap(fd, memoryview(data), at, ranges)
        if progress is not None:
            progress(n)

    if len(pieces) <= 1:
        for at, n in pieces:
            one(at, n)
        return
    with ThreadPoolExecutor(min(len(pieces), store.transfer.max_concurrency)) as pool:
        for done in [pool.submit(one, at, n) for at, n in pieces]:
            done.result()  # the first failure raises; the pool finishes the others before the file is removed


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


def ranges_of(selected: Selected | None) -> Mapping[str, TensorFile]:
    """The tensor-level files of a resolved selection, their ranges and blocks ({} for a file-level one)."""
    if selected is None or selected.tensors is None:
        return {}
    return {f.path: f for f in selected.tensors.files}
