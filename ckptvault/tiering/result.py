"""What one run of the tier flow reports: the plan's actions and cost, and with --apply what was done
beyond the plan's own moves. `as_dict` is the `ckptvault tier --json` document (docs/commands.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptvault.tiering.apply import Observation, Scheduled
from ckptvault.tiering.eviction import EvictionCheck
from ckptvault.tiering.milestone_lock import LockExtension
from ckptvault.tiering.policy import Plan
from ckptvault.tiering.report import observed_record, scheduled_record, skipped_record


@dataclass(frozen=True)
class Postponed:
    """A planned expiry the store's lock stopped (ckptvault.tiering.apply.expire): tried again next run."""

    run: str
    step: int
    save: int
    why: str  # "expiry postponed: locked (COMPLIANCE) until 2027-01-02 00:00 UTC", or a legal hold

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "step": self.step, "save": self.save, "why": self.why}


@dataclass(frozen=True)
class TierResult:
    applied: bool
    actions: tuple[str, ...]  # each planned action's kind, in the plan's order
    monthly_before: float
    monthly_after: float
    # only after an apply:
    evict_skipped: tuple[EvictionCheck, ...] = ()  # evictions the store or local re-check stopped
    scheduled: tuple[Scheduled, ...] = ()  # transitions left to the bucket lifecycle
    observed: tuple[Observation, ...] = ()  # scheduled transitions the listing showed done
    catalog_files_compacted: int = 0
    expire_postponed: tuple[Postponed, ...] = ()  # expiries of locked saves, not attempted
    lock_extended: tuple[LockExtension, ...] = ()  # milestones whose lock this run raised

    @classmethod
    def planned(cls, plan: Plan) -> TierResult:
        """A dry run's result: the plan, nothing done."""
        return cls(False, tuple(a.kind for a in plan.actions), plan.summary.total_before, plan.summary.total_after)

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "applied": self.applied,
            "actions": list(self.actions),
            "monthly_before": self.monthly_before,
            "monthly_after": self.monthly_after,
        }
        if self.applied:  # a dry run's document has no apply keys at all
            doc["evict_skipped"] = [skipped_record(c) for c in self.evict_skipped]
            doc["scheduled"] = [scheduled_record(x) for x in self.scheduled]
            doc["observed"] = [observed_record(o) for o in self.observed]
            doc["catalog_files_compacted"] = self.catalog_files_compacted
            doc["expire_postponed"] = [p.as_dict() for p in self.expire_postponed]
            doc["lock_extended"] = [x.as_dict() for x in self.lock_extended]
        return doc
