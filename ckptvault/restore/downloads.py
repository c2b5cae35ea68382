"""A restore into one directory: every file downloaded into a staging directory beside the
destination, verified, then renamed into place; on any failure the staging directory is removed and
the destination is untouched. Each call is run by the submitter (ckptvault/transfer/submitter.py).

A small file is one call; a big one (over `[scale] split_size_mb`) is made at its size, fetched as
range calls spread over the workers, then verified whole (ckptvault/restore/ranged.py).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.restore import ranged
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.restore.steps import discard, download_one, finalize, staging_dir, write_pointer
from ckptvault.store import FetchedRange, ObjectStore
from ckptvault.transfer.progress import ProgressBar
from ckptvault.transfer.submitter import Pending, Submitter, settle


def restore_into(
    submit: Submitter, store: ObjectStore, plans: list[ObjectPlan], target: Path, manifest: Manifest,
    bar: ProgressBar, threshold: int, force: bool,
) -> tuple[str | None, str | None]:  # fmt: skip
    """The pointer file, and where the old contents were moved (--force; None when there were none)."""
    staged = submit(staging_dir, target)
    try:
        failed, errors = download_all(submit, store, plans, staged, manifest, bar, threshold)
        if errors:
            raise RestoreError(f"{failed}; nothing was changed at {target}:\n" + "\n".join(errors))
        pointer = submit(write_pointer, staged, manifest)
    except BaseException:
        submit(discard, staged)
        raise
    moved = submit(finalize, staged, target, force)  # a failure here keeps the verified copy (finalize says where)
    return pointer, str(moved) if moved else None


def download_all(
    submit: Submitter, store: ObjectStore, plans: list[ObjectPlan], staged: Path, manifest: Manifest,
    bar: ProgressBar, threshold: int,
) -> tuple[str, list[str]]:  # fmt: skip
    """Every file into `staged`. Returns what failed, counted, and every failure (none: all verified).
    Each phase waits for the last: a range must not write before its file exists, nor a file be
    verified before all its ranges are in."""
    cut = ranged.split_plans(plans, threshold, store.transfer.part_size)
    if cut.split:
        errors = settle(submit.map([partial(ranged.allocate, plan, staged, manifest) for plan in cut.split]))
        if errors:
            return f"{len(errors)} of {len(cut.split)} files to fetch as ranges could not be created", errors
    ranges_f: list[Pending[FetchedRange]] = []
    if cut.pieces:  # first: the biggest files, whose ranges keep every worker busy
        ranges_f = submit.map([partial(ranged.fetch_range, store, p.plan, staged, manifest, p.offset, p.length, bar)
                               for p in cut.pieces])  # fmt: skip
    whole_f: list[Pending[str]] = []
    if cut.whole:
        whole_f = submit.map([partial(download_one, store, plan, staged, manifest, bar) for plan in cut.whole])
    errors = settle([*ranges_f, *whole_f])
    if errors:
        if not cut.split:
            return f"{len(errors)} of {len(plans)} files failed", errors
        tasks = len(ranges_f) + len(whole_f)
        return f"{len(errors)} of {tasks} downloads ({len(plans)} files, {len(cut.split)} as ranges) failed", errors
    if not cut.split:
        return "", []
    fetched = ranged.by_file(cut.split, [f.result() for f in ranges_f])
    calls = [partial(ranged.seal, plan, staged, manifest, got) for plan, got in zip(cut.split, fetched, strict=True)]
    errors = settle(submit.map(calls))
    return f"{len(errors)} of {len(cut.split)} files fetched as ranges failed their check", errors
