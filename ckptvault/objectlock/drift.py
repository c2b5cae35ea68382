"""Lock drift (docs/object-lock.md, "Drills check the lock"): a save whose objects no longer carry the
Object Lock ckptvault recorded for it. A drill checks each save it drills; a difference is reported,
never repaired here (who shortened a lock, and why, is a question for a person).

Only what ckptvault set is checked: the catalog's `locked_until` and `legal_hold` (docs/FORMAT.md,
"The lock in the state"). A save ckptvault never locked has nothing to drift from.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from ckptvault.catalog import CheckpointState
from ckptvault.checkpoint.manifest import VALIDATION_NAME, checkpoint_prefix
from ckptvault.store import ObjectStore

# S3 reports retain-until dates to the second (moto and Ceph round); the catalog keeps the exact float.
_SLACK_S = 1.0


def lock_drift(store: ObjectStore, prefix: str, state: CheckpointState, now: float | None = None) -> list[str]:
    """Every object of the save (not `_VALIDATION.json`, never locked) whose retention is missing or
    ends before the catalog's `locked_until` while that date is still ahead, or whose legal hold is
    off while the catalog says held. One HEAD per object; nothing when neither is in force (a lock
    whose date has passed protects nothing, and a server may stop reporting it)."""
    t = time.time() if now is None else now
    locked = state.locked_until is not None and state.locked_until > t
    if not locked and not state.legal_hold:
        return []
    base = checkpoint_prefix(prefix, state.run, state.step, state.save)
    problems = []
    for obj in store.list(base):
        if obj.key == base + VALIDATION_NAME:
            continue
        head = store.head(obj.key)
        if head is None:  # gone since the listing: the drill's restore says so
            continue
        rel = obj.key[len(base) :]
        if locked and state.locked_until is not None:
            if head.retention is None:
                problems.append(f"{rel}: no Object Lock retention (ckptvault set {_date(state.locked_until)})")
            elif head.retention.until_ts + _SLACK_S < state.locked_until:
                problems.append(
                    f"{rel}: locked until {_date(head.retention.until_ts)}, shorter than the "
                    f"{_date(state.locked_until)} ckptvault set"
                )
        if state.legal_hold and not head.legal_hold:
            problems.append(f"{rel}: no legal hold, but the catalog says the save is held (ckptvault hold)")
    return problems


def _date(ts: float) -> str:
    return f"{datetime.fromtimestamp(ts, UTC):%Y-%m-%d %H:%M} UTC"
