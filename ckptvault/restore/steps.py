"""Restore: bring back run R at step S (or `latest`) to a directory the framework resumes from.

Steps, each one call a task wraps: resolve the step (ckptvault/restore/resolve.py); load its manifest
and plan its objects, warm up archived objects (RestoreObject) as its own step and check which are
still frozen (plan.py); estimate bytes, classes, time and cost (estimate.py); then, here, download
every file into a temporary directory beside the destination with every CRC32C checked (a big file
as ranges on several workers: ranged.py), write the format's pointer file, rename into place.
Nothing at the destination is touched until every byte is verified. The earlier steps' names are
re-exported so a caller drives a restore through this module.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.restore.estimate import Estimate as Estimate
from ckptvault.restore.estimate import estimate as estimate
from ckptvault.restore.estimate import restore_throughput as restore_throughput
from ckptvault.restore.plan import ARCHIVAL as ARCHIVAL
from ckptvault.restore.plan import ObjectPlan as ObjectPlan
from ckptvault.restore.plan import load_manifest as load_manifest
from ckptvault.restore.plan import plan_objects as plan_objects
from ckptvault.restore.plan import request_thaw as request_thaw
from ckptvault.restore.plan import still_frozen as still_frozen
from ckptvault.restore.plan import wait_for_thaw as wait_for_thaw
from ckptvault.restore.resolve import Resolution as Resolution
from ckptvault.restore.resolve import RestoreError as RestoreError
from ckptvault.restore.resolve import parse_step as parse_step
from ckptvault.restore.resolve import resolve as resolve
from ckptvault.store import ObjectStore, ProgressFn

# Permission bits only: set-uid/set-gid from a bucket are never restored.
PERMISSION_BITS = 0o1777


def check_destination(dest: Path, force: bool) -> None:
    if dest.exists() and not dest.is_dir():
        raise RestoreError(f"destination {dest} exists and is not a directory. Choose another --dest.")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise RestoreError(
            f"destination {dest} is not empty. Choose an empty or new directory, or pass --force "
            "(the existing directory is then kept, renamed aside, never deleted)."
        )


def staging_dir(dest: Path) -> Path:
    """A temporary directory beside the destination: same file system, so the final rename is atomic."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.ckptvault-partial-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def checkpoint_name(manifest: Manifest) -> str:
    """The checkpoint's own directory (or file) name on the hot tier, which frameworks look for."""
    name = Path(manifest.source).name if manifest.source else ""
    return name if name not in ("", ".", "..") else f"step-{manifest.step}"


def staged_path(into: Path, plan: ObjectPlan, manifest: Manifest) -> Path:
    """Where the object's file goes in the staging directory; RestoreError if that directory is gone
    (discarded after a failure or an abort elsewhere: never re-create it and refill it)."""
    if not into.is_dir():
        raise RestoreError(f"{plan.path}: the staging directory {into} is gone (the restore was stopped); not fetched")
    return into / plan.path if manifest.single_file else into / checkpoint_name(manifest) / plan.path


def set_attributes(target: Path, plan: ObjectPlan) -> None:
    """The permission bits and modification time training gave the file, on its verified copy."""
    # Compat: a manifest from before `mode` has none, the file keeps its bits; may go: never (FORMAT.md)
    if plan.mode is not None:
        os.chmod(target, plan.mode & PERMISSION_BITS)
    os.utime(target, (time.time(), plan.mtime))


def download_one(
    store: ObjectStore, plan: ObjectPlan, into: Path, manifest: Manifest, progress: ProgressFn | None = None
) -> str:
    """Fetch one object into the staging directory, CRC32C checked by the adapter (a compressed one
    decoded there, every frame checked): what lands in `into` is always the original bytes."""
    target = staged_path(into, plan, manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    # `frames` only when there are some: a store adapter that predates frames still serves raw objects
    coded = {"frames": plan.frames} if plan.frames else {}
    store.download_file(plan.key, target, size=plan.size, crc32c=plan.crc32c, progress=progress, **coded)
    set_attributes(target, plan)
    return plan.path


def write_pointer(staged: Path, manifest: Manifest) -> str | None:
    """Recreate `latest` / `latest_checkpointed_iteration.txt` so the framework resumes from here."""
    # here, after the bytes: the layouts' modules are not on a restore's path to its first byte
    from ckptvault.formats import get_layout

    pointer = get_layout(manifest.format).pointer_file(manifest.step, checkpoint_name(manifest))
    if pointer is None:
        return None
    name, content = pointer
    (staged / name).write_text(content)
    return name


def write_marker(staged: Path, marker: tuple[str, str]) -> str:
    """A file (name, content) at the staging directory's root, renamed into place with the rest."""
    name, content = marker
    (staged / name).write_text(content)
    return name


def finalize(staged: Path, dest: Path, force: bool) -> Path | None:
    """Rename the verified staging directory into place. With --force an existing destination is
    renamed aside (returned) rather than deleted: a restore never destroys data."""
    aside = None
    emptied = False
    if dest.exists():
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
            emptied = True
        elif force:
            aside = dest.with_name(f"{dest.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            dest.rename(aside)
        else:
            raise RestoreError(f"destination {dest} appeared while restoring; the restored copy is kept at {staged}")
    try:
        staged.rename(dest)
    except OSError as e:
        if aside is not None:  # put the old contents back where they were
            aside.rename(dest)
        elif emptied:
            dest.mkdir()
        raise RestoreError(
            f"renaming the verified copy {staged} to {dest} failed ({e}); {dest} is as it was, and the copy is kept"
        ) from None
    return aside


def discard(staged: Path) -> None:
    """Remove a staging directory after a failed restore: it holds only our partial copy."""
    if staged.name.startswith(".") and ".ckptvault-partial-" in staged.name:
        shutil.rmtree(staged, ignore_errors=True)
