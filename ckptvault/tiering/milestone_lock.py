"""Milestones locked for longer than every save (`[policy] milestone_lock_days`, `keep_best.lock_days`;
docs/object-lock.md): which saves must stay locked until when, and raising a save's lock to that.

Only ever extended, never shortened. The manifest is raised last, so a manifest that already lasts
long enough says the whole save does: one HEAD per milestone per tier run once it is locked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptvault.catalog import CheckpointState, Event, events
from ckptvault.checkpoint.manifest import BLOCKS_NAME, MANIFEST_NAME, VALIDATION_NAME, checkpoint_prefix
from ckptvault.config import LockConfig, PolicyConfig
from ckptvault.objectlock.save_lock import retain_until
from ckptvault.store import ObjectStore, Retention
from ckptvault.tiering.policy import milestone_lock_days


@dataclass(frozen=True)
class LockExtension:
    """A milestone save whose objects must stay locked until `retention.until` (`days` after its commit)."""

    run: str
    step: int
    save: int
    retention: Retention
    days: int
    objects: int = 0  # how many objects a tier run raised (0 until then)

    def said(self) -> str:
        """What a tier run that raised it prints."""
        return f"{self.run} step {self.step} save {self.save}: locked {self._until()}"

    def would(self) -> str:
        """What a dry run (`plan`, `tier` without --apply) prints for it."""
        return f"would lock {self.run} step {self.step} save {self.save} {self._until()}"

    def _until(self) -> str:
        until = f"{self.retention.until:%Y-%m-%d %H:%M} UTC"
        return f"({self.retention.mode}) until {until}, {self.days} days after its commit ({self.objects} objects)"

    def event(self, flow_run: str = "") -> Event:
        """The catalog's record of it (`ls` shows `locked_until` from it)."""
        until = self.retention.until_ts
        return events.locked(
            self.run, self.step, self.save, until, self.retention.mode, self.days, self.objects, flow_run
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": self.step,
            "save": self.save,
            "mode": self.retention.mode,
            "until": self.retention.until.isoformat(),
            "days": self.days,
            "objects": self.objects,
        }


def wanted(states: list[CheckpointState], policy: PolicyConfig, lock: LockConfig) -> list[LockExtension]:
    """Every verified save of a milestone step a rule with lock_days chose, with the date it must stay
    locked until (its commit + the rule's days, rounded up as every save's date is); sorted."""
    if not lock.enabled:
        return []
    days = milestone_lock_days(states, policy)
    out = []
    for s in sorted(states, key=lambda s: s.key):
        d = days.get((s.run, s.step))
        if d and s.verified and s.state != "expired" and s.uploaded_at is not None:
            out.append(LockExtension(s.run, s.step, s.save, Retention.of(lock.mode, retain_until(s.uploaded_at, d)), d))
    return out


def would_extend(states: list[CheckpointState], policy: PolicyConfig, lock: LockConfig) -> list[LockExtension]:
    """The dry run's view, from the catalog alone: each wanted extension whose save the catalog says is
    locked to an earlier date (or to none), with `objects` what the apply would raise (the save's
    files and its manifest). The apply decides from the manifest's HEAD instead, so a lock raised by
    hand and not recorded is listed here and then found long enough by the apply, which sends nothing."""
    by_key = {s.key: s for s in states}
    out = []
    for ext in wanted(states, policy, lock):
        s = by_key[ext.run, ext.step, ext.save]
        if s.locked_until is None or s.locked_until < ext.retention.until_ts:
            out.append(LockExtension(ext.run, ext.step, ext.save, ext.retention, ext.days, s.files + 1))
    return out


def extend(store: ObjectStore, prefix: str, ext: LockExtension) -> LockExtension | None:
    """Raise every object of the save (not `_VALIDATION.json`, which stays mutable) to ext.retention,
    the manifest last; returns what was done (its mode the manifest's where that is the stronger:
    `Retention.over`, a save in COMPLIANCE stays in it after the config says governance, and how many
    objects were raised), None when the manifest already lasts."""
    base = checkpoint_prefix(prefix, ext.run, ext.step, ext.save)
    manifest = base + MANIFEST_NAME
    head = store.head(manifest)
    done = ext.retention.over(head.retention) if head is not None else None
    if done is None:
        return None  # gone (a reader would not find it either), or locked long enough
    # the block sidecar is raised with the save but not counted: the plan counts from the catalog alone
    # (its files and the manifest), and a save may have a sidecar or not (docs/FORMAT.md, "Block checksums")
    skip, sidecar = (manifest, base + VALIDATION_NAME, base + BLOCKS_NAME), base + BLOCKS_NAME
    listed = [o.key for o in store.list(base)]
    raised = sum(store.extend_retention(k, done) for k in listed if k not in skip)
    if sidecar in listed:
        store.extend_retention(sidecar, done)
    raised += store.extend_retention(manifest, done)
    return LockExtension(ext.run, ext.step, ext.save, done, ext.days, raised) if raised else None


def extend_all(
    store: ObjectStore, prefix: str, states: list[CheckpointState], policy: PolicyConfig, lock: LockConfig
) -> list[LockExtension]:
    """Every wanted extension carried out; returns those that raised anything, with their counts."""
    return [done for ext in wanted(states, policy, lock) if (done := extend(store, prefix, ext)) is not None]
