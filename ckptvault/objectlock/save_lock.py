"""How long a save stays locked (docs/FORMAT.md, "Object Lock"): one retain-until date per save,
chosen when its upload starts, and the objects whose lock the commit must raise to it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

from ckptvault.config import LockConfig
from ckptvault.objectlock.probe_cache import ProbeCache
from ckptvault.store import LockStatus, ObjectStore, Retention, StoreError

DAY = 86_400.0


def retain_until(start: float, days: int) -> datetime:
    """`start + days + 1 day`, rounded up to the next UTC midnight: at least `days` after a commit that
    comes less than a day after `start`, and at most `days + 2` after it."""
    t = datetime.fromtimestamp(start, UTC) + timedelta(days=days + 1)
    midnight = t.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight if midnight == t else midnight + timedelta(days=1)


def save_retention(lock: LockConfig, start: float) -> Retention | None:
    """The retention every object of a save whose upload starts at `start` is written with; None
    when `[lock]` is off or locks nothing at upload (`days = 0`)."""
    if not lock.enabled or lock.days == 0:
        return None
    return Retention.of(lock.mode, retain_until(start, lock.days))


def to_extend(retention: Retention, days: int, commit: float, reused: Iterable[str], sent: Iterable[str]) -> list[str]:
    """The keys whose lock must be raised to `retention` before the manifest commits: the objects an
    earlier, killed pass sent (their date is that pass's), and, if the upload outlasted the margin
    (`commit + days` later than the date), every object of the save."""
    reused = list(reused)
    if commit + days * DAY > retention.until_ts:
        return reused + list(sent)
    return reused


def lock_problem(
    lock: LockConfig, store: ObjectStore, cache: ProbeCache | None = None, now: Callable[[], float] = time.time
) -> str | None:
    """Why the bucket cannot hold `[lock]`'s locks (none, or a server that ignores them), with the
    fix; None when `[lock]` is off or the bucket has Object Lock and the server enforces it. The
    bucket's configuration is read every time; the enforcement probe is skipped where `cache` holds a
    recent pass for this endpoint and bucket, and only a pass is recorded (ckptvault/objectlock/probe_cache.py)."""
    if not lock.enabled:
        return None
    status = store.lock_status()
    if not status.enabled:
        return (
            f'[lock] mode = "{lock.mode}", but bucket {store.bucket} has no Object Lock. It can only be turned '
            "on when a bucket is created: create one with it (aws s3api create-bucket --bucket NAME "
            "--object-lock-enabled-for-bucket; versioning comes with it), point [store].bucket at it, "
            'or set [lock] mode = "off"'
        )
    if cache is not None and cache.passed_recently(now()):
        return None
    seen = store.probe_lock_enforced()
    if seen is None and cache is not None:
        cache.record_pass(now())
    if seen is not None:
        return (
            f"bucket {store.bucket} reports Object Lock, but the server does not enforce it: {seen}. "
            f'Nothing here would be protected: use a server that enforces Object Lock, or set [lock] mode = "off"'
        )
    return None


def bucket_lock(store: ObjectStore) -> LockStatus:
    """The bucket's Object Lock configuration as `plan` reports it (one GetObjectLockConfiguration):
    a store that cannot say (refused, or a server error) is unknown, never an error, since the plan is
    read-only and its lock line only informs."""
    try:
        return store.lock_status()
    except StoreError:
        return LockStatus(enabled=False, known=False)
