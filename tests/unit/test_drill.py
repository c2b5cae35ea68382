"""Drill selection: the rotation's guarantee over generated catalogs, then hand-checked edge cases."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptvault.catalog import CheckpointState, Event, fold
from ckptvault.config import ConfigError, parse_config
from ckptvault.restore.drill import (
    DrillFailed,
    DrillReport,
    DrillResult,
    coverage,
    drill_copy,
    holders,
    render_markdown,
    rotating_share,
    select,
)

Key = tuple[str, int, int]
CLASSES = ("STANDARD", "STANDARD_IA", "GLACIER", "DEEP_ARCHIVE")
REPO = Path(__file__).resolve().parents[2]


# --- catalogs as event logs, folded the way the flow reads them -------------------------------------------


def verified(run: str, step: int, at: float, *, save: int = 1, storage_class: str = "STANDARD") -> list[Event]:
    return [
        Event(run=run, step=step, save=save, event="uploaded", at=at, format="hf", bytes=1000, files=2),
        Event(run=run, step=step, save=save, event="verified", at=at, storage_class=storage_class),
    ]


def drill_events(results: Sequence[DrillResult], at: float) -> list[Event]:
    """What the flow records (DrillResult.event), on a simulated clock: the builder's own time.time() would
    make the order of two quick simulated drills depend on the machine's clock resolution."""
    return [dataclasses.replace(r.event(), at=at) for r in results]


def result(s: CheckpointState, ok: bool = True) -> DrillResult:
    return DrillResult(s.run, s.step, s.save, ok, 1.0, s.bytes, () if ok else ("boom",))


def drillable_keys(states: Iterable[CheckpointState]) -> set[Key]:
    """Drillable as docs/drills.md states it, independently of the module: verified, live, not superseded."""
    return {s.key for s in states if s.verified and s.state not in ("expired", "superseded")}


def expected_newest(states: Iterable[CheckpointState]) -> set[Key]:
    best: dict[str, Key] = {}
    for k in sorted(drillable_keys(states)):
        if k[0] not in best or k[1:] > best[k[0]][1:]:
            best[k[0]] = k
    return set(best.values())


@st.composite
def catalogs(draw: st.DrawFn) -> list[Event]:
    """Any number of runs, steps and saves, in every lifecycle state, with arbitrary drill histories
    (ties in time included), all before t = 1000."""
    out: list[Event] = []
    for r in range(draw(st.integers(0, 4))):
        run = f"run{r}"
        steps = draw(st.lists(st.integers(0, 50), max_size=8, unique=True))
        for step in steps:
            for save in range(1, draw(st.integers(1, 2)) + 1):
                fate = draw(st.sampled_from(["pending", "verified", "verified", "verified", "superseded", "expired"]))
                at = float(draw(st.integers(0, 600)))
                if fate == "pending":
                    out.append(Event(run=run, step=step, save=save, event="discovered", at=at))
                    continue
                out += verified(run, step, at, save=save, storage_class=draw(st.sampled_from(CLASSES)))
                if draw(st.booleans()):
                    drilled_at = float(draw(st.integers(int(at) + 1, 900)))
                    out.append(Event(run=run, step=step, save=save, event="drilled", at=drilled_at,
                                     ok=draw(st.booleans())))  # fmt: skip
                if fate == "superseded":
                    out.append(Event(run=run, step=step, save=save, event="superseded", at=950.0))
                elif fate == "expired":
                    out.append(Event(run=run, step=step, save=save, event="expired", at=960.0))
    return out


PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(
    catalogs(),
    st.integers(1, 4),
    st.none() | st.sampled_from([3.0, 7.0, 14.0, 30.0, 90.0]),
    st.sampled_from([1.0, 7.0]),
    st.data(),
)
@PROPS
def test_every_drillable_checkpoint_is_drilled_within_the_stated_window(
    log: list[Event], sample: int, cover_days: float | None, interval_days: float, data: st.DataObject
) -> None:
    states = fold(log)
    able = drillable_keys(states)
    newest = expected_newest(states)
    m = len(able) - len(newest)
    share = rotating_share(sample, m, cover_days, interval_days)
    window = max(1, math.ceil(m / share))  # the stated guarantee: ceil(M/s) drills, M = drillable minus newests
    assert window <= max(1, math.ceil(len(able) / sample)), "the headline bound ceil(N/s) must hold too"
    if cover_days is not None and cover_days >= interval_days:
        assert window * interval_days <= cover_days
    drills: list[set[Key]] = []
    clock = 1000.0
    for _ in range(2 * window):
        sel = select(states, sample, cover_days=cover_days, interval_days=interval_days)
        shuffled = data.draw(st.permutations(states))
        assert select(shuffled, sample, cover_days=cover_days, interval_days=interval_days) == sel, "order matters"
        chosen = {s.key for s in sel.chosen}
        assert len(chosen) == len(sel.chosen)
        assert chosen <= able, "only drillable checkpoints are drilled"
        assert newest <= chosen, "each run's newest is drilled every time"
        suspects = {s.key for s in states if s.key in able and s.last_drill_ok is False}
        assert suspects <= chosen, "a suspect is re-drilled at once"
        queue = able - newest - suspects
        assert len(chosen - newest - suspects) == min(share, len(queue))
        assert (sel.window, sel.sample, sel.drillable) == (window, share, len(able))
        oks = [data.draw(st.booleans(), label=f"drill of {s.key} passes") for s in sel.chosen]
        clock += 1.0
        log = log + drill_events([result(s, ok) for s, ok in zip(sel.chosen, oks, strict=True)], clock)
        states = fold(log)
        drills.append(chosen)
    # "in every `window` consecutive drills", not only the first ones
    for start in range(len(drills) - window + 1):
        covered = set().union(*drills[start : start + window])
        assert covered == able, f"never drilled in drills {start}..{start + window - 1}: {sorted(able - covered)}"
    cov = coverage(states, clock, sample, cover_days=cover_days, interval_days=interval_days)
    assert cov.never_drilled == 0 and cov.drillable == len(able) and cov.window == window


# --- hand-checked cases ---------------------------------------------------------------------------------


def one_run(n: int, archived: int = 0, run: str = "r") -> list[Event]:
    return [
        e
        for i in range(n)
        for e in verified(run, (i + 1) * 100, float(i), storage_class="GLACIER" if i < archived else "STANDARD")
    ]


def simulate(log: list[Event], sample: int, drills: int, **kw: float) -> list[list[Key]]:
    out = []
    for i in range(drills):
        sel = select(fold(log), sample, **kw)
        out.append([s.key for s in sel.chosen])
        log = log + drill_events([result(s) for s in sel.chosen], 1000.0 + i)
    return out


def test_the_issue_case_ten_checkpoints_of_one_run_are_all_drilled_within_five_drills() -> None:
    # the case measured in the field: 7 of 10 archived, sample 2; before, 8 of 10 were never drilled in 20 drills
    drills = simulate(one_run(10, archived=7), 2, 5)
    assert all(("r", 1000, 1) in d for d in drills), "the newest, every time"
    assert all(len(d) == 3 for d in drills), "the newest plus the sample of 2"
    assert {k for d in drills for k in d} == {("r", s, 1) for s in range(100, 1001, 100)}
    # never drilled first, oldest upload first: the oldest (archived) ones go first
    assert drills[0] == [("r", 100, 1), ("r", 200, 1), ("r", 1000, 1)]


def test_two_runs_drill_beyond_their_newest() -> None:
    log = one_run(5, run="a") + one_run(5, run="b")
    drills = simulate(log, 2, 4)  # M = 8 others, 2 per drill
    assert all({("a", 500, 1), ("b", 500, 1)} <= set(d) for d in drills)
    assert {k for d in drills for k in d} == {(r, s, 1) for r in "ab" for s in range(100, 501, 100)}


def test_more_runs_than_the_sample_still_rotates_the_rest() -> None:
    log = [e for r in "abcde" for e in one_run(3, run=r)]
    sel = select(fold(log), 2)
    assert len(sel.newest) == 5 and len(sel.queued) == 2 and len(sel.chosen) == 7
    assert sel.window == 5  # M = 10 others, 2 per drill
    drills = simulate(log, 2, 5)
    assert {k for d in drills for k in d} == {s.key for s in fold(log)}


def test_nothing_drillable() -> None:
    log = [
        Event(run="r", step=1, event="discovered", at=1.0),
        Event(run="r", step=2, event="invalid", at=1.0),
        *verified("r", 3, 1.0),
        Event(run="r", step=3, event="expired", at=2.0),
    ]
    sel = select(fold(log), 2)
    assert (sel.chosen, sel.drillable, sel.rotating, sel.window) == ((), 0, 0, 1)
    assert select([], 2).chosen == ()
    cov = coverage(fold(log), 10.0, 2)
    assert (cov.drillable, cov.never_drilled, cov.suspect, cov.oldest_drill_age_days) == (0, 0, 0, None)


def test_superseded_saves_are_never_drilled_and_never_the_newest() -> None:
    # step 300 was saved on a branch the job abandoned (it restarted from step 200)
    log = [*verified("r", 100, 1.0), *verified("r", 200, 2.0), *verified("r", 300, 3.0)]
    log.append(Event(run="r", step=300, event="superseded", at=4.0, detail='{"reason": "run restarted"}'))
    sel = select(fold(log), 5)
    assert [s.key for s in sel.chosen] == [("r", 100, 1), ("r", 200, 1)]
    assert sel.newest == {("r", 200, 1)}


def test_two_saves_of_a_step_are_two_checkpoints_and_a_drill_marks_only_its_own() -> None:
    log = [*verified("r", 100, 1.0), *verified("r", 200, 2.0, save=1), *verified("r", 200, 3.0, save=2)]
    states = fold(log)
    sel = select(states, 1)
    assert sel.newest == {("r", 200, 2)}
    assert sel.queued == (("r", 100, 1),)  # never drilled, oldest upload first
    log += drill_events([result(s) for s in sel.chosen], 10.0)
    after = {s.key: s for s in fold(log)}
    assert after[("r", 200, 2)].last_drill_at == 10.0 and after[("r", 200, 1)].last_drill_at is None
    assert select(list(after.values()), 1).queued == (("r", 200, 1),)


def test_drilled_events_carry_the_save() -> None:
    r = DrillResult("r", 200, 3, True, 1.0, 10)
    e = r.event()
    assert (e.run, e.step, e.save, e.event, e.ok) == ("r", 200, 3, "drilled", True)


def test_a_suspect_is_redrilled_every_time_until_a_drill_passes() -> None:
    log = one_run(6)
    log.append(Event(run="r", step=100, event="drilled", at=50.0, ok=False))
    for t in (60.0, 61.0):  # fails again, then passes
        sel = select(fold(log), 1)
        assert ("r", 100, 1) in sel.suspect and len(sel.chosen) == 3  # newest, suspect, 1 from the queue
        log += drill_events([result(s, ok=(s.step != 100 or t == 61.0)) for s in sel.chosen], t)
    sel = select(fold(log), 1)
    assert not sel.suspect and ("r", 100, 1) not in {s.key for s in sel.chosen}


def test_queue_order_never_drilled_then_least_recently_drilled_then_key() -> None:
    # step 4 was uploaded before step 5: never drilled either, it has waited longer
    log = [e for s in (1, 2, 3, 4, 5, 9) for e in verified("r", s, 0.5 if s == 4 else 1.0)]
    log += [
        Event(run="r", step=1, event="drilled", at=30.0, ok=True),
        Event(run="r", step=2, event="drilled", at=20.0, ok=True),
        Event(run="r", step=3, event="drilled", at=20.0, ok=True),
    ]
    assert select(fold(log), 5).queued == (("r", 4, 1), ("r", 5, 1), ("r", 2, 1), ("r", 3, 1), ("r", 1, 1))


def test_cover_days_grows_the_sample_to_fit_the_schedule() -> None:
    assert rotating_share(2, 20, None, 7.0) == 2
    assert rotating_share(2, 20, 28.0, 7.0) == 5  # 4 drills in 28 days: 20 / 4
    assert rotating_share(2, 20, 30.0, 7.0) == 5  # a partial week does not count
    assert rotating_share(8, 20, 28.0, 7.0) == 8  # never below the configured sample
    assert rotating_share(2, 20, 3.0, 7.0) == 20  # shorter than one interval: everything, every drill
    assert rotating_share(2, 0, 3.0, 7.0) == 2
    with pytest.raises(ValueError, match="interval"):
        rotating_share(2, 20, 28.0, None)
    with pytest.raises(ValueError, match="sample"):
        rotating_share(0, 20, None, None)
    drills = simulate(one_run(21), 2, 4, cover_days=28.0, interval_days=7.0)
    assert {k for d in drills for k in d} == {s.key for s in fold(one_run(21))}


def test_coverage_counts_and_oldest_drill_age() -> None:
    log = one_run(4)
    log += [
        Event(run="r", step=100, event="drilled", at=86400.0, ok=True),
        Event(run="r", step=200, event="drilled", at=3 * 86400.0, ok=False),
    ]
    cov = coverage(fold(log), 5 * 86400.0, 2)
    assert (cov.drillable, cov.never_drilled, cov.suspect, cov.oldest_drill_age_days) == (4, 2, 1, 4.0)
    assert cov.as_dict() == {
        "drillable": 4, "never_drilled": 2, "suspect": 1, "oldest_drill_age_days": 4.0, "sample": 2, "window": 2,
        "cover_days": None, "interval_days": None,
    }  # fmt: skip


def test_the_selection_is_sorted_by_key() -> None:
    states = fold(one_run(5, run="b") + one_run(5, run="a"))
    assert [s.key for s in select(states, 1).chosen] == [("a", 100, 1), ("a", 500, 1), ("b", 500, 1)]


def test_report_rows_and_markdown_name_the_save() -> None:
    not_run = "a/: Orbax item: CRC32C only; Orbax restore not run"
    r = DrillResult("r", 200, 2, False, 1.234, 2**30, ("x.safetensors: bad",),
                    ("x.safetensors: safetensors: every tensor read", not_run), (not_run,))  # fmt: skip
    assert r.row() == {"run": "r", "step": 200, "save": 2, "ok": False, "seconds": 1.23,
                       "problems": ["x.safetensors: bad"], "checks": list(r.checks), "not_run": [not_run],
                       "store": "primary", "verify": None}  # fmt: skip
    assert json.loads(r.detail())["checks"] == list(r.checks)
    md = render_markdown([r], ["r step 300 save 2"], coverage(fold(one_run(3)), 10.0, 2))
    assert "| r | 200 | 2 | **NO** |" in md and "r step 300 save 2" in md and "3 drillable" in md
    assert "could not run" in md and "- r step 200 save 2: a/: Orbax item" in md
    err = DrillFailed(DrillReport((r,), (), coverage(fold(one_run(3)), 10.0, 2)))
    assert "r step 200 save 2" in str(err) and err.report.pending == ()


# --- configuration and schedule -------------------------------------------------------------------------


def test_cover_days_in_the_config() -> None:
    base = "[store]\nbucket = 'ckpts'\n[drill]\n"
    assert parse_config(base + "sample = 3\ncover_days = 28\n").drill.cover_days == 28.0
    assert parse_config(base).drill.cover_days is None
    with pytest.raises(ConfigError, match=r"drill\.cover_days"):
        parse_config(base + "cover_days = 0\n")
    with pytest.raises(ConfigError, match=r"drill\.cover_day: unknown key"):
        parse_config(base + "cover_day = 28\n")


def test_the_drill_deployment_passes_its_schedule_interval() -> None:
    import asyncio

    from prefect.server.schemas.schedules import CronSchedule

    from ckptvault_prefect.flows.drill import INTERVAL_DAYS

    prefect_yaml = REPO / "ckptvault_prefect/deployments/prefect.yaml"
    spec = next(d for d in yaml.safe_load(prefect_yaml.read_text())["deployments"]
                if d["name"] == "drill")  # fmt: skip
    [sched] = spec["schedules"]
    # the fire times as the Prefect server computes them from the deployment's schedule
    cron = CronSchedule(cron=sched["cron"], timezone=sched["timezone"])
    fires = asyncio.run(cron.get_dates(n=9, start=datetime(2026, 1, 1, tzinfo=UTC)))
    gaps = {(b - a).total_seconds() / 86400 for a, b in itertools.pairwise(fires)}
    assert gaps == {spec["parameters"]["interval_days"]} == {INTERVAL_DAYS}


# --- which copy each drilled save is restored from (docs/replicas.md, "Restore from a copy") -------------


def _replicated(run: str, step: int, store: str, at: float, save: int = 1) -> Event:
    return Event(run=run, step=step, save=save, event="replicated", at=at, detail=json.dumps({"store": store}))


def test_holders_are_the_primary_then_the_configured_replicas_a_replicated_event_names() -> None:
    history = [_replicated("r", 10, "far", 1.0), _replicated("r", 10, "dr", 2.0), _replicated("r", 20, "other", 3.0),
               _replicated("r", 10, "gone", 4.0)]  # fmt: skip
    verified = [Event(run="r", step=st, save=sv, event="verified", at=0.5) for st, sv in ((10, 1), (20, 1), (10, 2))]
    states = {s.key: s for s in fold([*verified, *history])}
    assert holders(states[("r", 10, 1)], ["dr", "far"]) == ["primary", "dr", "far"]  # the configuration's order
    assert holders(states[("r", 20, 1)], ["dr", "far"]) == ["primary"]
    assert holders(states[("r", 10, 2)], ["dr", "far"]) == ["primary"]  # another save of the step


def test_drills_rotate_over_every_copy_of_a_save_least_recently_drilled_first() -> None:
    key = ("r", 10, 1)
    copies = ["primary", "dr", "far"]
    history: list[Event] = [*verified("r", 10, 0.0), *verified("r", 20, 0.0)]
    picked = []
    for at in range(1, 7):
        store = drill_copy(key, copies, history)
        picked.append(store)
        history.append(dataclasses.replace(DrillResult("r", 10, 1, True, 1.0, 10, store=store).event(), at=float(at)))
        # another save's drills never move this one's rotation
        other = DrillResult("r", 20, 1, True, 1.0, 10, store="dr").event()
        history.append(dataclasses.replace(other, at=float(at)))
    assert picked == ["primary", "dr", "far", "primary", "dr", "far"]
    # a drill recorded before copies existed (no `store` in its detail) was of the primary
    old = Event(run="r", step=10, save=1, event="drilled", at=5.0, ok=True, detail=json.dumps({"seconds": 1}))
    assert drill_copy(key, ["primary", "dr"], [old]) == "dr"
    # a copy that joins later (a new replica) is drilled next, being never drilled
    assert drill_copy(key, [*copies, "new"], history) == "new"
    # only the reachable copies are offered: the least recently drilled among them
    assert drill_copy(key, ["primary", "far"], history) == "primary"
    assert json.loads(DrillResult("r", 10, 1, True, 1.0, 10, store="dr").detail())["store"] == "dr"
