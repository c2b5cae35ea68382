"""What changed after a moment, key by key, and the version a save's manifest was first written as.

Which version was current at a moment (`current_at`, `by_key`) is the store's reading of its own
listing (ckptvault/store/versions.py), which a point-in-time view of the store uses too; the judgement
of what changed since, and what an undo must do, is here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from ckptvault.store.port import ObjectVersion
from ckptvault.store.versions import by_key, current_at, written_by

__all__ = ["Change", "ChangeKind", "by_key", "changes_since", "current_at", "first_written", "same_etag", "written_by"]


def first_written(entries: Sequence[ObjectVersion]) -> ObjectVersion | None:
    """The oldest data version of a key: for a manifest, the one its commit wrote (a manifest is never
    legitimately rewritten, so it is the reference a later version is judged by)."""
    return next((v for v in reversed(entries) if not v.delete_marker), None)


class ChangeKind(Enum):
    DELETED = "deleted"  # a delete marker on top of what was current: removing the markers undoes it
    OVERWRITTEN = "overwritten"  # newer data on top: only putting the old version back undoes it
    CREATED = "created"  # nothing was current then: new since (a new save, a new event, or an attacker's)


@dataclass(frozen=True)
class Change:
    """One key that reads differently now than at the moment."""

    key: str
    kind: ChangeKind
    then: ObjectVersion | None  # what was current at the moment (None for CREATED)
    now: ObjectVersion  # the newest entry: a delete marker or a data version
    markers_after: tuple[ObjectVersion, ...]  # delete markers written after the moment
    versions_after: tuple[ObjectVersion, ...]  # data versions written after the moment


def same_etag(a: ObjectVersion, b: ObjectVersion) -> bool:
    return bool(a.etag) and a.etag == b.etag


def changes_since(
    versions: Iterable[ObjectVersion],
    at: float,
    same_content: Callable[[ObjectVersion, ObjectVersion], bool] = same_etag,
) -> list[Change]:
    """Every key whose read now differs from its read at `at`, by key. A key whose newest data version
    has the content of the one current at `at` (`same_content`: by default the same ETag; the caller
    that knows the manifest's CRC32C passes a truer test) reads as it did and is no change: that is
    what makes an undo, run twice, do nothing the second time. A key absent then and absent now (made
    and deleted since) is no change either."""
    found: list[Change] = []
    for key, entries in sorted(by_key(versions).items()):
        after = [v for v in entries if not written_by(v, at)]
        if not after:
            continue
        then = current_at(entries, at)
        markers = tuple(v for v in after if v.delete_marker)
        data = tuple(v for v in after if not v.delete_marker)
        now = entries[0]
        if then is None:
            if not now.delete_marker:
                found.append(Change(key, ChangeKind.CREATED, None, now, markers, data))
            continue
        if now.delete_marker:
            # markers removed would uncover data written after the moment, if any: then only a copy undoes it
            kind = ChangeKind.OVERWRITTEN if data else ChangeKind.DELETED
        elif same_content(now, then):
            continue
        else:
            kind = ChangeKind.OVERWRITTEN
        found.append(Change(key, kind, then, now, markers, data))
    return found
