"""The apply's orders from a plan: one per store operation, resolved before the flow touches anything."""

from __future__ import annotations

from ckptvault.config import PolicyConfig, TierStep
from ckptvault.tiering.cost import class_map
from ckptvault.tiering.orders import (
    EvictLocal,
    Expire,
    ScheduleTransition,
    Transition,
    orders,
    rules_to_install,
    tier_names,
)
from ckptvault.tiering.policy import plan
from tests.unit.test_policy import NOW, PRICES, ck

TIERS = [TierStep(after_days=30, tier="warm"), TierStep(after_days=90, tier="cold")]


def test_client_mode_copies_and_keeps_give_no_order() -> None:
    states = [ck(100, 200), ck(200, 40), ck(300, 1)]
    pol = PolicyConfig(keep_hot=1, tiers=TIERS, milestone_every_steps=100_000)
    classes = class_map("aws", pol.classes)
    got = orders(plan(states, pol, PRICES, "aws", NOW), states, pol, "pfx", classes)
    assert [(type(o).__name__, o.action.step) for o in got] == [("Transition", 100), ("Transition", 200)]
    first, second = got
    assert isinstance(first, Transition) and isinstance(second, Transition)
    assert (first.tier, first.action.to_class, second.tier) == ("cold", "GLACIER", "warm")
    assert not first.milestone and rules_to_install("pfx", classes, pol) == []


def test_server_mode_schedules_against_the_rule_of_the_tier_it_tags() -> None:
    states = [ck(100, 200), ck(300, 1)]
    pol = PolicyConfig(keep_hot=1, tiers=TIERS, apply_mode="server")
    classes = class_map("aws", pol.classes)
    (order,) = orders(plan(states, pol, PRICES, "aws", NOW), states, pol, "pfx", classes)
    assert isinstance(order, ScheduleTransition) and order.tier == "cold"
    rules = rules_to_install("pfx", classes, pol)
    assert order.rule in rules and order.rule["ID"].startswith("ckptvault-tier-cold")


def test_expiry_and_local_eviction_are_their_own_orders() -> None:
    states = [ck(100, 400, class_since=NOW - 400 * 86400.0), ck(200, 2), ck(300, 1)]
    pol = PolicyConfig(keep_hot=1, tiers=TIERS, expire_after_days=365, keep_local=1)
    classes = class_map("aws", pol.classes)
    kinds = {(type(o), o.action.step) for o in orders(plan(states, pol, PRICES, "aws", NOW), states, pol, "p", classes)}
    assert (Expire, 100) in kinds and (EvictLocal, 200) in kinds


def test_a_class_two_tiers_share_is_tagged_with_the_tier_the_policy_names() -> None:
    pol = PolicyConfig(tiers=[TierStep(after_days=30, tier="cold")], classes={"warm": "COLD", "cold": "COLD"})
    assert tier_names({"warm": "COLD", "cold": "COLD", "hot": "STANDARD"}, pol)["COLD"] == "cold"
