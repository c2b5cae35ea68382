"""The replicate pass (docs/FORMAT.md, "Replicas", "The commit"): for each committed save a replica
should hold and does not (no manifest there), the primary's manifest is read, one LIST of the save's
prefix on the replica says what a killed pass already copied, the rest is streamed from the primary
(ObjectStore.copy_from: checked against the manifest's CRC32C before each upload completes), then
`_VALIDATION.json` where the primary has one, and last the manifest, byte-identical, written
conditionally. A file whose hot copy is still where ingest read it, unchanged, is read from there
instead (hot_copy.py; FORMAT.md's rule), and any doubt about it reads that file from the primary.
A save is recorded (a `replicated` event in the primary's catalog) only once its manifest is on the
replica. Rerun it after any failure: kept objects are not sent again.

Lock: the replica's objects are written with `[lock]`'s retention, the date computed when the save's
copy starts (save_lock.save_retention), as an ingest dates its own; before the manifest, the objects a
killed pass copied (their date is that pass's) are raised to it, as an ingest's rerun raises its own
(save_lock.to_extend), so every object of a committed save holds at least the date its `replicated`
event records. `_VALIDATION.json` stays unlocked, as on the primary (rewritten by every rerun)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ckptvault.catalog import Catalog, CheckpointState, events
from ckptvault.checkpoint.manifest import MANIFEST_NAME, VALIDATION_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.config import LockConfig, ReplicaConfig
from ckptvault.errors import CkptvaultError
from ckptvault.objectlock.save_lock import save_retention, to_extend
from ckptvault.replication.hot_copy import HotCopyUnusable, HotFile, hot_path
from ckptvault.replication.retention import install_retention
from ckptvault.store import ChecksumMismatchError, ObjectInfo, ObjectStore, StoreError
from ckptvault.store.stored_crc import stored_crc32c

# Files of one save copied at once: each copy keeps max_concurrency GETs and as many part uploads in
# flight, so four of them stay within the store's download_connections (4 * max_concurrency).
FILES_AT_ONCE = 4
# Incomplete multipart uploads under a save about to be copied, older than this, are a killed pass's:
# aborted rather than billed until the bucket's abort rule. The same six hours as ingest's
# (ckptvault/ingest/steps.py STALE_UPLOAD_SECONDS, not imported: a wing imports no other wing).
STALE_UPLOAD_SECONDS = 6 * 3600


@dataclass(frozen=True)
class ReplicatedSave:
    """One save committed on a replica by this pass."""

    store: str  # the replica's name
    run: str
    step: int
    save: int
    key: str  # the manifest's key on the replica
    bytes: int  # bytes copied by this pass (kept objects not counted)
    seconds: float
    copied: int  # objects sent (the manifest and _VALIDATION.json included)
    kept: int  # objects a killed earlier pass had already copied, checked by size and CRC32C
    retain_until: float | None = None  # the Object Lock date its objects were written with ([lock])
    hot_bytes: int = 0  # of `bytes`, read from the hot copy (the rest from the primary)
    hot_files: int = 0  # files read from the hot copy
    # "path: why" for each file whose hot copy was there but not used (changed, unreadable, another
    # CRC32C): read from the primary instead. A file simply gone (evicted) is not named.
    fallbacks: tuple[str, ...] = ()

    @property
    def primary_bytes(self) -> int:
        """Of `bytes`, read from the primary (the manifest and _VALIDATION.json always are)."""
        return self.bytes - self.hot_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.store, "run": self.run, "step": self.step, "save": self.save, "key": self.key,
            "bytes": self.bytes, "hot_bytes": self.hot_bytes, "primary_bytes": self.primary_bytes,
            "hot_files": self.hot_files, "fallbacks": list(self.fallbacks), "seconds": round(self.seconds, 3),
            "copied": self.copied, "kept": self.kept, "retain_until": self.retain_until,
        }  # fmt: skip


@dataclass(frozen=True)
class FailedSave:
    """A save this pass did not copy (it stays uncommitted on the replica), and why."""

    run: str
    step: int
    save: int
    error: str

    @property
    def label(self) -> str:
        return f"{self.run} step {self.step} save {self.save}"


@dataclass
class ReplicaPass:
    """What one pass did for one replica."""

    replica: str
    copied: list[ReplicatedSave] = field(default_factory=list)
    present: int = 0  # wanted saves the replica already held
    failures: list[FailedSave] = field(default_factory=list)
    retention: str = "unchanged"  # its retention rule on the replica's bucket: installed, removed, unchanged or missing
    retention_days: int | None = None  # the rule's `expire_after_days`
    # saves a killed pass committed on the replica (manifest there) without recording them: recorded
    # now (counted in `present` too; bytes and seconds 0, this pass copied nothing of them)
    recorded: list[ReplicatedSave] = field(default_factory=list)

    @property
    def failed(self) -> dict[str, str]:
        """Each save not copied, `run step N save K` -> why (the --json document's `failed`)."""
        return {f.label: f.error for f in self.failures}

    def as_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "copied": [s.as_dict() for s in self.copied],
            "present": self.present,
            "failed": self.failed,
            "retention": self.retention,
            "recorded": [s.as_dict() for s in self.recorded],
        }


def replicate(
    primary: ObjectStore,
    primary_prefix: str,
    replica_store: ObjectStore,
    replica: ReplicaConfig,
    saves: Sequence[CheckpointState],
    lock: LockConfig,
    *,
    catalog: Catalog | None = None,
    clock: Callable[[], float] = time.time,
    hot: bool = True,
) -> ReplicaPass:
    """Copy each of `saves` (ckptvault.tiering.replica_selection.wanted's choice) that the replica does
    not hold. A save that fails (a primary object whose bytes are not the manifest's, an error of either
    store) is left uncommitted and named in `failures`; the others go on. `catalog`: the primary's, where
    each committed save's `replicated` event goes (None: nothing recorded). `hot`: read each file from
    its hot copy where FORMAT.md's rule allows (False: `--from-primary`, every byte from the primary)."""
    out = ReplicaPass(replica.name, retention_days=replica.expire_after_days)
    # the replica's own retention, on its own bucket: before the copies, so none outlives it unruled
    try:
        out.retention = install_retention(replica_store, replica)
    except StoreError as e:
        raise StoreError(f"replica {replica.name}: cannot install its retention rule: {e}") from None
    rule_set = False  # the replica's abort rule, checked once a pass, before its first copy
    for s in saves:
        dst_base = checkpoint_prefix(replica.prefix, s.run, s.step, s.save)
        there = replica_store.head(dst_base + MANIFEST_NAME)
        if there is not None:
            out.present += 1
            if catalog is None:
                continue
            try:
                if not any(c.store == replica.name for c in s.replicas):
                    # committed by a pass killed before its event: the manifest is the truth, record it
                    # (as ingest's record_committed), with the date its objects were raised to before it
                    until = there.retention.until_ts if there.retention is not None else None
                    key = dst_base + MANIFEST_NAME
                    late = ReplicatedSave(replica.name, s.run, s.step, s.save, key, 0, 0.0, 0, 0, until)
                    catalog.append([_event(late, s, replica)])
                    out.recorded.append(late)
            except CkptvaultError as e:  # the copy stands; recording it is left to the next pass
                why = f"copied by an earlier pass, but not recorded (the next run records it): {e}"
                out.failures.append(FailedSave(s.run, s.step, s.save, why))
            continue
        try:
            if not rule_set and replica.manages_lifecycle:
                # Every bucket ckptvault writes to aborts incomplete multipart uploads after a day: a
                # killed pass's upload of an object its rerun sent again lies under a save no later pass
                # revisits (its manifest is there), so only the rule ends it. "external": replica.tf's.
                replica_store.ensure_abort_incomplete_mpu_rule(1)
                rule_set = True
            done = _replicate_save(primary, primary_prefix, replica_store, replica, s, lock, clock, hot)
        except CkptvaultError as e:
            out.failures.append(FailedSave(s.run, s.step, s.save, str(e)))
            continue
        out.copied.append(done)
        if catalog is not None:
            catalog.append([_event(done, s, replica)])
    return out


def _event(done: ReplicatedSave, s: CheckpointState, replica: ReplicaConfig) -> Any:
    return events.replicated(
        s.run, s.step, s.save, store=done.store, key=done.key, nbytes=done.bytes, seconds=done.seconds,
        storage_class=replica.storage_class or "STANDARD", retain_until=done.retain_until, hot_bytes=done.hot_bytes,
    )  # fmt: skip


def _replicate_save(
    primary: ObjectStore,
    primary_prefix: str,
    replica_store: ObjectStore,
    replica: ReplicaConfig,
    s: CheckpointState,
    lock: LockConfig,
    clock: Callable[[], float],
    hot: bool,
) -> ReplicatedSave:
    start = clock()
    t0 = time.monotonic()
    src_base = checkpoint_prefix(primary_prefix, s.run, s.step, s.save)
    dst_base = checkpoint_prefix(replica.prefix, s.run, s.step, s.save)
    raw = primary.get_bytes(src_base + MANIFEST_NAME)
    manifest = Manifest.from_json(raw, f"{primary.bucket}/{src_base}{MANIFEST_NAME}")
    retention = save_retention(lock, start)
    dst = replica_store.with_retention(retention)
    there = {o.key: o for o in dst.list(dst_base)}
    todo = [f for f in manifest.files if not _kept(dst, there.get(dst_base + f.path), f)]
    kept = len(manifest.files) - len(todo)
    if todo:
        dst.abort_multipart_uploads(dst_base, older_than=start - STALE_UPLOAD_SECONDS)

    def copy(f: FileEntry) -> tuple[int, bool, str | None]:
        """(bytes, read from the hot copy, why its hot copy was not used where it was there)"""
        why = None
        path = hot_path(manifest, f) if hot else None
        if path is not None:
            try:
                with HotFile(path, f) as src:
                    dst.copy_from(src, src.key, dst_base + f.path, size=f.size, crc32c=f.crc32c)
                return f.size, True, None
            except HotCopyUnusable as e:
                why = None if e.gone else str(e)
            except ChecksumMismatchError as e:
                # copy_from aborted its upload, so nothing of the hot attempt stays: the primary is read whole.
                # Its message blames "the primary's object" (its usual source): say what it means here.
                ours = str(e).startswith(f"{HotFile.bucket}/{path}:")  # copy_from names its source so
                why = (
                    f"{path}: its size and mtime are the manifest's but its CRC32C is not (changed in place)"
                    if ours
                    else f"{path}: the copy from it failed its check ({e})"
                )
        size, crc = _stored(primary, src_base + f.path, f)
        dst.copy_from(primary, src_base + f.path, dst_base + f.path, size=size, crc32c=crc)
        return size, False, why

    with ThreadPoolExecutor(max(1, min(FILES_AT_ONCE, len(todo))), thread_name_prefix="ckptvault-replicate") as pool:
        results = list(pool.map(copy, todo))
    copied_bytes = sum(n for n, _, _ in results)
    hot_bytes = sum(n for n, from_hot, _ in results if from_hot)
    hot_files = sum(1 for _, from_hot, _ in results if from_hot)
    fallbacks = tuple(why for _, _, why in results if why is not None)
    copied = len(todo)
    if retention is not None:
        # The manifest is written with the lock; the objects a killed pass copied carry that pass's
        # earlier date, and all of them are raised if this pass outlasted the date's margin.
        sent = {f.path for f in todo}
        keys = to_extend(
            retention, lock.days, clock(),
            [dst_base + f.path for f in manifest.files if f.path not in sent], [dst_base + p for p in sorted(sent)],
        )  # fmt: skip
        for key in keys:
            dst.extend_retention(key, retention)  # never shortens: a later date stays as it is
    if primary.head(src_base + VALIDATION_NAME) is not None:
        data = primary.get_bytes(src_base + VALIDATION_NAME)
        # unlocked, as the primary's (docs/FORMAT.md, "Object Lock": it stays mutable)
        replica_store.writing_in(None).put_bytes(dst_base + VALIDATION_NAME, data, content_type="application/json")
        copied, copied_bytes = copied + 1, copied_bytes + len(data)
    # Last, byte for byte, conditionally: a replica without it does not hold the save. In the server's
    # default class whatever the replica's `storage_class`, as the primary keeps its manifests hot: a
    # restore, scrub or rebuild reads it without a thaw (docs/FORMAT.md, "Replicas").
    dst.writing_in(None).put_bytes(dst_base + MANIFEST_NAME, raw, if_none_match=True, content_type="application/json")
    return ReplicatedSave(
        replica.name, s.run, s.step, s.save, dst_base + MANIFEST_NAME, copied_bytes + len(raw),
        time.monotonic() - t0, copied + 1, kept, retention.until_ts if retention else None, hot_bytes, hot_files,
        fallbacks,
    )  # fmt: skip


def _stored(primary: ObjectStore, key: str, f: FileEntry) -> tuple[int, str]:
    """The size and CRC32C the primary's object must have: the manifest's stored values for a
    compressed file, its size and CRC32C otherwise. A compressed entry from before `stored_crc32c`
    was recorded has no expected CRC: the primary's object is read back whole for one."""
    size, crc = f.stored_expected
    return size, crc or primary.read_crc32c(key)


def _kept(store: ObjectStore, obj: ObjectInfo | None, f: FileEntry) -> bool:
    """Whether the replica's object (from the LIST) is already this file's: its size and its stored
    CRC32C (ckptvault.store.stored_crc, as ingest's rerun reads it) are the manifest's."""
    if obj is None:
        return False
    want_size = f.size if f.codec == "none" else f.stored_bytes
    want_crc = f.crc32c if f.codec == "none" else f.stored_crc32c
    if obj.size != want_size or want_crc is None:
        return False
    return stored_crc32c(store, obj.key) == want_crc
