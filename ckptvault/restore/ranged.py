"""A big file restored as byte ranges, each range its own task (`[scale] split_size_mb`): on a Dask
cluster several workers fetch one file at once, each writing its range at its offset in the one
staging file, instead of one worker fetching 100 GB while the others idle.

The steps, each one call a task wraps: `split_plans` decides which files split and where (pure);
`allocate` creates each split file at its full size, before any range, so every range can write at
its offset without truncating the others' bytes; `fetch_range` writes one range and returns its
CRC32C; `seal` combines the ranges' CRC32Cs in order into the whole file's and checks it, and the
size, against the manifest before the file counts as restored. The flow renames nothing into place
until every whole file is verified and every split file sealed, as before; a failure leaves only the
staging directory, which the flow discards.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.checksum import crc32c_combine, from_b64, to_b64
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.restore.steps import set_attributes, staged_path
from ckptvault.store import (
    ChecksumMismatchError,
    FetchedRange,
    ObjectStore,
    ProgressFn,
    TransientStoreError,
    preallocate,
)
from ckptvault.transfer.ranges import ranges, splits


@dataclass(frozen=True)
class Piece:
    """One range task: bytes [offset, offset + length) of `plan`'s file."""

    plan: ObjectPlan
    offset: int
    length: int


@dataclass(frozen=True)
class Split:
    whole: list[ObjectPlan]  # one download task each
    split: list[ObjectPlan]  # fetched as ranges, then sealed
    pieces: list[Piece]  # the ranges of `split`, file by file, each file's in offset order


def split_plans(plans: Sequence[ObjectPlan], threshold: int, unit: int) -> Split:
    """Which files are fetched as ranges of about `threshold` bytes cut on whole `unit`s (the store's
    part size), keeping the plans' order. Never a compressed object (a frame decodes only from its
    start), nor a file whose cuts leave one range (a part size above the threshold): that is one task."""
    whole, split, pieces = [], [], []
    for p in plans:
        cuts = ranges(p.size, unit, threshold) if splits(p.size, threshold) and not p.frames else []
        if len(cuts) < 2:
            whole.append(p)
            continue
        split.append(p)
        pieces += [Piece(p, off, n) for off, n in cuts]
    return Split(whole, split, pieces)


def by_file(split: Sequence[ObjectPlan], fetched: Sequence[FetchedRange]) -> list[list[FetchedRange]]:
    """The fetched ranges grouped per split file, in `split`'s order and each file's offset order."""
    out: dict[str, list[FetchedRange]] = {p.key: [] for p in split}
    for f in fetched:
        out[f.key].append(f)
    return [sorted(out[p.key], key=lambda f: f.offset) for p in split]


def allocate(plan: ObjectPlan, into: Path, manifest: Manifest) -> str:
    """Create the split file in the staging directory at its full size for its ranges, its blocks
    reserved where the filesystem can (ckptvault/store/preallocate.py)."""
    target = staged_path(into, plan, manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: a second allocate (a task run again) must fail, never truncate bytes ranges already wrote
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.ftruncate(fd, plan.size)
        preallocate.reserve(fd, plan.size, target)  # its ranges' direct writes as overwrites: see the module
    except BaseException:
        os.close(fd)
        target.unlink(missing_ok=True)  # ours (O_EXCL), unwritten: a failed reserve may still hold blocks
        raise
    os.close(fd)
    return plan.path


def fetch_range(
    store: ObjectStore,
    plan: ObjectPlan,
    into: Path,
    manifest: Manifest,
    offset: int,
    length: int,
    progress: ProgressFn | None = None,
) -> FetchedRange:
    """One range of a split file into its place in the staging file `allocate` made."""
    target = staged_path(into, plan, manifest)
    if not target.is_file():
        raise RestoreError(f"{plan.path}: {target} was not created before its ranges (the restore was stopped)")
    return store.download_range(plan.key, target, offset=offset, length=length, size=plan.size, progress=progress)


def seal(plan: ObjectPlan, into: Path, manifest: Manifest, fetched: Sequence[FetchedRange]) -> str:
    """Verify a split file from its fetched ranges: they cover it in order, were read from one version
    of the object, and their CRC32Cs combine to the manifest's, on a file of the manifest's size; then
    make it durable and give it its mode and mtime. On a mismatch the file is removed, so no corrupt
    file that looks whole is ever left."""
    target = staged_path(into, plan, manifest)
    where = plan.key
    ordered = sorted(fetched, key=lambda f: f.offset)
    try:
        crc, at = 0, 0
        for f in ordered:
            if f.key != plan.key or f.offset != at:
                raise RestoreError(
                    f"{plan.path}: the fetched ranges do not cover the file in order (a range for {f.key} at "
                    f"{f.offset}, expected {plan.key} at {at}); it is not verified, restore again"
                )
            crc = crc32c_combine(crc, from_b64(f.crc32c), f.length)
            at += f.length
        if at != plan.size:
            raise RestoreError(
                f"{plan.path}: its ranges cover {at} of its {plan.size} bytes; it is not verified, restore again"
            )
        if len({f.etag for f in ordered}) > 1:
            raise TransientStoreError(
                f"downloading {where}: the object was replaced while its ranges were being read; restore again"
            )
        if crc != from_b64(plan.crc32c):
            raise ChecksumMismatchError(
                f"downloading {where}: CRC32C mismatch: expected {plan.crc32c}, got {to_b64(crc)} (combined from "
                f"{len(ordered)} ranges). The stored object is not what was uploaded"
            )
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
        try:
            on_disk = os.fstat(fd).st_size
            if on_disk != plan.size:
                raise ChecksumMismatchError(
                    f"downloading {where}: the restored file {target} has {on_disk} bytes, expected {plan.size}; "
                    "something else wrote to the staging directory"
                )
            # each range made its own bytes durable; this covers the file's size and metadata
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    set_attributes(target, plan)
    return plan.path
