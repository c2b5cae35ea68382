"""The tier plan waits for a save's replicas (docs/replicas.md, "Tiering waits for the copies"): a save a
replica should hold and does not is neither expired nor moved into an archival class until it does; a
move into a readable class and a local eviction go ahead. From folded catalog states, as `plan` reads them."""

from __future__ import annotations

from dataclasses import replace

from ckptvault.catalog import Event, events, fold
from ckptvault.catalog.model import ReplicaCopy
from ckptvault.config import PolicyConfig, ReplicaConfig, TierStep
from ckptvault.pricing import GB, load_prices
from ckptvault.tiering.policy import Plan, plan
from ckptvault.tiering.replica_selection import unreplicated
from ckptvault.tiering.report import plan_record, render_text
from ckptvault.tiering.result import TierResult
from tests.unit.test_policy import DAY, NOW, ck

PRICES = load_prices({"COLD": 0.002})
ARCHIVE = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=30, tier="archive")], expire_after_days=365)
DR = ReplicaConfig(name="ceph-dr", bucket="dr-bucket", takes="all")
MILESTONES = ReplicaConfig(name="tape", bucket="tape-bucket", takes="milestones")


def planned(states: list, policy: PolicyConfig, replicas: list[ReplicaConfig]) -> Plan:  # type: ignore[type-arg]
    return plan(states, policy, PRICES, "aws", NOW, unreplicated=unreplicated(states, replicas, policy))


def kinds(p: Plan) -> dict[int, str]:
    return {a.step: a.kind for a in p.actions if a.kind != "evict_local"}


def copy(store: str, at: float = NOW) -> ReplicaCopy:
    return ReplicaCopy(store, "COLD", at)


def test_an_archival_move_and_an_expiry_wait_for_the_replica_and_say_so() -> None:
    states = [ck(1, 400), ck(2, 60), ck(3, 0)]
    p = planned(states, ARCHIVE, [DR])
    assert kinds(p) == {1: "keep", 2: "keep", 3: "keep"}
    acts = {a.step: a for a in p.actions}
    assert acts[1].reason == "expiry waits for replica ceph-dr: not copied there yet (the primary's is the only copy)"
    assert acts[2].reason.startswith("transition to DEEP_ARCHIVE waits for replica ceph-dr: not copied there yet")
    assert [(w.step, w.replica, w.action, w.to_class) for w in p.waits] == [
        (1, "ceph-dr", "expire", None),
        (2, "ceph-dr", "transition", "DEEP_ARCHIVE"),
    ]
    # what waits stays where it is: nothing is billed as moved or deleted
    assert p.summary.total_after == p.summary.total_before and p.summary.one_time_fees_usd == 0
    # without the replica (or once it holds them) the same plan moves them
    assert kinds(planned(states, ARCHIVE, [])) == {1: "expire", 2: "transition", 3: "keep"}
    done = [replace(s, replicas=(copy("ceph-dr"),)) for s in states]
    held = planned(done, ARCHIVE, [DR])
    assert kinds(held) == {1: "expire", 2: "transition", 3: "keep"} and held.waits == []


def test_the_plan_shows_the_wait_in_text_and_json() -> None:
    p = planned([ck(2, 60), ck(3, 0)], ARCHIVE, [DR])
    text = render_text(p)
    assert "waits       r step 2 save 1: transition to DEEP_ARCHIVE waits for replica ceph-dr" in text
    assert "(2 checkpoints kept as they are)" in text
    expected = [{"run": "r", "step": 2, "save": 1, "replica": "ceph-dr", "action": "transition",
                 "to_class": "DEEP_ARCHIVE"}]  # fmt: skip
    assert plan_record(p)["waits_for_replica"] == expected
    # a dry-run `tier --json` carries the same list
    assert TierResult.planned(p).as_dict()["waits_for_replica"] == expected


def test_a_readable_class_and_a_local_eviction_do_not_wait() -> None:
    # STANDARD_IA and GLACIER_IR are read as they are, so the replicate pass copies them without a thaw
    warm = PolicyConfig(keep_hot=1, keep_local=1, tiers=[TierStep(after_days=30, tier="warm")])
    p = planned([ck(2, 60), ck(3, 0)], warm, [DR])
    assert kinds(p)[2] == "transition" and p.waits == []
    assert [a.step for a in p.actions if a.kind == "evict_local"] == [2]  # the primary still holds it


def test_each_replica_is_waited_for_only_where_it_should_hold_the_save() -> None:
    # tape takes milestones (every 100 steps): step 150 waits for ceph-dr only, step 100 for both
    pol = ARCHIVE.model_copy(update={"milestone_every_steps": 100})
    states = [ck(100, 60), ck(150, 60, replicas=(copy("tape"),)), ck(200, 0)]
    p = planned(states, pol, [DR, MILESTONES])
    assert [(w.step, w.replica) for w in p.waits] == [(100, "ceph-dr"), (100, "tape"), (150, "ceph-dr")]
    assert "waits for replicas ceph-dr, tape:" in {a.step: a for a in p.actions}[100].reason
    # a replica that holds it is not waited for, another that does not still is
    states[0] = replace(states[0], replicas=(copy("tape"),))
    assert [(w.step, w.replica) for w in planned(states, pol, [DR, MILESTONES]).waits] == [
        (100, "ceph-dr"),
        (150, "ceph-dr"),
    ]
    # a save the replica no longer wants (out of its newest N) does not hold anything back
    newest = ReplicaConfig(name="ceph-dr", bucket="dr-bucket", takes="newest 1")
    assert kinds(planned([ck(1, 400), ck(2, 60), ck(3, 0)], ARCHIVE, [newest])) == {
        1: "expire",
        2: "transition",
        3: "keep",
    }


def test_a_lock_still_postpones_first_and_a_cost_skip_is_not_a_wait() -> None:
    locked = ck(1, 400, locked_until=NOW + 10 * DAY)
    tiny = ck(2, 60, bytes=1000 * 1024, files=1000)  # the move costs more than it saves
    p = planned([locked, tiny, ck(3, 0)], ARCHIVE, [DR])
    assert [x.step for x in p.postponed] == [1] and p.waits == []
    assert kinds(p) == {1: "keep", 2: "skip", 3: "keep"}


def test_from_folded_events_the_replicated_event_releases_the_wait() -> None:
    t0 = NOW - 400 * DAY
    verified = [
        Event("r", step, "verified", t0 + i * 200 * DAY, bytes=100 * GB, files=10, storage_class="STANDARD",
              created_at=t0 + i * 200 * DAY)
        for i, step in enumerate((1, 2))
    ]  # fmt: skip
    newest = Event("r", 3, "verified", NOW, bytes=GB, files=1, storage_class="STANDARD", created_at=NOW)
    states = fold([*verified, newest])
    assert [(w.step, w.action) for w in planned(states, ARCHIVE, [DR]).waits] == [(1, "expire"), (2, "transition")]
    copied = events.replicated("r", 1, 1, store="ceph-dr", key="dr/r/step-1/_MANIFEST.json", nbytes=100 * GB,
                               seconds=9.0, storage_class="COLD")  # fmt: skip
    states = fold([*verified, newest, replace(copied, at=NOW - DAY)])
    p = planned(states, ARCHIVE, [DR])
    assert [(w.step, w.action) for w in p.waits] == [(2, "transition")]
    assert kinds(p)[1] == "expire"
