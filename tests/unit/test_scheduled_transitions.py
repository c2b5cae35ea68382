"""Server apply mode: a transition left to the bucket lifecycle is recorded as scheduled, with the date
S3 computes, and the catalog's class changes only when a listing shows the move. Pure parts here."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from ckptvault.alerts import kinds as alerts
from ckptvault.catalog import CheckpointState, Event, fold
from ckptvault.checkpoint.manifest import FileEntry, Manifest, checkpoint_prefix
from ckptvault.config import PolicyConfig, TierStep
from ckptvault.pricing import GB, load_prices
from ckptvault.store import ObjectInfo
from ckptvault.tiering.apply import (
    Observation,
    Scheduled,
    class_counts,
    lifecycle_rules,
    majority_class,
    takes_effect,
    tier_rule,
)
from ckptvault.tiering.policy import plan
from ckptvault.tiering.report import applied_by_run, render_applied, render_markdown, render_text, scheduled_record

DAY = 86400.0
NOW = 2_000_000_000.0
PRICES = load_prices({"COLD": 0.002})


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


def test_takes_effect_as_s3_computes_it() -> None:
    # AWS's own example: created 2014-01-15 10:30 UTC, a 3-day rule -> 2014-01-19 00:00 UTC
    created = utc(2014, 1, 15, 10, 30)
    assert takes_effect(created, 3, tagged=created) == utc(2014, 1, 19)
    # exactly at midnight it is due that midnight
    assert takes_effect(utc(2014, 1, 15), 3, tagged=utc(2014, 1, 15)) == utc(2014, 1, 18)
    # tagged long after it was old enough: the first midnight after the tag
    assert takes_effect(created, 1, tagged=utc(2014, 3, 2, 9)) == utc(2014, 3, 3)
    # the 30 days an infrequent-access class needs count from creation, not from the tag
    assert takes_effect(created, 30, tagged=created + 7 * DAY) == utc(2014, 2, 15)


def test_the_rule_of_a_tier_is_the_one_installed() -> None:
    rules = lifecycle_rules("t", {"warm": "STANDARD_IA", "cold": "GLACIER"}, ["warm", "cold"])
    assert rules == [tier_rule("t", {"warm": "STANDARD_IA"}, "warm"), tier_rule("t", {"cold": "GLACIER"}, "cold")]
    assert rules[0]["Transitions"] == [{"Days": 30, "StorageClass": "STANDARD_IA"}]
    assert rules[1]["Transitions"] == [{"Days": 1, "StorageClass": "GLACIER"}]


def manifest() -> Manifest:
    return Manifest(
        run="r", step=10, format="hf", files=(FileEntry("a", 10, 1.0, "x"), FileEntry("b", 20, 1.0, "y")),
        created_at=1.0, uploaded_at=2.0, source="/hot/r/checkpoint-10", save=2,
    )  # fmt: skip


def verified_at(t: float) -> Event:
    return Event(run="r", step=10, save=2, event="verified", at=t, storage_class="STANDARD", bytes=30, files=2)


def test_the_fold_keeps_the_old_class_until_the_move_is_seen() -> None:
    sched = Scheduled("r", 10, 2, "ckptvault-tier-cold-t", "GLACIER", NOW + 3 * DAY, 2, 30)
    ev = sched.event(manifest(), "age 40 d", "fr")
    assert (ev.event, ev.storage_class, ev.save) == ("transition_scheduled", "", 2)
    assert json.loads(ev.detail)["rule"] == "ckptvault-tier-cold-t"
    ev = Event(**{**ev.__dict__, "at": 200.0})
    (s,) = fold([verified_at(100.0), ev])
    assert (s.storage_class, s.class_since, s.last_event) == ("STANDARD", 100.0, "transition_scheduled")
    assert (s.scheduled_class, s.scheduled_at) == ("GLACIER", NOW + 3 * DAY)

    obs = Observation("r", 10, 2, "GLACIER", {"GLACIER": 2})
    observed = obs.event("fr2")
    seen = Event(**{**observed.__dict__, "at": 300.0})
    assert (seen.event, seen.storage_class) == ("transitioned", "GLACIER")
    (s,) = fold([verified_at(100.0), ev, seen])
    assert (s.storage_class, s.class_since) == ("GLACIER", 300.0)
    assert (s.scheduled_class, s.scheduled_at) == ("", None)

    (s,) = fold([verified_at(100.0), ev, Event(run="r", step=10, save=2, event="expired", at=400.0)])
    assert (s.scheduled_class, s.scheduled_at) == ("", None)


def test_a_schedule_event_without_a_class_or_date_is_read_as_far_as_it_goes() -> None:
    bad = Event(run="r", step=10, save=2, event="transition_scheduled", at=200.0, detail="not json")
    (s,) = fold([verified_at(100.0), bad])
    assert (s.scheduled_class, s.scheduled_at) == ("", None)
    undated = Event(run="r", step=10, save=2, event="transition_scheduled", at=200.0, detail='{"to_class": "COLD"}')
    (s,) = fold([verified_at(100.0), undated])
    assert (s.scheduled_class, s.scheduled_at) == ("COLD", None)


def test_the_majority_class_of_the_data_objects_decides_arrival() -> None:
    base = checkpoint_prefix("t", "r", 10)

    def obj(name: str, cls: str) -> ObjectInfo:
        return ObjectInfo(base + name, 1, '"e"', cls, 1.0)

    listed = [obj("_MANIFEST.json", "STANDARD"), obj("_VALIDATION.json", "STANDARD"), obj("a", "COLD"),
              obj("sub/b", "COLD"), obj("c", "STANDARD")]  # fmt: skip
    counts = class_counts(listed, base)
    assert counts == {"COLD": 2, "STANDARD": 1} and majority_class(counts) == "COLD"
    assert majority_class({"A": 1, "B": 1}) == "A" and majority_class({}) is None
    assert Observation("r", 10, 1, "COLD", dict(counts)).arrived
    assert not Observation("r", 10, 1, "COLD", {"COLD": 1, "STANDARD": 2}).arrived
    assert not Observation("r", 10, 1, "COLD", {}).arrived


def ck(step: int, age_days: float, **kw: Any) -> CheckpointState:
    created = NOW - age_days * DAY
    d: dict[str, Any] = dict(
        run="r", step=step, format="hf", last_event="verified", bytes=100 * GB, files=10, storage_class="STANDARD",
        created_at=created, uploaded_at=created, verified=True, local_evicted=False, last_drill_at=None,
        last_drill_ok=None, metrics={}, updated_at=created, detail="", class_since=created,
    )  # fmt: skip
    d.update(kw)
    return CheckpointState(**d)


def policy(mode: str, tiers: list[tuple[float, str]] | None = None) -> PolicyConfig:
    steps = [TierStep(after_days=d, tier=t) for d, t in (tiers or [(30, "cold")])]  # type: ignore[arg-type]
    return PolicyConfig(keep_hot=1, tiers=steps, apply_mode=mode)  # type: ignore[arg-type]


def storage(p: Any, step: int) -> Any:
    return next(a for a in p.actions if a.step == step and a.kind != "evict_local")


def test_server_mode_leaves_the_move_to_the_lifecycle_and_never_schedules_it_twice() -> None:
    fresh = plan([ck(1, 40), ck(2, 1)], policy("server"), PRICES, "aws", NOW)
    a = storage(fresh, 1)
    assert (a.kind, a.to_class, a.by_lifecycle) == ("transition", "GLACIER", True)
    assert "bucket lifecycle" in a.reason

    when = NOW + 2 * DAY
    pending = ck(1, 40, scheduled_class="GLACIER", scheduled_at=when, last_event="transition_scheduled")
    again = plan([pending, ck(2, 1)], policy("server"), PRICES, "aws", NOW)
    a = storage(again, 1)
    assert a.kind == "keep" and "already scheduled" in a.reason and "GLACIER" in a.reason
    assert [(m.step, m.from_class, m.to_class, m.takes_effect) for m in again.pending] == [
        (1, "STANDARD", "GLACIER", when)
    ]
    # a deeper tier due later is a new move; it replaces the pending one
    deeper = plan([ck(1, 100, scheduled_class="GLACIER", scheduled_at=when), ck(2, 1)],
                  policy("server", [(30, "cold"), (90, "archive")]), PRICES, "aws", NOW)  # fmt: skip
    a = storage(deeper, 1)
    assert (a.kind, a.to_class, a.by_lifecycle) == ("transition", "DEEP_ARCHIVE", True)
    assert deeper.pending == []


def test_client_and_both_modes_copy_now_except_an_archived_object_in_both() -> None:
    for mode in ("client", "both"):
        a = storage(plan([ck(1, 40), ck(2, 1)], policy(mode), PRICES, "aws", NOW), 1)
        assert (a.kind, a.by_lifecycle) == ("transition", False), mode
    tiers = [(30, "cold"), (90, "archive")]
    archived = ck(1, 400, storage_class="GLACIER", class_since=NOW - 300 * DAY)
    a = storage(plan([archived, ck(2, 1)], policy("both", tiers), PRICES, "aws", NOW), 1)
    assert (a.kind, a.to_class, a.by_lifecycle) == ("transition", "DEEP_ARCHIVE", True)
    a = storage(plan([archived, ck(2, 1)], policy("client", tiers), PRICES, "aws", NOW), 1)
    assert a.kind == "keep" and "restore first" in a.reason


def test_cost_bills_a_scheduled_move_in_the_old_class_now_and_shows_it_pending_with_its_date() -> None:
    when = NOW + 2 * DAY
    pending = ck(1, 40, scheduled_class="GLACIER", scheduled_at=when)
    p = plan([pending, ck(2, 1)], policy("server"), PRICES, "aws", NOW)
    s = p.summary
    std = PRICES.monthly_cost(100 * GB, "STANDARD", 10)
    glacier = PRICES.monthly_cost(100 * GB, "GLACIER", 10)
    assert s.monthly_before["r"] == pytest.approx({"STANDARD": 2 * std})
    assert s.monthly_after["r"] == pytest.approx({"STANDARD": std, "GLACIER": glacier})
    assert s.pending_monthly_saving == pytest.approx(std - glacier)
    assert s.one_time_fees_usd == 0  # its fees were the plan's that scheduled it
    md = render_markdown(p)
    assert "| r | 1 | 1 | STANDARD | GLACIER | from 2033-05-20 03:33 UTC |" in md
    assert "scheduled: billed in their old class until their dates" in md
    assert "scheduled   r step 1 save 1 STANDARD -> GLACIER: by the bucket lifecycle, from 2033-05-20" in render_text(p)
    overdue = plan([ck(1, 40, scheduled_class="GLACIER", scheduled_at=NOW - DAY), ck(2, 1)],
                   policy("server"), PRICES, "aws", NOW)  # fmt: skip
    assert "(due: awaiting the lifecycle engine)" in render_markdown(overdue)
    # nothing pending: the plan report is as it was
    assert "Scheduled in the bucket lifecycle" not in render_markdown(
        plan([ck(1, 40)], policy("client"), PRICES, "aws", NOW)
    )


def test_the_applied_digest_and_alert_tell_scheduled_from_moved() -> None:
    p = plan([ck(1, 40), ck(2, 1)], policy("server"), PRICES, "aws", NOW)
    (d,) = applied_by_run(p, [ck(1, 40), ck(2, 1)], {"GLACIER": "cold"})
    assert (d.moved, d.scheduled) == ({}, {"cold": 1})
    a = alerts.build(
        "tier_applied",
        run=d.run,
        moved=d.moved,
        bytes_moved=d.bytes,
        saved_usd_per_month=d.saved_per_month,
        scheduled=d.scheduled,
        flow_run_url=None,
    )
    assert "0 checkpoints moved, 1 scheduled to move by the bucket lifecycle" in a.summary
    assert a.details == ["cold: 1 (scheduled)"]
    plain = alerts.build("tier_applied", run="r", moved={"cold": 2}, bytes_moved=10, saved_usd_per_month=1.0)
    assert plain.reason == "n=2,bytes=10" and "scheduled" not in plain.summary

    sched = Scheduled("r", 1, 1, "ckptvault-tier-cold-t", "GLACIER", utc(2033, 5, 20), 10, 100 * GB)
    obs = Observation("r", 3, 1, "GLACIER", {"GLACIER": 10})
    md = render_applied([], [sched], [obs])
    assert "| r | 1 | 1 | GLACIER | ckptvault-tier-cold-t | 2033-05-20 00:00 UTC |" in md
    assert "| r | 3 | 1 | GLACIER | GLACIER: 10 |" in md
    assert scheduled_record(sched)["takes_effect"] == utc(2033, 5, 20)
