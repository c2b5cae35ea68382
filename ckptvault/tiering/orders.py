"""What `tier --apply` does for each action of a plan, decided before anything is touched.

The planner (`policy`) says what should happen to each checkpoint; this module turns that into orders,
one per store operation, with everything the operation needs already resolved: the tier name a class
is tagged with, whether the checkpoint is a milestone, the bucket rule a scheduled move waits for. The
flow then only carries the orders out, in order, and records what each did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptvault.catalog import CheckpointState
from ckptvault.config import PolicyConfig
from ckptvault.tiering.apply import lifecycle_rules, tier_rule
from ckptvault.tiering.policy import Action, Plan, milestones


@dataclass(frozen=True)
class Expire:
    action: Action


@dataclass(frozen=True)
class EvictLocal:
    action: Action


@dataclass(frozen=True)
class Transition:
    """A copy to `action.to_class` by the flow itself (client mode, or `both` for a readable object)."""

    action: Action
    tier: str  # the tier name the objects are tagged with
    milestone: bool


@dataclass(frozen=True)
class ScheduleTransition:
    """A tag that makes the bucket's lifecycle rule `rule` move the objects (server mode)."""

    action: Action
    tier: str
    milestone: bool
    rule: dict[str, Any]


Order = Expire | EvictLocal | Transition | ScheduleTransition


def tier_names(classes: Mapping[str, str], policy: PolicyConfig) -> dict[str, str]:
    """Storage class -> the tier name its objects are tagged with. A class two tiers share is tagged
    with the tier the policy names, whose lifecycle rule is the one installed."""
    return {v: k for k, v in classes.items()} | {classes[t.tier]: t.tier for t in policy.tiers if t.tier in classes}


def rules_to_install(prefix: str, classes: Mapping[str, str], policy: PolicyConfig) -> list[dict[str, Any]]:
    """The bucket lifecycle rules an apply installs first: none in client mode."""
    if policy.apply_mode not in ("server", "both"):
        return []
    return lifecycle_rules(prefix, classes, [t.tier for t in policy.tiers])


def orders(
    plan: Plan,
    states: Sequence[CheckpointState],
    policy: PolicyConfig,
    prefix: str,
    classes: Mapping[str, str],
) -> list[Order]:
    """One order per action that changes something, in the plan's order; keeps and skips give none."""
    tier_of = tier_names(classes, policy)
    kept = milestones(states, policy)
    out: list[Order] = []
    for a in plan.actions:
        if a.kind == "expire":
            out.append(Expire(a))
        elif a.kind == "evict_local":
            out.append(EvictLocal(a))
        elif a.kind == "transition" and a.to_class:
            tier = tier_of.get(a.to_class, a.to_class)
            milestone = (a.run, a.step) in kept
            if a.by_lifecycle:
                out.append(ScheduleTransition(a, tier, milestone, tier_rule(prefix, classes, tier)))
            else:
                out.append(Transition(a, tier, milestone))
    return out
