"""Repair (`scrub --repair`; docs/FORMAT.md, "Replicas", "Scrub and repair"): each object a scrub left
bad or missing on a copy is rewritten from another copy whose object checks out, then checked again.

What it never does: write over an object that checks out (each is checked again just before it is
written: a scrub's finding may be stale), delete anything, or change a locked version. An object under
Object Lock is repaired by writing a new version beside the locked one, which a lock allows (it
protects versions, not keys); the new version gets the later of the locked version's retention and the
copy's manifest's (and a legal hold where either has one), so the repair is locked as the save is. A
locked object in a bucket without Object Lock (no versions to write beside it) is not repaired, and
the reason is said. A copy's manifest is repaired last, and only once every object of the save checks
out on that copy: a manifest commits a complete save (written conditionally where it is missing)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ckptvault.catalog import Event, events
from ckptvault.checkpoint.manifest import FIRST_SAVE, MANIFEST_NAME, Manifest, checkpoint_prefix
from ckptvault.config import LockConfig
from ckptvault.objectlock.save_lock import save_retention
from ckptvault.replication.scrub import PRIMARY, Copy, CopyReport, Manifests, SaveScrub, check_object, expected
from ckptvault.store import ObjectInfo, ObjectStore, PreconditionFailedError, Retention, StoreError


@dataclass(frozen=True)
class Repair:
    """One object rewritten, and checked after."""

    run: str
    step: int
    save: int
    store: str  # the copy repaired
    path: str
    source: str  # the copy it was read from
    why: str  # what was wrong
    bytes: int

    def event(self, flow_run: str = "") -> Event:
        return events.repaired(
            self.run, self.step, self.save, store=self.store, path=self.path, source=self.source, why=self.why,
            nbytes=self.bytes, flow_run=flow_run,
        )  # fmt: skip

    def as_dict(self) -> dict[str, str | int]:
        return {"run": self.run, "step": self.step, "save": self.save, "store": self.store, "path": self.path,
                "from": self.source, "why": self.why, "bytes": self.bytes}  # fmt: skip


def locked(head: ObjectInfo | None, now: float) -> bool:
    """Whether this version may not be deleted or changed now: a retention still running, or a legal hold."""
    if head is None:
        return False
    return head.legal_hold or (head.retention is not None and head.retention.until_ts > now)


def later(a: Retention | None, b: Retention | None, now: float) -> Retention | None:
    """The retention lasting longer of two (COMPLIANCE if either is: S3 never lets one be weakened),
    None when neither runs past `now`."""
    live = [r for r in (a, b) if r is not None and r.until_ts > now]
    if not live:
        return None
    until = max(r.until for r in live)
    mode = "COMPLIANCE" if any(r.mode == "COMPLIANCE" for r in live) else "GOVERNANCE"
    return Retention.of(mode, until)


def _tags(copy: Copy, m: Manifest) -> dict[str, str] | None:
    """The tags ingest puts on a primary's data objects (ckptvault/ingest/steps.py upload_tags, by which
    tiering and people find a save); a replica's objects carry none, as the replicate pass writes them."""
    if copy.name != PRIMARY:
        return None
    tags = {"run": m.run, "step": str(m.step), "format": m.format}
    if m.save != FIRST_SAVE:
        tags["save"] = str(m.save)
    return tags


def repair_save(
    result: SaveScrub,
    ms: Manifests,
    copies: Sequence[Copy],
    lock: LockConfig,
    *,
    clock: Callable[[], float] = time.time,
) -> list[Repair]:
    """Repair what `result` (check_save's, with `ms` its manifests) left on each copy, in place: a
    repaired path leaves the report's `left` and joins its `repaired`; one that is not repaired keeps
    its entry, its reason added. `copies`: every copy, the sources."""
    done: list[Repair] = []
    m = ms.reference
    if m is None:
        return done  # nothing says what the objects must be
    by_name = {c.name: c for c in copies}
    for rep in result.copies:
        if not rep.left:
            continue
        target = by_name[rep.store]
        base = checkpoint_prefix(target.prefix, m.run, m.step, m.save)
        mhead = _head(target.store, base + MANIFEST_NAME)
        for f in m.files:
            if f.path in rep.left:
                r = _repair_object(rep, target, base, f.path, expected(f), mhead, copies, m, clock)
                if r is not None:
                    done.append(r)
        if MANIFEST_NAME in rep.left:
            r = _repair_manifest(rep, target, base, ms, mhead, lock, clock)
            if r is not None:
                done.append(r)
    return done


def _head(store: ObjectStore, key: str) -> ObjectInfo | None:
    try:
        return store.head(key)
    except StoreError:
        return None


def _writable(target: Copy, head: ObjectInfo | None, now: float) -> str | None:
    """Why no new version may be written over `head`, or None."""
    if not locked(head, now):
        return None
    try:
        versioned = target.store.lock_status().enabled
    except StoreError as e:
        return f"it is locked, and whether the bucket keeps versions could not be read: {e}"
    if not versioned:
        return "it is locked and the bucket has no Object Lock, so no new version can be written beside it"
    return None


def _repair_object(
    rep: CopyReport,
    target: Copy,
    base: str,
    path: str,
    want: tuple[int, str | None],
    mhead: ObjectInfo | None,
    copies: Sequence[Copy],
    m: Manifest,
    clock: Callable[[], float],
) -> Repair | None:
    why = rep.left[path]
    size, crc = want
    if crc is None:
        rep.left[path] = f"{why}; not repairable: the manifest records no CRC32C of its stored bytes"
        return None
    key = base + path
    again = check_object(target.store, target.name, key, path, size, crc)
    if again.problem is None:
        del rep.left[path]  # it checks out now: never written over
        return None
    now = clock()
    head = _head(target.store, key)
    refused = _writable(target, head, now)
    if refused:
        rep.left[path] = f"{why}; not repairable: {refused}"
        return None
    retention = later(head.retention if head else None, mhead.retention if mhead else None, now)
    hold = bool((head and head.legal_hold) or (mhead and mhead.legal_hold))
    tried = []
    for src in copies:
        if src.name == target.name:
            continue
        skey = checkpoint_prefix(src.prefix, m.run, m.step, m.save) + path
        ok = check_object(src.store, src.name, skey, path, size, crc)
        if not ok.source:
            tried.append(f"{src.name}: {ok.problem.why if ok.problem else 'archived (not thawed to repair from)'}")
            continue
        try:
            target.store.with_retention(retention).copy_from(
                src.store, skey, key, size=size, crc32c=crc, tags=_tags(target, m)
            )
            if hold:
                target.store.put_legal_hold(key, True)
        except StoreError as e:
            tried.append(f"{src.name}: {e}")
            continue
        after = check_object(target.store, target.name, key, path, size, crc)
        if after.problem is not None:
            rep.left[path] = f"{why}; rewritten from {src.name}, and still bad: {after.problem.why}"
            return None
        del rep.left[path]
        rep.repaired.append(path)
        return Repair(m.run, m.step, m.save, target.name, path, src.name, why, size)
    sources = "; ".join(tried) or "there is no other copy"
    rep.left[path] = f"{why}; not repairable: no other copy holds a good one ({sources})"
    return None


def _repair_manifest(
    rep: CopyReport,
    target: Copy,
    base: str,
    ms: Manifests,
    mhead: ObjectInfo | None,
    lock: LockConfig,
    clock: Callable[[], float],
) -> Repair | None:
    why = rep.left[MANIFEST_NAME]
    others = [p for p in rep.left if p != MANIFEST_NAME]
    if others:
        rep.left[MANIFEST_NAME] = (
            f"{why}; not repaired: {len(others)} object(s) of the save are still bad here, and a manifest "
            "commits only a complete save"
        )
        return None
    key = base + MANIFEST_NAME
    raw = ms.reference_raw
    now = clock()
    try:
        if mhead is None:
            # a commit, as the replicate pass makes one: dated now, written conditionally
            # in the default class, as the replicate pass writes a manifest (docs/FORMAT.md, "Replicas")
            store = target.store.with_retention(save_retention(lock, now)).writing_in(None)
            store.put_bytes(key, raw, if_none_match=True, content_type="application/json")
        else:
            refused = _writable(target, mhead, now)
            if refused:
                rep.left[MANIFEST_NAME] = f"{why}; not repairable: {refused}"
                return None
            store = target.store.with_retention(later(mhead.retention, None, now)).writing_in(None)
            store.put_bytes(key, raw, content_type="application/json")
            if mhead.legal_hold:
                target.store.put_legal_hold(key, True)
        back = target.store.get_bytes(key)
    except PreconditionFailedError:
        rep.left[MANIFEST_NAME] = f"{why}; not repaired: another writer committed a manifest there meanwhile"
        return None
    except StoreError as e:
        rep.left[MANIFEST_NAME] = f"{why}; not repairable: {e}"
        return None
    if back != raw:
        rep.left[MANIFEST_NAME] = f"{why}; rewritten from {ms.reference_from}, and still differs"
        return None
    del rep.left[MANIFEST_NAME]
    rep.repaired.append(MANIFEST_NAME)
    m = ms.reference
    assert m is not None  # repair_save returns before any repair without one
    return Repair(m.run, m.step, m.save, target.name, MANIFEST_NAME, ms.reference_from, why, len(raw))
