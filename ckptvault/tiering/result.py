"""What one run of the tier flow reports: the plan's actions and cost, and with --apply what was done
beyond the plan's own moves. `as_dict` is the `ckptvault tier --json` document (docs/commands.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptvault.tiering.apply import Observation, Scheduled
from ckptvault.tiering.eviction import EvictionCheck
from ckptvault.tiering.milestone_lock import LockExtension
from ckptvault.tiering.policy import Plan, Postponed, ReplicaWait
from ckptvault.tiering.report import observed_record, scheduled_record, skipped_record

__all__ = ["Postponed", "TierResult"]  # Postponed lives with the planner, which finds most of them


@dataclass(frozen=True)
class TierResult:
    applied: bool
    actions: tuple[str, ...]  # each planned action's kind, in the plan's order
    monthly_before: float
    monthly_after: float
    # expiries a lock stops, not attempted: the plan's (from the catalog), and with --apply those the
    # manifest's HEAD found too
    expire_postponed: tuple[Postponed, ...] = ()
    # milestones whose lock is raised: a dry run's are those it would raise (objects: how many it would)
    lock_extended: tuple[LockExtension, ...] = ()
    # expiries and archival moves the plan holds back until a replica holds the save (the apply does none)
    waits_for_replica: tuple[ReplicaWait, ...] = ()
    # only after an apply:
    evict_skipped: tuple[EvictionCheck, ...] = ()  # evictions the store or local re-check stopped
    scheduled: tuple[Scheduled, ...] = ()  # transitions left to the bucket lifecycle
    observed: tuple[Observation, ...] = ()  # scheduled transitions the listing showed done
    catalog_files_compacted: int = 0

    @classmethod
    def planned(cls, plan: Plan, would_lock: tuple[LockExtension, ...] = ()) -> TierResult:
        """A dry run's result: the plan and the milestone locks it would raise, nothing done."""
        return cls(
            False,
            tuple(a.kind for a in plan.actions),
            plan.summary.total_before,
            plan.summary.total_after,
            tuple(plan.postponed),
            would_lock,
            tuple(plan.waits),
        )

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "applied": self.applied,
            "actions": list(self.actions),
            "monthly_before": self.monthly_before,
            "monthly_after": self.monthly_after,
            "expire_postponed": [p.as_dict() for p in self.expire_postponed],
            "lock_extended": [x.as_dict() for x in self.lock_extended],
            "waits_for_replica": [w.as_dict() for w in self.waits_for_replica],
        }
        if self.applied:  # a dry run's document has no apply keys beyond these
            doc["evict_skipped"] = [skipped_record(c) for c in self.evict_skipped]
            doc["scheduled"] = [scheduled_record(x) for x in self.scheduled]
            doc["observed"] = [observed_record(o) for o in self.observed]
            doc["catalog_files_compacted"] = self.catalog_files_compacted
        return doc
