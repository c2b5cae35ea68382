"""What `ckptvault recover --since TIME` would do: the undo of every change made to ckptvault's keys
after TIME, planned from the versions listing before anything is touched (docs/object-lock.md).

The plan only ever adds: it removes delete markers (which hold no data) and puts an older version of a
committed save's object back on top by a copy. It never deletes or rewrites a data version, so a locked
version is never touched and a wrong plan loses nothing. What it cannot undo safely is listed, not
acted on:
- a key created after TIME (a new save, a new catalog event: a leaked ckptvault key writes exactly what
  ckptvault writes) is kept, and reported for the caller to verify;
- newer data over a catalog or `_state/` object: compaction legitimately rewrites the catalog, and
  `catalog rebuild` makes it again from the saves' manifests, so putting an old one back could lose a
  legitimate event.
A save is committed at TIME when its manifest had a version then: only its objects are put back.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from ckptvault.catalog.layout import run_partition
from ckptvault.checkpoint.manifest import MANIFEST_NAME, parse_save_dir
from ckptvault.history.versions import (
    Change,
    ChangeKind,
    by_key,
    changes_since,
    current_at,
    first_written,
    same_etag,
    written_by,
)
from ckptvault.store.port import ObjectStore, ObjectVersion


class KeyRole(Enum):
    MANIFEST = "manifest"
    SAVE_OBJECT = "save object"  # a data object (or the validation report) of a save
    CATALOG = "catalog"
    STATE = "state"
    OTHER = "other"


def key_role(key: str, prefix: str) -> KeyRole:
    """What a key under the store's prefix holds, from the layout of docs/FORMAT.md."""
    base = prefix.strip("/")
    rel = key[len(base) + 1 :] if base and key.startswith(base + "/") else key
    if rel.startswith("_catalog/"):
        return KeyRole.CATALOG
    if rel.startswith("_state/"):
        return KeyRole.STATE
    parts = rel.split("/")
    if len(parts) >= 3 and parse_save_dir(parts[1]) is not None:
        return KeyRole.MANIFEST if parts[2:] == [MANIFEST_NAME] else KeyRole.SAVE_OBJECT
    return KeyRole.OTHER


def save_dir_of(key: str, prefix: str) -> str | None:
    """The save's key prefix (`<prefix>/<run>/step-.../`) a manifest or save object lies under."""
    base = prefix.strip("/")
    rel = key[len(base) + 1 :] if base and key.startswith(base + "/") else key
    parts = rel.split("/")
    if len(parts) < 3 or parse_save_dir(parts[1]) is None:
        return None
    return "/".join(([base] if base else []) + parts[:2]) + "/"


@dataclass(frozen=True)
class RemoveMarkers:
    """Delete these delete markers (by version id): the version current at TIME reads again."""

    key: str
    role: KeyRole
    markers: tuple[ObjectVersion, ...]
    uncovers: ObjectVersion  # the version that becomes current


@dataclass(frozen=True)
class PutBack:
    """Copy `version` onto its key as a new current version, checked against the save's manifest
    before and after, and locked and held as `version` is."""

    key: str
    role: KeyRole
    version: ObjectVersion
    over: ObjectVersion  # what reads now: the newer data, or a marker over it
    save: str  # the save's key prefix: its first manifest version is what the copy is checked against


@dataclass(frozen=True)
class Left:
    """A change the plan does not undo, with why."""

    key: str
    role: KeyRole
    kind: ChangeKind
    why: str


@dataclass(frozen=True)
class RecoveryPlan:
    remove_markers: tuple[RemoveMarkers, ...]
    put_back: tuple[PutBack, ...]
    created: tuple[Change, ...]  # keys new since TIME: kept, each to be verified by the caller
    left: tuple[Left, ...]
    # each committed save's first manifest version, by the save's key prefix: the reference a put-back
    # is checked against (a manifest is never legitimately rewritten)
    references: Mapping[str, ObjectVersion] = field(default_factory=dict)
    # (then, now): keys of a committed save that read as they did at TIME through a newer version (a
    # put-back copy): its lock is checked against the old version's, for a copy killed before its lock
    relock: tuple[tuple[ObjectVersion, ObjectVersion], ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing to do: a second `--apply` after a first that finished."""
        return not self.remove_markers and not self.put_back


def committed_saves(versions: Iterable[ObjectVersion], at: float, prefix: str) -> frozenset[str]:
    """The saves (key prefixes) whose manifest had a version current at `at`: committed then."""
    return frozenset(
        d
        for key, entries in by_key(versions).items()
        if key_role(key, prefix) is KeyRole.MANIFEST and current_at(entries, at) is not None
        if (d := save_dir_of(key, prefix))
    )


def plan_recovery(changes: Sequence[Change], prefix: str, committed: Collection[str]) -> RecoveryPlan:
    """The plan for `changes` (`changes_since` at TIME), `committed` the saves committed at TIME
    (`committed_saves`)."""
    remove: list[RemoveMarkers] = []
    put: list[PutBack] = []
    created: list[Change] = []
    left: list[Left] = []
    for c in changes:
        role = key_role(c.key, prefix)
        if c.kind is ChangeKind.CREATED or c.then is None:  # only CREATED has no `then`
            created.append(c)
        elif c.kind is ChangeKind.DELETED and role is not KeyRole.OTHER:
            remove.append(RemoveMarkers(c.key, role, c.markers_after, c.then))
        elif role in (KeyRole.MANIFEST, KeyRole.SAVE_OBJECT) and save_dir_of(c.key, prefix) in committed:
            put.append(PutBack(c.key, role, c.then, c.now, save_dir_of(c.key, prefix) or ""))
        else:
            why = {
                KeyRole.SAVE_OBJECT: "its save was not committed then: no manifest says which version is right",
                KeyRole.CATALOG: "compaction rewrites the catalog; `catalog rebuild` makes it again from the manifests",
                KeyRole.STATE: "the alert state is rewritten by every flow; it rebuilds itself",
            }.get(role, "not a save's, the catalog's or the alert state's (a lock probe's, or not ckptvault's)")
            left.append(Left(c.key, role, c.kind, why))
    return RecoveryPlan(tuple(remove), tuple(put), tuple(created), tuple(left))


def scope_prefixes(prefix: str, run: str | None) -> list[str]:
    """The key prefixes a recovery reads: the whole store's, or one run's saves and its catalog partition
    (and the alert state, which is the store's, not a run's, only with the whole store)."""
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    if run is None:
        return [base]
    return [f"{base}{run}/", f"{base}_catalog/{run_partition(run)}"]


def references(versions: Iterable[ObjectVersion], committed: Collection[str], prefix: str) -> dict[str, ObjectVersion]:
    """Each committed save's first manifest version, by the save's key prefix."""
    found = {}
    for key, entries in by_key(versions).items():
        save = save_dir_of(key, prefix)
        if not save or save not in committed or key_role(key, prefix) is not KeyRole.MANIFEST:
            continue
        if first := first_written(entries):
            found[save] = first
    return found


def read_as_then(
    versions: Iterable[ObjectVersion], at: float, prefix: str, committed: Collection[str], changed: Collection[str]
) -> list[tuple[ObjectVersion, ObjectVersion]]:
    """(then, now) for each key of a committed save that reads as it did at `at` (not in `changed`) through
    a version written since."""
    found = []
    for key, entries in sorted(by_key(versions).items()):
        now, then = entries[0], current_at(entries, at)
        if key in changed or then is None or now.delete_marker or written_by(now, at):
            continue
        if key_role(key, prefix) in (KeyRole.MANIFEST, KeyRole.SAVE_OBJECT) and save_dir_of(key, prefix) in committed:
            found.append((then, now))
    return found


def survey(
    store: ObjectStore,
    prefix: str,
    at: float,
    run: str | None = None,
    same_content: Callable[[ObjectVersion, ObjectVersion], bool] = same_etag,
) -> RecoveryPlan:
    """The recovery plan for the store's keys (or one run's) since `at`: read-only (ListObjectVersions,
    and whatever `same_content` reads to tell a put-back copy from newer data)."""
    versions = [v for p in scope_prefixes(prefix, run) for v in store.list_versions(p)]
    committed = committed_saves(versions, at, prefix)
    changes = changes_since(versions, at, same_content)
    plan = plan_recovery(changes, prefix, committed)
    return replace(
        plan,
        references=references(versions, committed, prefix),
        relock=tuple(read_as_then(versions, at, prefix, committed, {c.key for c in changes})),
    )
