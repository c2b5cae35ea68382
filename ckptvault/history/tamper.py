"""Tampering: a committed save one of whose objects (or its manifest) reads differently now than when the
save was committed, while the version its commit covered is still in the bucket (docs/object-lock.md,
"Noticed: the tamper check"). What scrub reports as `tampered`, and alerts on.

The reference is the save's FIRST manifest version (`first_written`: a manifest is never legitimately
rewritten), never the manifest that reads today; a data object's reference is the version that was
current when that manifest was written (an upload retried before the commit leaves older versions, which
the commit never covered). Decided from ListObjectVersions first:
- a delete marker on top of the reference: tampered (a tier expiry deletes too: a save the catalog
  records expired is the caller's to leave out, and a replica's own lifecycle expiry is told by its age);
- a newer data version of another size than the manifest says: tampered;
- a newer data version with the reference's ETag: the same bytes;
- a newer version of the same size and another ETag: the bytes decide (`Settle`): a recovery's put-back,
  a repair and a tier move are copies of the same bytes whose ETag can differ (other part sizes). The
  CRC32C compared is one the server computed (its full-object checksum) or one read from the bytes,
  never metadata or tags, which any writer with the key can forge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ckptvault.checkpoint.manifest import Manifest, checkpoint_prefix, parse_save_dir
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.errors import CkptvaultError
from ckptvault.history.recovery import KeyRole, key_role, save_dir_of
from ckptvault.history.versions import by_key, current_at, first_written, same_etag, written_by
from ckptvault.store import ObjectFrozenError, ObjectStore, ObjectVersion

Change = Literal["deleted", "overwritten"]
# (the newer version, the CRC32C the reference's bytes have, the reference version) -> whether the newer
# version holds the same bytes; None when that cannot be told without a thaw (archived, and the server
# keeps no checksum of it)
Settle = Callable[[ObjectVersion, str | None, ObjectVersion], bool | None]


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class TamperedKey:
    """One key of a committed save that no longer reads as its commit wrote it."""

    key: str
    change: Change
    at: float  # the LastModified of what reads now: the delete marker, or the newer version
    version_id: str  # of that marker or version
    reference: str  # the version id the commit covered (still in the bucket)

    def text(self) -> str:
        return f"{self.key}: {self.change} at {utc(self.at)} (version {self.version_id} over {self.reference})"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "change": self.change, "at": utc(self.at), "version_id": self.version_id,
                "reference": self.reference}  # fmt: skip


@dataclass(frozen=True)
class TamperedSave:
    store: str  # the copy ("primary" or a replica's name)
    run: str
    step: int
    save: int
    committed_at: float  # the LastModified of its first manifest version
    keys: tuple[TamperedKey, ...]

    @property
    def first_at(self) -> float:
        """When the earliest change still reading now was made: `recover --since` a moment before it."""
        return min(k.at for k in self.keys)

    def as_dict(self) -> dict[str, Any]:
        return {"store": self.store, "run": self.run, "step": self.step, "save": self.save,
                "committed_at": utc(self.committed_at), "first_at": utc(self.first_at),
                "keys": [k.as_dict() for k in self.keys]}  # fmt: skip


def judge_key(
    entries: Sequence[ObjectVersion],
    reference: ObjectVersion,
    size: int,
    crc32c: str | None,
    settle: Settle,
    expires_after: float | None = None,
) -> TamperedKey | None:
    """One key (its entries newest first) against the version its commit covered, `reference`, which
    must be `size` bytes with CRC32C `crc32c` (None: the manifest records none; the reference's own
    bytes then decide). `expires_after` (seconds): a delete marker at least that long after the
    reference is a lifecycle expiry (a replica's `expire_after_days`), not an attack."""
    top = entries[0]
    if top.version_id == reference.version_id:
        return None
    if top.delete_marker:
        if expires_after is not None and top.last_modified >= reference.last_modified + expires_after:
            return None
        return TamperedKey(top.key, "deleted", top.last_modified, top.version_id, reference.version_id)
    if top.size == size and (same_etag(top, reference) or settle(top, crc32c, reference) is not False):
        return None  # the same bytes (a put-back or a repair), or an archived copy a read cannot settle
    return TamperedKey(top.key, "overwritten", top.last_modified, top.version_id, reference.version_id)


def changed_since_commit(entries_by_key: Mapping[str, Sequence[ObjectVersion]], committed_at: float) -> bool:
    """Whether any key of a save has an entry written after its commit: the listing's cheap test, without
    which nothing of the save is read (almost every save, almost every scrub)."""
    return any(not written_by(entries[0], committed_at) for entries in entries_by_key.values())


def judge_save(
    entries_by_key: Mapping[str, Sequence[ObjectVersion]],
    save_dir: str,
    manifest_first: ObjectVersion,
    manifest: Manifest,
    manifest_crc32c: str,
    settle: Settle,
    expires_after: float | None = None,
) -> list[TamperedKey]:
    """Every key of one committed save (`save_dir`, its key prefix; `entries_by_key` its keys' entries,
    newest first) that reads differently from what its commit wrote: the manifest against its first
    version (`manifest_first`, whose bytes parse as `manifest` and have CRC32C `manifest_crc32c`), each
    object that manifest names against its version current at the commit. A key the manifest does not
    name (the validation report, a stray) is not judged. Pure, but for `settle`."""
    found: list[TamperedKey] = []
    committed_at = manifest_first.last_modified
    m_entries = entries_by_key.get(manifest_first.key, ())
    if m_entries and (t := judge_key(m_entries, manifest_first, manifest_first.size, manifest_crc32c, settle,
                                      expires_after)):  # fmt: skip
        found.append(t)
    for f in manifest.files:
        entries = entries_by_key.get(save_dir + f.path, ())
        then = current_at(entries, committed_at) if entries else None
        if then is None:
            continue  # absent at the commit: the ordinary scrub reports a missing object, not this
        size, crc = f.stored_expected
        if t := judge_key(entries, then, size, crc, settle, expires_after):
            found.append(t)
    return found


@dataclass(frozen=True)
class SaveVersions:
    """One save's keys in a versions listing."""

    run: str
    step: int
    save: int
    save_dir: str
    manifest_first: ObjectVersion
    entries: dict[str, list[ObjectVersion]]


def saves_in(versions: Iterable[ObjectVersion], prefix: str) -> list[SaveVersions]:
    """Every save of a listing whose manifest has a data version (it was committed once), by key."""
    grouped: dict[str, dict[str, list[ObjectVersion]]] = {}
    for key, entries in by_key(versions).items():
        if key_role(key, prefix) in (KeyRole.MANIFEST, KeyRole.SAVE_OBJECT) and (d := save_dir_of(key, prefix)):
            grouped.setdefault(d, {})[key] = entries
    out = []
    for d, keys in sorted(grouped.items()):
        run, _, name = d.rstrip("/").rpartition("/")
        run = run.rpartition("/")[2]
        step_save = parse_save_dir(name)
        m_key = next((k for k in keys if key_role(k, prefix) is KeyRole.MANIFEST), None)
        first = first_written(keys[m_key]) if m_key else None
        if step_save is None or first is None:
            continue
        out.append(SaveVersions(run, step_save[0], step_save[1], d, first, keys))
    return sorted(out, key=lambda s: (s.run, s.step, s.save))


@dataclass
class TamperSurvey:
    """What one copy's tamper check found."""

    store: str
    tampered: list[TamperedSave] = field(default_factory=list)
    checked: int = 0  # committed saves judged
    read: int = 0  # of them, those whose listing showed a change since the commit (their manifest read)
    # saves the check could not judge, with why (a first manifest version that does not read or parse)
    unjudged: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"store": self.store, "checked": self.checked, "read": self.read,
                "tampered": [t.as_dict() for t in self.tampered], "unjudged": self.unjudged}  # fmt: skip


class ServerSettle:
    """`Settle` against the bucket: the newer version's CRC32C as the server computed it (its full-object
    checksum, which a PUT's checksum header cannot make lie: the server checks it against the bytes) or
    read from its bytes, compared with the reference's (the manifest's value, else the reference's bytes
    read). Never the object's metadata or tags. None where the version is archived and keeps no checksum."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._crc: dict[tuple[str, str], str | None] = {}

    def crc(self, v: ObjectVersion) -> str | None:
        at = (v.key, v.version_id)
        if at not in self._crc:
            view = self.store.pinned([v])
            head = view.head(v.key)
            crc = head.server_crc32c if head is not None else None
            if crc is None:
                try:
                    crc = view.read_crc32c(v.key)
                except ObjectFrozenError:
                    crc = None
            self._crc[at] = crc
        return self._crc[at]

    def __call__(self, newer: ObjectVersion, crc32c: str | None, reference: ObjectVersion) -> bool | None:
        have = self.crc(newer)
        want = crc32c if crc32c is not None else self.crc(reference)
        if have is None or want is None:
            return None
        return have == want


def survey_tamper(
    store: ObjectStore,
    prefix: str,
    name: str,
    *,
    leave_out: Collection[tuple[str, int, int]] = (),
    expires_after: float | None = None,
) -> TamperSurvey:
    """The tamper check of one copy (`name`, its store and key prefix): one ListObjectVersions of the
    prefix, then, only for a save whose listing shows a change since its commit, its first manifest
    version read (by version id) and its keys judged. `leave_out`: (run, step, save) the catalog records
    expired (the tier's own deletes). The caller checks that the bucket keeps versions first."""
    out = TamperSurvey(name)
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    settle = ServerSettle(store)
    for sv in saves_in(store.list_versions(base), prefix):
        if (sv.run, sv.step, sv.save) in leave_out:
            continue
        out.checked += 1
        if not changed_since_commit(sv.entries, sv.manifest_first.last_modified):
            continue
        out.read += 1
        try:
            raw = store.pinned([sv.manifest_first]).get_bytes(sv.manifest_first.key)
            m = Manifest.from_json(raw, f"s3://{store.bucket}/{sv.manifest_first.key} (version "
                                   f"{sv.manifest_first.version_id})")  # fmt: skip
            keys = judge_save(sv.entries, sv.save_dir, sv.manifest_first, m, to_b64(crc32c_update(raw)), settle,
                              expires_after)  # fmt: skip
        except (CkptvaultError, ValueError) as e:
            out.unjudged[sv.save_dir] = f"its first manifest version could not be read: {e}"
            continue
        if keys:
            out.tampered.append(
                TamperedSave(name, sv.run, sv.step, sv.save, sv.manifest_first.last_modified, tuple(keys))
            )
    return out


def tampered_keys(store: ObjectStore, prefix: str, run: str, step: int, save: int) -> list[TamperedKey]:
    """The tamper check of one save (a drill's, on the copy it restores from): one ListObjectVersions of
    the save's prefix, judged as `survey_tamper` judges it. Empty where the bucket keeps no versions (the
    drill's own restore still checks every byte) or nothing changed since the commit."""
    if store.versioning() != "Enabled":
        return []
    save_dir = checkpoint_prefix(prefix, run, step, save)
    found = [sv for sv in saves_in(store.list_versions(save_dir), prefix) if sv.save_dir == save_dir]
    if not found or not changed_since_commit(found[0].entries, found[0].manifest_first.last_modified):
        return []
    sv = found[0]
    raw = store.pinned([sv.manifest_first]).get_bytes(sv.manifest_first.key)
    m = Manifest.from_json(raw, f"s3://{store.bucket}/{sv.manifest_first.key} (version {sv.manifest_first.version_id})")
    return judge_save(sv.entries, save_dir, sv.manifest_first, m, to_b64(crc32c_update(raw)), ServerSettle(store))


def drill_problems(store: ObjectStore, prefix: str, run: str, step: int, save: int) -> tuple[str, ...]:
    """What a drill reports of one save's tamper check: a `tampered: KEY: ...` problem per key."""
    return tuple(f"tampered: {t.text()}" for t in tampered_keys(store, prefix, run, step, save))


def recover_since(first_at: float) -> str:
    """The TIME a `recover --since` before the earliest change names: a second before it, whole seconds."""
    return utc(math.floor(first_at) - 1)


__all__ = [
    "Change", "ServerSettle", "Settle", "TamperSurvey", "TamperedKey", "TamperedSave", "changed_since_commit",
    "judge_key", "judge_save", "recover_since", "saves_in", "survey_tamper", "utc",
]  # fmt: skip
