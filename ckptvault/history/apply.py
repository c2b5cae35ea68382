"""Carrying a recovery plan out in the bucket: `ckptvault recover --since TIME --apply`
(docs/object-lock.md, "After an attack").

Three kinds of step, each of which only adds to the bucket's history:
- remove the delete markers the plan names, by the version ids the listing gave them (a version id names
  one entry for ever, so a marker cannot have become data since it was listed);
- put a committed save's overwritten object back: the version current at TIME is streamed into a new
  current version (`ObjectStore.copy_from`, the path replicas are written by), its CRC32C compared with
  the save's first manifest version before the upload completes, so a version that is not what the
  commit wrote is never made current. Not CopyObject: the servers measured differ in what a copy of a
  version carries (docs/object-lock.md), and a copy would still need reading to be checked;
- lock and hold the new version as the one it copies was (a copy is a new, unlocked version otherwise).

The order (save objects, then manifests, then the catalog and the alert state) makes a save reappear only
once its objects are back. Every step is decided again from a fresh listing on each run, which is what
makes a second run do nothing and a run killed at any point converge when run again: a removed marker is
no longer listed, a put-back key now reads as it did at TIME (`ContentCheck`), and a copy killed before
its lock is found by `weaker_lock` and locked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.errors import CkptvaultError
from ckptvault.history.recovery import KeyRole, PutBack, RecoveryPlan, RemoveMarkers
from ckptvault.history.tamper import ServerSettle
from ckptvault.history.versions import same_etag
from ckptvault.store import ObjectStore, ObjectVersion, Retention, StoreError


@dataclass(frozen=True)
class Step:
    """One thing done in the bucket, reported as it is done (`recover --apply` prints each)."""

    action: str  # "removed markers", "put back", "relocked"
    key: str
    detail: str


@dataclass(frozen=True)
class Failure:
    key: str
    why: str


@dataclass(frozen=True)
class Applied:
    done: tuple[Step, ...]
    failed: tuple[Failure, ...]


# Save objects before their manifests, so that a save reappears (its manifest reads again) only once its
# objects do; the catalog last, as ingest commits a save before its catalog event.
_ORDER = {KeyRole.SAVE_OBJECT: 0, KeyRole.MANIFEST: 1, KeyRole.CATALOG: 2, KeyRole.STATE: 3, KeyRole.OTHER: 4}


@dataclass(frozen=True)
class Reference:
    """What a save's commit wrote: its manifest's first data version, parsed, and that version's bytes."""

    version: ObjectVersion
    manifest: Manifest
    crc32c: str  # of the manifest's bytes


def read_reference(store: ObjectStore, version: ObjectVersion) -> Reference:
    data = store.pinned([version]).get_bytes(version.key)
    manifest = Manifest.from_json(data, origin=f"s3://{store.bucket}/{version.key} (version {version.version_id})")
    return Reference(version, manifest, to_b64(crc32c_update(data)))


class ContentCheck:
    """Whether two versions of a key hold the same bytes: the same ETag, or else the same size and the
    same CRC32C as the server computed it or read from the bytes (`tamper.ServerSettle.crc`: a put-back
    copy's ETag differs from its source's where the parts differ; metadata is never trusted, as a writer
    with the key could forge it). An archived version that keeps no checksum counts as changed, so its
    put-back fails alone, naming it, while every other step still runs."""

    def __init__(self, store: ObjectStore) -> None:
        self._versions = ServerSettle(store)

    def __call__(self, now: ObjectVersion, then: ObjectVersion) -> bool:
        if same_etag(now, then):
            return True
        if now.delete_marker or then.delete_marker or now.size != then.size:
            return False
        have = self._versions.crc(now)
        return have is not None and have == self._versions.crc(then)


def weaker_lock(store: ObjectStore, then: ObjectVersion, now: ObjectVersion) -> tuple[Retention | None, bool]:
    """What `now` (a copy of `then`) lacks of `then`'s lock: the retention to raise it to (None: it has
    as much, or `then`'s has passed) and whether its legal hold must be set."""
    a = store.pinned([then]).head(then.key)
    b = store.pinned([now]).head(now.key)
    if a is None or b is None:
        return None, False
    raise_to = None
    if a.retention is not None and a.retention.until_ts > time.time():
        raise_to = a.retention.over(b.retention)
    return raise_to, a.legal_hold and not b.legal_hold


def apply_plan(
    store: ObjectStore,
    plan: RecoveryPlan,
    on_step: Callable[[Step], None] = lambda s: None,
) -> Applied:
    """Carry `plan` out; one step's failure is reported and the others still run (exit 1 then; a rerun
    retries what failed)."""
    done: list[Step] = []
    failed: list[Failure] = []
    read: dict[str, Reference | CkptvaultError] = {}

    def step(s: Step) -> None:
        done.append(s)
        on_step(s)

    def reference(save: str) -> Reference:
        if save not in read:
            first = plan.references.get(save)
            try:
                if first is None:
                    raise StoreError(f"{save}: no committed manifest version to check it against")
                read[save] = read_reference(store, first)
            except CkptvaultError as e:
                read[save] = e
        found = read[save]
        if isinstance(found, CkptvaultError):
            raise found
        return found

    work: list[RemoveMarkers | PutBack] = [*plan.remove_markers, *plan.put_back]
    work.sort(key=lambda w: (_ORDER[w.role], w.key))
    for w in work:
        try:
            if isinstance(w, RemoveMarkers):
                for m in w.markers:
                    store.remove_delete_marker(w.key, m.version_id)
                step(Step("removed markers", w.key, f"{len(w.markers)}; version {w.uncovers.version_id} reads again"))
            else:
                put_back(store, w, reference(w.save))
                step(Step("put back", w.key, f"version {w.version.version_id}, checked against the manifest"))
        except CkptvaultError as e:
            failed.append(Failure(w.key, str(e)))
    for then, now in plan.relock:
        try:
            retention, hold = weaker_lock(store, then, now)
            if retention is not None:
                store.extend_retention(now.key, retention)
            if hold:
                store.put_legal_hold(now.key, True)
            if retention is not None or hold:
                what = " and ".join(w for w, on in (("retention", retention is not None), ("legal hold", hold)) if on)
                step(Step("relocked", now.key, f"the {what} of version {then.version_id}"))
        except CkptvaultError as e:
            failed.append(Failure(now.key, str(e)))
    return Applied(tuple(done), tuple(failed))


def put_back(store: ObjectStore, p: PutBack, ref: Reference) -> None:
    """Make `p.version` current again as a new version, checked against `ref` and locked and held as
    `p.version` is."""
    source = store.pinned([p.version])
    head = source.head(p.key)
    if head is None:
        raise StoreError(f"s3://{store.bucket}/{p.key}: version {p.version.version_id} is no longer in the bucket")
    size, crc = expected_of(p, ref)
    if crc is None:  # the validation report, or a compressed entry from before stored_crc32c
        crc = source.read_crc32c(p.key)
    retention = head.retention if head.retention and head.retention.until_ts > time.time() else None
    target = store.with_retention(retention) if retention is not None else store
    target.copy_from(source, p.key, p.key, size=size, crc32c=crc)
    if retention is not None:
        store.extend_retention(p.key, retention)  # where the server dropped the lock the upload asked for
    if head.legal_hold:
        store.put_legal_hold(p.key, True)


def expected_of(p: PutBack, ref: Reference) -> tuple[int, str | None]:
    """The size and CRC32C the put-back version must have. The manifest: the bytes of its first version,
    and only that version is put back (a manifest is never legitimately rewritten). A data object: its
    entry in that manifest. An object no manifest lists (the validation report): its size, and no
    CRC32C to check (it holds no checkpoint data and every ingest rerun rewrites it)."""
    if p.role is KeyRole.MANIFEST:
        if p.version.version_id != ref.version.version_id and not same_etag(p.version, ref.version):
            raise StoreError(
                f"{p.key}: the version current then ({p.version.version_id}) is not the one the save's commit "
                f"wrote ({ref.version.version_id}); not put back: read it with `ckptvault restore --as-of`"
            )
        return ref.version.size, ref.crc32c
    rel = p.key[len(p.save) :]
    entry = next((f for f in ref.manifest.files if f.path == rel), None)
    if entry is None:
        return p.version.size, None
    return entry.stored_expected


__all__: Sequence[str] = [
    "Applied", "ContentCheck", "Failure", "Reference", "Step", "apply_plan", "put_back", "weaker_lock",
]  # fmt: skip
