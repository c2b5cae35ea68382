"""Local eviction: the hot copy of a checkpoint is deleted only when, re-checked just before, every file
still matches (size, mtime) the manifest entry that was verified and the store still holds every object
(size, and CRC32C of the stored bytes where the store reports one); anything else skips that checkpoint and says why."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ckptvault.catalog import Event, events
from ckptvault.checkpoint.manifest import (
    CODEC_NONE,
    FileEntry,
    Manifest,
    checkpoint_prefix,
    safe_relpath,
)
from ckptvault.store import ObjectInfo, ObjectStore

# Concurrent HEADs of an eviction re-check: each is one round trip, and a checkpoint can hold thousands.
_HEADS = 8


@dataclass(frozen=True)
class Mismatch:
    """One file an eviction found different from the manifest: a local path or a store key."""

    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


@dataclass(frozen=True)
class LocalFile:
    """What an lstat says of a local file, as the eviction check needs it."""

    size: int
    mtime: float
    regular: bool  # a regular file, not a symlink, directory or device


@dataclass(frozen=True)
class EvictionCheck:
    """What the re-check before an eviction found: the local copy against the manifest, and the store
    against the manifest. Either side differing means the local copy is not provably redundant."""

    run: str
    step: int
    save: int
    root: str  # the local copy (manifest.source)
    local: tuple[Mismatch, ...] = ()
    store: tuple[Mismatch, ...] = ()

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.run, self.step, self.save)

    @property
    def ok(self) -> bool:
        return not self.local and not self.store

    def skipped_event(self, reason: str, flow_run: str = "") -> Event:
        """The catalog's `evict_skipped` event: the eviction `reason` planned it for was not done, and why."""
        return events.evict_skipped(self.run, self.step, self.save, reason, self.reason, self.root, self.local,
                                    self.store, flow_run)  # fmt: skip

    @property
    def reason(self) -> str:
        parts = []
        if self.local:
            parts.append(f"{len(self.local)} local files differ from the verified copy (changed after upload)")
        if self.store:
            parts.append(f"{len(self.store)} objects of the manifest are missing or differ in the store")
        return "; ".join(parts) or "local copy and store match the manifest"


@dataclass(frozen=True)
class Eviction:
    """The outcome of one eviction: done (files deleted) or skipped, with what the re-check found."""

    check: EvictionCheck
    files: int = 0
    freed: int = 0

    @property
    def evicted(self) -> bool:
        return self.check.ok


def local_targets(manifest: Manifest) -> list[tuple[Path, FileEntry]]:
    """Each manifest entry with the local path it was uploaded from."""
    root = Path(manifest.source)
    if manifest.single_file:
        return [(root, manifest.files[0])]
    return [(root / safe_relpath(f.path), f) for f in manifest.files]


def compare_local(targets: Sequence[tuple[Path, FileEntry]], stats: Mapping[Path, LocalFile | None]) -> list[Mismatch]:
    """Local files that are no longer what was verified. A file that is gone is not a mismatch: an
    earlier eviction that crashed half-way deleted it, and finishing that eviction is the point."""
    out = []
    for path, entry in targets:
        st = stats.get(path)
        if st is None:
            continue
        if not st.regular:
            out.append(Mismatch(str(path), "no longer a regular file (replaced by a symlink or directory?)"))
        elif st.size != entry.size:
            out.append(Mismatch(str(path), f"size {st.size} locally, {entry.size} in the manifest"))
        elif abs(st.mtime - entry.mtime) > 1e-3:
            out.append(Mismatch(str(path), "modified after upload (mtime differs from the manifest)"))
    return out


def compare_store(manifest: Manifest, base: str, found: Mapping[str, ObjectInfo]) -> list[Mismatch]:
    """Objects of the manifest the store no longer holds as verified: missing, another size, or (where
    the store reports one) another CRC32C. Multipart objects on stores without full-object checksums
    (Ceph) report no CRC32C: for them the size is all a metadata request can check. A compressed
    object's CRC32C is of its frames: it is compared with the entry's `stored_crc32c`, and an entry
    written before that field existed is checked by its size alone."""
    out = []
    for f in manifest.files:
        key = base + safe_relpath(f.path)
        info = found.get(key)
        if info is None:
            out.append(Mismatch(key, "missing from the store"))
        elif info.size != f.stored_bytes:
            out.append(Mismatch(key, f"size {info.size} in the store, {f.stored_bytes} in the manifest"))
        elif info.crc32c is not None and (want := _stored_crc32c(f)) is not None and info.crc32c != want:
            out.append(Mismatch(key, f"CRC32C {info.crc32c} in the store, {want} in the manifest"))
    return out


def _stored_crc32c(f: FileEntry) -> str | None:
    """The CRC32C the object's bytes must have: the file's when stored as it is, else the frames'."""
    # Compat: None for compressed entries from before `stored_crc32c` (size checked alone); may go: never
    return f.crc32c if f.codec == CODEC_NONE else f.stored_crc32c


def eviction_check(
    manifest: Manifest,
    base: str,
    stats: Mapping[Path, LocalFile | None],
    found: Mapping[str, ObjectInfo],
) -> EvictionCheck:
    """The decision, from what was observed: may the local copy of `manifest` be deleted?"""
    return EvictionCheck(
        manifest.run,
        manifest.step,
        manifest.save,
        manifest.source,
        tuple(compare_local(local_targets(manifest), stats)),
        tuple(compare_store(manifest, base, found)),
    )


def _lstat(path: Path) -> LocalFile | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return LocalFile(st.st_size, st.st_mtime, stat.S_ISREG(st.st_mode))


def recheck_eviction(store: ObjectStore, prefix: str, manifest: Manifest) -> EvictionCheck:
    """Look again, just before deleting: lstat every local file; one LIST of the checkpoint's prefix
    for presence and size; a HEAD per listed object for the CRC32C (a listing never carries it). The
    HEADs are worth it here: an eviction deletes what may become the only copy the cluster has."""
    base = checkpoint_prefix(prefix, manifest.run, manifest.step, manifest.save)
    stats = {path: _lstat(path) for path, _ in local_targets(manifest)}
    listed = {info.key: info for info in store.list(base)}
    sizes = {base + safe_relpath(f.path): f.stored_bytes for f in manifest.files}
    keys = [k for k, size in sizes.items() if k in listed and listed[k].size == size]
    with ThreadPoolExecutor(max_workers=_HEADS) as pool:
        heads = dict(zip(keys, pool.map(store.head, keys), strict=True))
    found = {k: info for k, info in listed.items() if k not in heads}
    found.update({k: info for k, info in heads.items() if info is not None})  # None: deleted since the LIST
    return eviction_check(manifest, base, stats, found)


def evict_local(store: ObjectStore, prefix: str, manifest: Manifest) -> Eviction:
    """Free the hot tier: delete the local copy only if, re-checked now, every local file still matches
    its verified entry and the store still holds every object. Otherwise nothing is touched and the
    result says what differed; a skipped checkpoint is never an error, so the rest of a plan goes on."""
    check = recheck_eviction(store, prefix, manifest)
    if not check.ok:
        return Eviction(check)
    targets = local_targets(manifest)
    freed = 0
    for path, entry in targets:
        if path.exists():
            path.unlink()
            freed += entry.size
    if not manifest.single_file:
        _remove_empty_dirs(Path(manifest.source))
    return Eviction(check, len(targets), freed)


def _remove_empty_dirs(root: Path) -> None:
    """Remove directories left empty, deepest first; anything not ours stays (rmdir fails on it)."""
    if not root.is_dir():
        return
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(t[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
