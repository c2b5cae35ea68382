"""Scrub (docs/FORMAT.md, "Replicas", "Scrub and repair"): every object of a save checked on every copy
that holds it, against the save's manifest, without a download where the store keeps a CRC32C of the
object, and every problem reported, per copy (a checker that reports all, not the first: restic's
`check`). Which saves a scrub takes is a rotation over the catalog's `scrubbed` events, as drills rotate
(ckptvault/restore/drill.py, not imported: a wing imports no other wing):

- Scrubbable: verified, not expired (superseded saves included: they are in the store, and a replica
  may hold them).
- Every scrub takes each save whose last scrub left a problem (on any of the copies scrubbed), on top
  of the sample, until a scrub finds it clean.
- Then `sample` from a queue of the rest: never scrubbed first (oldest upload first), then least recently
  scrubbed, ties by (run, step, save). A scrubbed save goes to the back.

Guarantee: with N scrubbable saves and a sample of s, every one is scrubbed at least once in every
ceil(N / s) consecutive scrubs (a scrubbed save goes to the back; one passed over keeps its place and
at most N - 1 are ahead of it). The default sample is ceil(N / COVER_RUNS): every save within
COVER_RUNS scrubs (a week at the daily schedule). Read with `--replica`, "scrubbed" means scrubbed on
every copy this scrub checks: a save's place is its least recently scrubbed of them."""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from ckptvault.catalog import CheckpointState, Event
from ckptvault.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.errors import InvalidArgumentError
from ckptvault.history.versions import by_key, first_written
from ckptvault.store import ObjectFrozenError, ObjectStore, ObjectVersion, StoreError
from ckptvault.store.stored_crc import kept_crc32c

PRIMARY = "primary"  # how the [store] is named among the copies ([[replicas]] names may not be this)
COVER_RUNS = 7  # the default sample covers every save within this many scrubs
# HEADs of one copy in flight: a save of a thousand shards is a thousand round trips.
HEADS_AT_ONCE = 16

Key = tuple[str, int, int]
Kind = Literal["missing", "size", "crc", "manifest missing", "manifest differs", "unreadable"]
# How an object was checked: its stored CRC32C from a HEAD (or its tag), read back whole, or only its
# size (archived and the store keeps no CRC32C of it, or the manifest records none).
How = Literal["head", "read", "size only"]


@dataclass(frozen=True)
class Copy:
    """One copy of the checkpoints: the primary or a replica."""

    name: str  # PRIMARY or the replica's name
    store: ObjectStore
    prefix: str
    # a replica's `expire_after_days`: its bucket's lifecycle deletes each object that long after it was
    # copied, which the tamper check must not take for an attack
    expire_after_days: int | None = None


@dataclass(frozen=True)
class Problem:
    store: str
    path: str  # the manifest's path of the object, or _MANIFEST.json
    kind: Kind
    why: str  # for people: what was found and what the manifest says

    def text(self) -> str:
        return f"{self.path}: {self.why}"

    def as_dict(self) -> dict[str, str]:
        return {"store": self.store, "path": self.path, "kind": self.kind, "why": self.why}


@dataclass(frozen=True)
class ObjectCheck:
    """One object of one copy against the manifest."""

    path: str
    problem: Problem | None
    how: How
    frozen: bool = False

    @property
    def source(self) -> bool:
        """Good to repair another copy from: it checked out by its CRC32C and can be read now."""
        return self.problem is None and self.how != "size only" and not self.frozen


@dataclass
class CopyReport:
    store: str
    held: bool  # its manifest is there
    checks: list[ObjectCheck] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # what it found, the manifest's own included
    repaired: list[str] = field(default_factory=list)  # paths rewritten by --repair (then checked again)
    left: dict[str, str] = field(default_factory=dict)  # path -> why it is still bad (after --repair: why not repaired)

    @property
    def ok(self) -> bool:
        return not self.left

    def counts(self) -> dict[str, int]:
        return {
            "objects": len(self.checks),
            "read": sum(c.how == "read" for c in self.checks),
            "size_only": sum(c.how == "size only" for c in self.checks),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.store, "held": self.held, "ok": self.ok, **self.counts(),
            "problems": [p.as_dict() for p in self.problems], "repaired": self.repaired,
            "left": [{"path": p, "why": w} for p, w in self.left.items()],
        }  # fmt: skip


@dataclass
class SaveScrub:
    run: str
    step: int
    save: int
    copies: list[CopyReport] = field(default_factory=list)

    @property
    def key(self) -> Key:
        return (self.run, self.step, self.save)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.copies)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run, "step": self.step, "save": self.save, "ok": self.ok,
            "copies": [c.as_dict() for c in self.copies],
        }  # fmt: skip


# -- what each object must be ----------------------------------------------------------------------


def expected(f: FileEntry) -> tuple[int, str | None]:
    """The size and CRC32C of the object's stored bytes (FileEntry.stored_expected)."""
    return f.stored_expected


def check_object(store: ObjectStore, name: str, key: str, path: str, size: int, crc: str | None) -> ObjectCheck:
    """One object against its expected size and CRC32C. An archived object not restored is checked by
    its HEAD only, never thawed; one whose CRC32C the store keeps nowhere is read back whole."""

    def bad(kind: Kind, why: str, how: How = "head", frozen: bool = False) -> ObjectCheck:
        return ObjectCheck(path, Problem(name, path, kind, why), how, frozen)

    try:
        head = store.head(key)
        if head is None:
            return bad("missing", "missing")
        frozen = head.frozen
        if head.size != size:
            return bad("size", f"size mismatch: {head.size} bytes, the manifest says {size}", frozen=frozen)
        if crc is None:
            return ObjectCheck(path, None, "size only", frozen)
        how: How = "head"
        have = kept_crc32c(store, head)
        if have is None and frozen:
            return ObjectCheck(path, None, "size only", True)
        if have is None:
            try:
                have, how = store.read_crc32c(key), "read"
            except ObjectFrozenError:  # archived where the HEAD did not say so (a cloud tier)
                return ObjectCheck(path, None, "size only", True)
    except StoreError as e:
        return bad("unreadable", f"unreadable: {e}")
    if have != crc:
        return bad("crc", f"CRC32C mismatch: {have}, the manifest says {crc}", how, frozen)
    return ObjectCheck(path, None, how, frozen)


# -- one save -----------------------------------------------------------------------------------------


@dataclass
class Manifests:
    """The save's manifest as each copy holds it, and the one every copy is checked against: the
    primary's where it reads as a manifest, else the first replica's that does. On a bucket that keeps
    versions the reference is that copy's FIRST manifest version, the one the save's commit wrote (a
    manifest is never legitimately rewritten), never whichever reads today: a key that overwrote the
    manifest must not make a repair copy its objects over a good copy."""

    raw: dict[str, bytes | None]  # copy -> its manifest's bytes; None: missing
    unreadable: dict[str, str]  # copy -> why its manifest could not be read or parsed
    reference: Manifest | None = None
    reference_raw: bytes = b""
    reference_from: str = ""
    reference_version: ObjectVersion | None = None  # the first manifest version read, on a versioned bucket

    def reference_name(self) -> str:
        first = " first committed" if self.reference_version is not None else ""
        return f"the {self.reference_from}'s{first} manifest"


def first_manifest(store: ObjectStore, key: str, current: bytes | None) -> tuple[bytes, ObjectVersion] | None:
    """The bytes of the manifest's first data version and that version (None: it has none), read by its
    version id; `current`, the bytes that read today, stand for them when that version is the current one."""
    first = first_written(by_key(v for v in store.list_versions(key) if v.key == key).get(key, []))
    if first is None:
        return None
    if first.latest and current is not None:
        return current, first
    return store.pinned([first]).get_bytes(key), first


def read_manifests(
    copies: Sequence[Copy], run: str, step: int, save: int, versioned: Collection[str] = ()
) -> Manifests:
    """`versioned`: the copies whose bucket keeps versions (their first manifest version is the
    reference candidate)."""
    out = Manifests({}, {})
    for c in copies:
        key = checkpoint_prefix(c.prefix, run, step, save) + MANIFEST_NAME
        origin = f"{c.store.bucket}/{key}"
        raw: bytes | None = None
        try:
            if c.store.head(key) is not None:
                raw = c.store.get_bytes(key)
                m: Manifest | None = Manifest.from_json(raw, origin)
            else:
                m = None
            out.raw[c.name] = raw
        except Exception as e:  # a StoreError, or a manifest that does not parse: reported on that copy
            out.unreadable[c.name] = str(e)
            m = None
        if out.reference is not None:
            continue
        if c.name in versioned:
            try:
                found = first_manifest(c.store, key, raw)
                if found is not None:
                    ref_raw, version = found
                    ref = Manifest.from_json(ref_raw, f"{origin} (version {version.version_id})")
                    out.reference, out.reference_raw, out.reference_from = ref, ref_raw, c.name
                    out.reference_version = version
                    continue
            except Exception:  # unreadable here: the next copy is the candidate, as after a bad manifest
                continue
        if m is not None and raw is not None:
            out.reference, out.reference_raw, out.reference_from = m, raw, c.name
    return out


def check_save(
    copies: Sequence[Copy],
    checked: Sequence[str],
    s: CheckpointState,
    replicated: Iterable[str],
    versioned: Collection[str] = (),
) -> tuple[SaveScrub, Manifests]:
    """Every object of save `s` on each copy named in `checked` that holds it: the primary always (the
    catalog says it is committed there), a replica where its manifest is there or a `replicated` event
    (`replicated`: the copies named by one) says it was. `copies` are every copy, the reference's
    candidates (`versioned`: those whose bucket keeps versions). Nothing is written."""
    out = SaveScrub(s.run, s.step, s.save)
    ms = read_manifests(copies, s.run, s.step, s.save, versioned)
    recorded = set(replicated) | {PRIMARY}
    for c in copies:
        if c.name not in checked:
            continue
        raw = ms.raw.get(c.name)
        why = ms.unreadable.get(c.name)
        if raw is None and why is None and c.name not in recorded:
            continue  # the replica does not hold this save, and was never said to
        rep = CopyReport(c.name, raw is not None)
        out.copies.append(rep)
        if why is not None:
            rep.problems.append(Problem(c.name, MANIFEST_NAME, "unreadable", f"unreadable: {why}"))
        elif raw is None:
            said = (
                "the catalog says the save is committed here"
                if c.name == PRIMARY
                else "a replicated event says it was copied here"
            )
            rep.problems.append(Problem(c.name, MANIFEST_NAME, "manifest missing", f"missing ({said})"))
        elif ms.reference is not None and raw != ms.reference_raw:
            differs = f"differs from {ms.reference_name()}"
            rep.problems.append(Problem(c.name, MANIFEST_NAME, "manifest differs", differs))
        if ms.reference is None:
            continue  # no copy has a readable manifest: nothing to check the objects against
        base = checkpoint_prefix(c.prefix, s.run, s.step, s.save)

        def one(f: FileEntry, c: Copy = c, base: str = base) -> ObjectCheck:
            size, crc = expected(f)
            return check_object(c.store, c.name, base + f.path, f.path, size, crc)

        files = ms.reference.files
        with ThreadPoolExecutor(max(1, min(HEADS_AT_ONCE, len(files))), thread_name_prefix="ckptvault-scrub") as pool:
            rep.checks = list(pool.map(one, files))
        rep.problems += [ch.problem for ch in rep.checks if ch.problem is not None]
    for rep in out.copies:
        rep.left = {p.path: p.why for p in rep.problems}
        if ms.reference is None:
            rep.left.setdefault(MANIFEST_NAME, "no copy holds a readable manifest of this save")
    return out, ms


def scrubbed_events(result: SaveScrub, flow_run: str = "") -> list[Event]:
    """One `scrubbed` event per copy checked (docs/FORMAT.md, "The catalog")."""
    from ckptvault.catalog import events

    return [
        events.scrubbed(
            result.run, result.step, result.save, store=c.store, ok=c.ok, found=len(c.problems),
            repaired=len(c.repaired), problems=[f"{p}: {w}" for p, w in c.left.items()], flow_run=flow_run,
            **c.counts(),
        )
        for c in result.copies
    ]  # fmt: skip


# -- the rotation -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """What the catalog's events say of one save, for the rotation and for which copies hold it."""

    scrubbed_at: dict[str, float]  # copy -> when a scrub last checked it there
    ok: dict[str, bool]  # copy -> whether that scrub left it clean
    replicated: frozenset[str]  # the replicas a `replicated` event names


def history(events: Iterable[Event]) -> dict[Key, History]:
    """From the events in time order (Catalog.events)."""
    at: dict[Key, dict[str, float]] = {}
    ok: dict[Key, dict[str, bool]] = {}
    rep: dict[Key, set[str]] = {}
    for e in events:
        if e.event not in ("scrubbed", "replicated"):
            continue
        store = _store_of(e.detail)
        if not store:
            continue
        k = (e.run, e.step, e.save)
        if e.event == "replicated":
            rep.setdefault(k, set()).add(store)
        else:
            at.setdefault(k, {})[store] = e.at
            ok.setdefault(k, {})[store] = bool(e.ok)
    keys = set(at) | set(rep)
    return {k: History(at.get(k, {}), ok.get(k, {}), frozenset(rep.get(k, ()))) for k in keys}


def _store_of(detail: str) -> str:
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return ""
    return str(d.get("store") or "") if isinstance(d, dict) else ""


def is_scrubbable(s: CheckpointState) -> bool:
    return s.verified and not s.expired


def default_sample(scrubbable: int) -> int:
    return max(1, math.ceil(scrubbable / COVER_RUNS))


@dataclass(frozen=True)
class Selection:
    chosen: tuple[CheckpointState, ...]  # this scrub's saves, sorted by key
    rechecked: frozenset[Key]  # their last scrub left a problem: on top of the sample
    queued: tuple[Key, ...]  # the sample, in queue order
    scrubbable: int
    sample: int
    window: int  # every scrubbable save is scrubbed at least once in every `window` consecutive scrubs

    def as_dict(self) -> dict[str, Any]:
        return {"scrubbable": self.scrubbable, "sample": self.sample, "window": self.window,
                "rechecked": len(self.rechecked)}  # fmt: skip


def select(
    states: Sequence[CheckpointState], past: dict[Key, History], stores: Sequence[str], sample: int | None
) -> Selection:
    """This scrub's saves (see the module's docstring): every save whose last scrub on one of `stores`
    left a problem, then `sample` (None: default_sample) from the queue. Without the primary among
    `stores`, only the saves a `replicated` event names one of them for. Deterministic."""
    able = sorted((s for s in states if is_scrubbable(s)), key=lambda s: s.key)
    if PRIMARY not in stores:
        # replicas only: the saves a `replicated` event puts there (the others would never be recorded
        # scrubbed on them, and would wait at the front of the queue forever)
        able = [s for s in able if (h := past.get(s.key)) is not None and h.replicated & set(stores)]
    share = default_sample(len(able)) if sample is None else sample
    if share < 1:
        raise InvalidArgumentError(f"--sample must be at least 1, got {share}")

    def last(s: CheckpointState) -> float | None:
        # when a scrub last took this save: each scrub checks every copy of `stores` holding it at once
        h = past.get(s.key)
        ats = [a for a in (h.scrubbed_at.get(n) for n in stores) if a is not None] if h else []
        return max(ats) if ats else None

    def failed(s: CheckpointState) -> bool:
        h = past.get(s.key)
        return h is not None and any(not h.ok.get(n, True) for n in stores)

    recheck = {s.key for s in able if failed(s)}
    queue = sorted(
        (s for s in able if s.key not in recheck),
        key=lambda s: (last(s) is not None, last(s) or s.uploaded_at or 0.0, s.run, s.step, s.save),
    )
    queued = [s.key for s in queue[:share]]
    picked = recheck | set(queued)
    return Selection(
        chosen=tuple(s for s in able if s.key in picked),
        rechecked=frozenset(recheck),
        queued=tuple(queued),
        scrubbable=len(able),
        sample=share,
        window=max(1, math.ceil(len(able) / share)),
    )
