"""What a restore will fetch: the manifest (the commit marker: no manifest, no restore), one plan per
object with its storage class and whether it is readable now, and the thaw of archived objects
(RestoreObject as its own step, then polling until they are readable)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ckptvault.checkpoint.manifest import Manifest, ManifestError, checkpoint_prefix, safe_relpath
from ckptvault.restore.resolve import RestoreError
from ckptvault.store import ObjectStore, manifest_load

ARCHIVAL = frozenset({"GLACIER", "DEEP_ARCHIVE"})  # must be thawed before a GET; GLACIER_IR need not
_ONGOING = re.compile(r'ongoing-request\s*=\s*"(true|false)"')


@dataclass(frozen=True)
class ObjectPlan:
    key: str
    path: str  # relative path in the checkpoint
    size: int
    crc32c: str
    mtime: float  # set on the restored file, as training wrote it
    storage_class: str
    thawed: bool  # readable now (not archival, or archival with a completed restore)
    mode: int | None = None  # permission bits to restore; None in manifests older than the field
    # docs/FORMAT.md "Compressed files": the object is these frames (empty: the file as it is)
    frames: tuple[tuple[int, int, int, str], ...] = ()
    stored_size: int | None = None  # the object's size; None: `size`

    @property
    def stored_bytes(self) -> int:
        """What the GETs move and the storage class bills: the object, not the file it decodes to."""
        return self.size if self.stored_size is None else self.stored_size


def load_manifest(store: ObjectStore, prefix: str, run: str, step: int, save: int = 1) -> Manifest:
    """The manifest a restore, drill or tier pass acts on; an unreadable one is a RestoreError, the
    error those passes' failure alerts have always named."""
    try:
        return manifest_load.load_manifest(store, prefix, run, step, save)
    except ManifestError as e:
        raise RestoreError(str(e)) from None


def _is_thawed(storage_class: str, restore_header: str | None) -> bool:
    if storage_class not in ARCHIVAL:
        return True
    if not restore_header:
        return False
    m = _ONGOING.search(restore_header)
    return bool(m and m.group(1) == "false")


def plan_objects(store: ObjectStore, prefix: str, manifest: Manifest) -> list[ObjectPlan]:
    """One LIST for every object's size and class (a checkpoint can hold thousands of files), then a
    HEAD only for archived objects, the one thing a listing cannot say: whether they are thawed."""
    plans, missing = plan_present(store, prefix, manifest)
    if missing:
        raise RestoreError(
            f"{manifest.run} step {manifest.step}: {len(missing)} objects named by the manifest are missing or wrong: "
            + ", ".join(path if why == "missing" else f"{path} ({why})" for path, why in list(missing.items())[:10])
        )
    return plans


def plan_present(store: ObjectStore, prefix: str, manifest: Manifest) -> tuple[list[ObjectPlan], dict[str, str]]:
    """`plan_objects` for the objects that are there, and the paths of those that are not ("missing") or
    have the wrong size (saying so): a copy missing one object still serves the others (ckptvault/restore/copies.py)."""
    base = checkpoint_prefix(prefix, manifest.run, manifest.step, manifest.save)
    listed = {info.key: info for info in store.list(base)}
    plans: list[ObjectPlan] = []
    missing: dict[str, str] = {}
    for f in manifest.files:
        rel = safe_relpath(f.path)
        info = listed.get(base + rel)
        if info is not None and info.storage_class in ARCHIVAL:
            info = store.head(base + rel)
        if info is None:
            missing[rel] = "missing"
            continue
        if info.size != f.stored_bytes:
            missing[rel] = f"size {info.size} in the store, {f.stored_bytes} in the manifest"
            continue
        plans.append(
            ObjectPlan(
                base + rel,
                rel,
                f.size,
                f.crc32c,
                f.mtime,
                info.storage_class,
                _is_thawed(info.storage_class, info.restore),
                f.mode,
                f.frames,
                f.stored_size if f.frames else None,
            )
        )
    # Largest first: the downloads fan out over threads or Dask workers in this order, and a big file
    # started last would leave every other worker idle while it finishes (stable: ties keep the manifest's order)
    return sorted(plans, key=lambda p: p.stored_bytes, reverse=True), missing


def request_thaw(store: ObjectStore, plans: Sequence[ObjectPlan], tier: str, days: int = 3) -> dict[str, int]:
    """Warm-up as its own step: RestoreObject for every frozen object. Idempotent: an object already
    thawing or thawed is counted, not an error."""
    counts: dict[str, int] = {}
    for p in plans:
        if p.thawed:
            continue
        status = store.restore_object(p.key, days, tier)
        counts[status] = counts.get(status, 0) + 1
    return counts


def still_frozen(store: ObjectStore, plans: Sequence[ObjectPlan]) -> list[ObjectPlan]:
    """HEAD the objects not yet readable; returns those still frozen."""
    out = []
    for p in plans:
        if p.thawed:
            continue
        info = store.head(p.key)
        if info is None or not _is_thawed(info.storage_class, info.restore):
            out.append(p)
    return out


def wait_for_thaw(
    store: ObjectStore,
    plans: Sequence[ObjectPlan],
    deadline_s: float,
    first_delay: float = 5.0,
    max_delay: float = 900.0,
) -> list[ObjectPlan]:
    """Poll with exponential backoff until nothing is frozen or the deadline passes; returns what is
    still frozen (empty when done)."""
    end = time.monotonic() + deadline_s
    delay = first_delay
    frozen = still_frozen(store, plans)
    while frozen and time.monotonic() + delay <= end:
        time.sleep(delay)
        delay = min(delay * 2, max_delay)
        frozen = still_frozen(store, frozen)
    return frozen
