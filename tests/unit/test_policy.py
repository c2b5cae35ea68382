"""The retention planner: hand-checked cases, then its invariants over generated histories."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptvault.catalog import CheckpointState
from ckptvault.config import KeepBest, PolicyConfig, TierStep
from ckptvault.pricing import GB, PriceError, load_prices
from ckptvault.tiering.policy import Action, Plan, PlanError, milestones, plan

DAY = 86400.0
NOW = 2_000_000_000.0
PRICES = load_prices({"COLD": 0.002})


def ck(step: int, age_days: float, *, run: str = "r", **kw: Any) -> CheckpointState:
    created = NOW - age_days * DAY
    d: dict[str, Any] = dict(
        run=run, step=step, format="hf", last_event="verified", bytes=100 * GB, files=10, storage_class="STANDARD",
        created_at=created, uploaded_at=created, verified=True, local_evicted=False, last_drill_at=None,
        last_drill_ok=None, metrics={}, updated_at=created, detail="", class_since=created,
    )  # fmt: skip
    d.update(kw)
    return CheckpointState(**d)


def by_step(p: Plan, kind: str | None = None) -> dict[int, Action]:
    return {a.step: a for a in p.actions if a.kind != "evict_local" and (kind is None or a.kind == kind)}


def test_newest_stay_hot_and_older_move_down_by_age() -> None:
    states = [ck(100, 400), ck(200, 200), ck(300, 40), ck(400, 5), ck(500, 1)]
    pol = PolicyConfig(
        keep_hot=2,
        tiers=[TierStep(after_days=30, tier="warm"), TierStep(after_days=90, tier="cold"),
               TierStep(after_days=365, tier="archive")],
    )  # fmt: skip
    acts = by_step(plan(states, pol, PRICES, "aws", NOW))
    assert (acts[500].kind, acts[400].kind) == ("keep", "keep")
    assert "newest 2 verified" in acts[500].reason
    assert (acts[300].kind, acts[300].to_class) == ("transition", "STANDARD_IA")
    assert (acts[200].kind, acts[200].to_class) == ("transition", "GLACIER")
    assert (acts[100].kind, acts[100].to_class) == ("transition", "DEEP_ARCHIVE")


def test_transition_saving_and_fee_match_hand_computation() -> None:
    pol = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=30, tier="cold")], horizon_days=365)
    p = plan([ck(1, 60), ck(2, 0)], pol, PRICES, "aws", NOW)
    a = by_step(p)[1]
    glacier = 100 * 0.0036 + 10 * (32 * 1024 * 0.0036 + 8 * 1024 * 0.023) / GB
    assert a.saving_usd == pytest.approx((100 * 0.023 - glacier) * 365 / 30)
    assert a.fee_usd == pytest.approx(10 * 0.03 / 1000)
    s = p.summary
    assert s.monthly_before == {"r": {"STANDARD": pytest.approx(200 * 0.023)}}
    assert s.monthly_after == {"r": {"STANDARD": pytest.approx(100 * 0.023), "GLACIER": pytest.approx(glacier)}}
    assert s.one_time_fees_usd == pytest.approx(10 * 0.03 / 1000)
    assert s.hot_fs_monthly_usd == pytest.approx(200 * 0.10)
    assert s.saving_vs_hot_fs == pytest.approx(20 - 100 * 0.023 - glacier)


def test_tiny_checkpoint_transition_is_skipped_with_the_numbers() -> None:
    # 1000 files of 1 KB: Glacier's per-object overhead and request fees dwarf any saving.
    tiny = ck(1, 100, bytes=1000 * 1024, files=1000)
    pol = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=30, tier="cold")])
    a = by_step(plan([tiny, ck(2, 0)], pol, PRICES, "aws", NOW))[1]
    assert (a.kind, a.to_class) == ("skip", "GLACIER")
    assert a.reason.startswith("transition to GLACIER skipped: saves $-")
    assert "costs $0.0300 in requests" in a.reason
    assert a.fee_usd == pytest.approx(0.03)


def test_glacier_then_expire_soon_pays_the_minimum_and_says_so() -> None:
    # Moving to GLACIER at day 30 and expiring at day 35 bills 85 more GLACIER days for 5 days of saving.
    pol = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=30, tier="cold")], expire_after_days=35)
    a = by_step(plan([ck(1, 30, bytes=GB, files=1), ck(2, 0)], pol, PRICES, "aws", NOW))[1]
    assert a.kind == "skip"
    assert "of GLACIER minimum duration before expiry" in a.reason
    assert "over 5 d" in a.reason


def test_expire_before_minimum_duration_states_the_fee() -> None:
    old = ck(1, 100, storage_class="GLACIER", class_since=NOW - 10 * DAY)
    pol = PolicyConfig(keep_hot=1, expire_after_days=60)
    a = by_step(plan([old, ck(2, 0)], pol, PRICES, "aws", NOW))[1]
    fee = PRICES.monthly_cost(100 * GB, "GLACIER", 10) * 80 / 30
    assert a.kind == "expire"
    assert a.fee_usd == pytest.approx(fee)
    assert f"early-deletion fee ${fee:.4f}: GLACIER bills 90 d minimum, 10 d so far" in a.reason


def test_expire_that_costs_more_than_it_saves_is_skipped() -> None:
    # A 30-day horizon saves one month; the DEEP_ARCHIVE minimum still has 170 days to bill.
    old = ck(1, 100, storage_class="DEEP_ARCHIVE", class_since=NOW - 10 * DAY)
    pol = PolicyConfig(keep_hot=1, expire_after_days=60, horizon_days=30)
    a = by_step(plan([old, ck(2, 0)], pol, PRICES, "aws", NOW))[1]
    assert a.kind == "skip"
    monthly = 100 * 0.00099 + 10 * (32 * 1024 * 0.00099 + 8 * 1024 * 0.023) / GB
    assert a.saving_usd == pytest.approx(monthly)
    assert a.fee_usd == pytest.approx(monthly * 170 / 30)
    assert a.reason.startswith("expire skipped: saves $0.0990 over 30 d, costs $0.5610")
    assert "early-deletion fee (DEEP_ARCHIVE minimum 180 d, 10 d so far)" in a.reason


def test_never_moves_up_a_tier() -> None:
    deep = ck(1, 100, storage_class="DEEP_ARCHIVE")
    pol = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=30, tier="cold")])
    a = by_step(plan([deep, ck(2, 0)], pol, PRICES, "aws", NOW))[1]
    assert a.kind == "keep" and "at or below tier cold" in a.reason


def test_ceph_needs_a_class_for_warm_and_a_price_for_cold() -> None:
    states = [ck(1, 100), ck(2, 0)]
    warm = PolicyConfig(tiers=[TierStep(after_days=30, tier="warm")])
    with pytest.raises(PlanError, match=r'\[policy\.classes\] warm = "CLASS"'):
        plan(states, warm, PRICES, "ceph", NOW)
    cold = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=30, tier="cold")])
    with pytest.raises(PriceError, match=r"\[policy\.prices\] COLD = 0\.01"):
        plan(states, cold, load_prices({}), "ceph", NOW)
    a = by_step(plan(states, cold, PRICES, "ceph", NOW))[1]
    assert (a.kind, a.to_class, a.fee_usd) == ("transition", "COLD", 0.0)


def test_milestones_every_steps_hours_and_best() -> None:
    hours = [ck(s, 10 - s / 24, created_at=NOW - 10 * DAY + s * 3600, metrics={"loss": 1 / s}) for s in range(1, 49)]
    pol = PolicyConfig(milestone_every_steps=20)
    assert milestones(hours, pol) == {("r", 20), ("r", 40)}
    # NOW is 2e9 s; 2e9 mod 86400 = 80000 s, so day windows start at step 6 (-10 d + 6 h > window edge).
    pol = PolicyConfig(milestone_every_hours=24)
    ms = milestones(hours, pol)
    assert ("r", 1) in ms and len(ms) == 3
    best_min = PolicyConfig(keep_best=KeepBest(metric="loss", mode="min", k=2))
    assert milestones(hours, best_min) == {("r", 48), ("r", 47)}
    best_max = PolicyConfig(keep_best=KeepBest(metric="loss", mode="max", k=1))
    assert milestones(hours, best_max) == {("r", 1)}
    unverified = [ck(20, 1, verified=False, last_event="uploaded")]
    assert milestones(unverified, PolicyConfig(milestone_every_steps=20)) == set()


def test_milestones_are_tiered_but_not_expired() -> None:
    pol = PolicyConfig(
        keep_hot=1, milestone_every_steps=100, expire_after_days=30, tiers=[TierStep(after_days=10, tier="cold")]
    )
    acts = by_step(plan([ck(100, 50), ck(150, 50), ck(200, 0)], pol, PRICES, "aws", NOW))
    assert acts[100].kind == "transition" and "milestone" in acts[100].reason
    assert acts[150].kind == "expire"


def test_keep_local_evicts_older_verified_copies_only() -> None:
    states = [
        ck(1, 5),
        ck(2, 4, local_evicted=True),
        ck(3, 3, verified=False, last_event="uploaded"),
        ck(4, 2),
        ck(5, 1),
    ]
    p = plan(states, PolicyConfig(keep_local=2), PRICES, "aws", NOW)
    evicted = [a for a in p.actions if a.kind == "evict_local"]
    assert [a.step for a in evicted] == [1]
    assert evicted[0].saving_usd == pytest.approx(100 * 0.10 * 365 / 30)
    assert p.actions.index(evicted[0]) < p.actions.index(by_step(p)[1])  # evict before the storage action
    # a node-local run: tier, on one host, cannot reach the other nodes' files, so it never evicts
    on_nodes = plan(states, PolicyConfig(keep_local=2), PRICES, "aws", NOW, node_local=frozenset({"r"}))
    assert [a for a in on_nodes.actions if a.kind == "evict_local"] == []
    assert [a for a in on_nodes.actions if a.kind != "evict_local"] == [a for a in p.actions if a.kind != "evict_local"]


def test_expired_checkpoints_get_no_action() -> None:
    gone = ck(1, 100, last_event="expired", verified=False)
    p = plan([gone, ck(2, 0)], PolicyConfig(), PRICES, "aws", NOW)
    assert [a.step for a in p.actions] == [2]
    assert p.summary.monthly_before == {"r": {"STANDARD": pytest.approx(100 * 0.023)}}


# --- invariants over generated histories ----------------------------------------------------------

CLASSES = ["STANDARD", "STANDARD_IA", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"]
STATES = ["uploaded", "verified", "transitioned", "drilled", "invalid", "accepted", "evicted_local", "expired"]


@st.composite
def histories(draw: st.DrawFn) -> list[CheckpointState]:
    out = []
    for run in draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True)):
        steps = draw(st.lists(st.integers(0, 60), min_size=1, max_size=8, unique=True))
        for step in steps:
            age = draw(st.floats(0, 900))
            state = draw(st.sampled_from(STATES))
            verified = state != "expired" and draw(st.booleans())
            metrics = draw(st.fixed_dictionaries({}, optional={"loss": st.floats(0, 10)}))
            out.append(ck(
                step, age, run=run, last_event=state, verified=verified,
                bytes=draw(st.integers(0, 2 * 10**12)), files=draw(st.integers(0, 5000)),
                storage_class=draw(st.sampled_from(CLASSES)),
                class_since=NOW - draw(st.floats(0, age)) * DAY,
                local_evicted=draw(st.booleans()), metrics=metrics,
            ))  # fmt: skip
    return out


@st.composite
def policies(draw: st.DrawFn) -> PolicyConfig:
    tiers = [
        TierStep(after_days=draw(st.floats(0, 400)), tier=t) for t in ("warm", "cold", "archive") if draw(st.booleans())
    ]
    return PolicyConfig(
        keep_hot=draw(st.integers(1, 4)),
        milestone_every_steps=draw(st.none() | st.integers(1, 25)),
        milestone_every_hours=draw(st.none() | st.floats(1, 2000)),
        keep_best=draw(st.none() | st.builds(KeepBest, metric=st.just("loss"), mode=st.sampled_from(["min", "max"]),
                                             k=st.integers(1, 3))),
        tiers=tiers,
        expire_after_days=draw(st.none() | st.floats(1, 600)),
        keep_local=draw(st.none() | st.integers(1, 3)),
        horizon_days=draw(st.floats(1, 1000)),
        classes=draw(st.sampled_from([{}, {"warm": "GLACIER_IR"}])),
    )  # fmt: skip


PROPS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def newest_verified(states: list[CheckpointState]) -> set[tuple[str, int]]:
    best: dict[str, int] = {}
    for s in states:
        if s.verified and s.state != "expired":
            best[s.run] = max(best.get(s.run, -1), s.step)
    return set(best.items())


@given(histories(), policies())
@PROPS
def test_newest_verified_is_never_expired_moved_or_evicted(states: list[CheckpointState], pol: PolicyConfig) -> None:
    p = plan(states, pol, PRICES, "aws", NOW)
    newest = newest_verified(states)
    assert not [a for a in p.actions if (a.run, a.step) in newest and a.kind in ("expire", "transition", "evict_local")]


@given(histories(), policies())
@PROPS
def test_milestones_are_never_expired(states: list[CheckpointState], pol: PolicyConfig) -> None:
    p = plan(states, pol, PRICES, "aws", NOW)
    ms = milestones(states, pol)
    assert not [a for a in p.actions if a.kind == "expire" and (a.run, a.step) in ms]


@given(histories(), policies())
@PROPS
def test_nothing_unverified_is_touched(states: list[CheckpointState], pol: PolicyConfig) -> None:
    p = plan(states, pol, PRICES, "aws", NOW)
    unverified = {(s.run, s.step) for s in states if not s.verified}
    assert not [
        a for a in p.actions if (a.run, a.step) in unverified and a.kind in ("expire", "transition", "evict_local")
    ]


@given(histories(), policies())
@PROPS
def test_no_action_costs_more_than_it_saves(states: list[CheckpointState], pol: PolicyConfig) -> None:
    p = plan(states, pol, PRICES, "aws", NOW)
    for a in p.actions:
        if a.kind == "transition":
            assert a.saving_usd > a.fee_usd, a
        elif a.kind == "expire":
            assert a.saving_usd >= a.fee_usd, a
            assert (a.fee_usd > 0) == ("early-deletion fee $" in a.reason), a
        elif a.kind == "skip":
            assert a.fee_usd >= a.saving_usd, a
            assert "skipped: saves $" in a.reason and "costs" in a.reason, a


@given(histories(), policies())
@PROPS
def test_one_storage_action_per_live_checkpoint_and_never_up(states: list[CheckpointState], pol: PolicyConfig) -> None:
    p = plan(states, pol, PRICES, "aws", NOW)
    live = {(s.run, s.step): s for s in states if s.state != "expired"}
    storage = [(a.run, a.step) for a in p.actions if a.kind != "evict_local"]
    assert sorted(storage) == sorted(live)
    evicts = [(a.run, a.step) for a in p.actions if a.kind == "evict_local"]
    assert len(evicts) == len(set(evicts)) and not [k for k in evicts if live[k].local_evicted]
    price = {c: PRICES.get(c).usd_per_gb_month for c in CLASSES}
    for a in p.actions:
        if a.kind == "transition":
            assert a.to_class is not None and price[a.to_class] < price[live[(a.run, a.step)].storage_class], a


def test_planning_100k_checkpoints_decides_every_one() -> None:
    """At fleet scale, every code path of the planner runs and every live checkpoint gets exactly
    one storage decision. Its speed is bench/micro.py plan-mixed's to measure (`make bench`), not a
    test's: a shared machine makes a time bound either loose or flaky."""
    states = [ck(step, (100_000 - step) / 100, run=f"run{step % 50}") for step in range(100_000)]
    pol = PolicyConfig(
        keep_hot=3, milestone_every_steps=1000, expire_after_days=500, keep_local=5,
        tiers=[TierStep(after_days=30, tier="warm"), TierStep(after_days=90, tier="cold")],
    )  # fmt: skip
    p = plan(states, pol, PRICES, "aws", NOW)
    kinds = {a.kind for a in p.actions}
    assert kinds == {"keep", "transition", "expire", "evict_local", "skip"}  # every code path was exercised
    storage = sorted((a.run, a.step) for a in p.actions if a.kind != "evict_local")
    assert storage == sorted((s.run, s.step) for s in states)


def test_a_compressed_checkpoint_is_priced_by_its_stored_bytes_and_the_saving_shown() -> None:
    from ckptvault.tiering.report import cost_rows, plan_record, render_text

    pol = PolicyConfig(keep_hot=2)
    raw, packed = ck(1, 1), ck(2, 0, stored_bytes=70 * GB)  # 100 GB each on the hot tier
    p = plan([raw, packed], pol, PRICES, "aws", NOW)
    s = p.summary
    assert s.monthly_before == {"r": {"STANDARD": pytest.approx(170 * 0.023)}}
    assert s.compression_monthly_saving == pytest.approx(30 * 0.023)
    assert s.hot_fs_monthly_usd == pytest.approx(200 * 0.10)  # the hot tier holds the files as written
    (row,) = cost_rows(p)
    assert (row["bytes"], row["stored_bytes"]) == (200 * GB, 170 * GB)
    text = render_text(p)
    assert "170.0 GiB (0.85x)" in text, text
    assert "compression saves $0.6900/month now" in text, text
    assert plan_record(p)["compression_saving_usd_month"] == pytest.approx(30 * 0.023)


def test_milestone_lock_days_per_rule_the_longest_where_two_rules_agree() -> None:
    from ckptvault.tiering.policy import milestone_lock_days

    ss = [ck(s, 10 - s, metrics={"loss": 1 / s}) for s in (1, 2, 3, 4)]
    both = PolicyConfig(
        milestone_every_steps=2, milestone_lock_days=30, keep_best=KeepBest(metric="loss", k=2, lock_days=3650)
    )
    assert milestone_lock_days(ss, both) == {("r", 2): 30, ("r", 4): 3650, ("r", 3): 3650}
    assert milestone_lock_days(ss, PolicyConfig(milestone_every_steps=2)) == {}  # no lock_days: nothing longer
    only_best = PolicyConfig(milestone_every_steps=2, keep_best=KeepBest(metric="loss", k=1, lock_days=10))
    assert milestone_lock_days(ss, only_best) == {("r", 4): 10}


def test_a_due_expiry_of_a_locked_or_held_save_is_postponed_with_its_date_and_saves_nothing() -> None:
    # The catalog's locked_until / legal_hold (docs/object-lock.md, "Tiering a locked save"): the plan
    # never has the expiry the apply would find locked, and counts no saving for it.
    from ckptvault.tiering.policy import Postponed, expiry_postponed
    from ckptvault.tiering.report import plan_record, render_text

    pol = PolicyConfig(keep_hot=1, expire_after_days=365)
    states = [
        ck(1, 400, locked_until=NOW + 2 * DAY),
        ck(2, 400, legal_hold=True),
        ck(3, 400, locked_until=NOW - DAY),  # its date has passed: nothing protects it
        ck(4, 0),
    ]
    p = plan(states, pol, PRICES, "aws", NOW)
    acts = by_step(p)
    locked = "expiry postponed: locked until 2033-05-20 03:33 UTC"  # NOW + 2 days
    assert (acts[1].kind, acts[1].reason) == ("keep", locked)
    assert (acts[2].kind, acts[2].reason) == ("keep", "expiry postponed: under a legal hold")
    assert acts[3].kind == "expire"
    assert p.postponed == [Postponed("r", 1, 1, locked), Postponed("r", 2, 1, "expiry postponed: under a legal hold")]
    # steps 1, 2 and 4 stay in STANDARD after the plan; only step 3's expiry saves anything
    assert p.summary.monthly_after == {"r": {"STANDARD": pytest.approx(3 * 100 * 0.023)}}
    assert p.summary.monthly_before == {"r": {"STANDARD": pytest.approx(4 * 100 * 0.023)}}
    assert f"postponed   r step 1 save 1: {locked}" in render_text(p)
    assert plan_record(p)["expire_postponed"] == [
        {"run": "r", "step": 1, "save": 1, "why": locked},
        {"run": "r", "step": 2, "save": 1, "why": "expiry postponed: under a legal hold"},
    ]
    # the apply's wording for what a HEAD finds is the same, with the mode the HEAD reports
    assert expiry_postponed(NOW + 2 * DAY, False, NOW, "COMPLIANCE") == locked + " (COMPLIANCE)"
    assert expiry_postponed(NOW - DAY, False, NOW, "COMPLIANCE") == ""
    not_due = plan([ck(1, 10, legal_hold=True), ck(4, 0)], pol, PRICES, "aws", NOW)
    assert not_due.postponed == [] and by_step(not_due)[1].reason.startswith("age 10 d")  # no expiry to postpone
