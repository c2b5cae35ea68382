"""The staleness watch over many checks: one stale alert per episode, one recovered, then silence."""

from __future__ import annotations

import pytest

from ckptvault.alerts.alert import Alert
from ckptvault.alerts.channels import DedupNotifier
from ckptvault.alerts.watch import AlertState, Episode, budget_alert, stale_runs

H = 3600.0
T0 = 1_790_000_000.0


class Inbox:
    """A notifier that keeps what it was given; `up=False` makes it fail like an unreachable Slack."""

    def __init__(self) -> None:
        self.got: list[Alert] = []
        self.up = True

    def send(self, alert: Alert) -> bool:
        if not self.up:
            return False
        self.got.append(alert)
        return True


class Watch:
    """Hourly checks as the watch flow does them: load state, compute, send through dedup, persist."""

    def __init__(self, stale_after: float = 2.0) -> None:
        self.inbox = Inbox()
        self.blob = AlertState().to_json()
        self.stale_after = stale_after
        self.emitted: list[Alert] = []

    def check(self, newest: float | None, now: float, step: int | None = None) -> list[Alert]:
        state = AlertState.from_json(self.blob)
        found, state = stale_runs(
            {"r": newest}, {"r": self.stale_after}, state, now, latest_step={"r": step} if step else None
        )
        notifier = DedupNotifier(self.inbox, state, window_seconds=3600, now=lambda: now)
        for a in found:
            notifier.send(a)
        self.blob = state.to_json()
        self.emitted += found
        return found


def kinds(alerts: list[Alert]) -> list[str]:
    return [a.kind for a in alerts]


def test_a_run_that_stops_gives_one_stale_then_one_recovered_then_nothing() -> None:
    w = Watch(stale_after=2.0)
    assert w.check(T0, T0 + 1 * H, step=100) == []  # fresh
    assert kinds(w.check(T0, T0 + 3 * H, step=100)) == ["run_stale"]
    for hour in range(4, 40):  # a day and a half of hourly checks, well past the dedup window
        assert w.check(T0, T0 + hour * H, step=100) == [], f"repeat at hour {hour}"
    assert kinds(w.check(T0 + 40 * H, T0 + 40.5 * H, step=200)) == ["run_recovered"]
    for hour in range(41, 43):  # still checkpointing
        assert w.check(T0 + hour * H, T0 + hour * H + 60, step=300) == []
    assert kinds(w.inbox.got) == ["run_stale", "run_recovered"]
    stale, recovered = w.inbox.got
    assert stale.run == recovered.run == "r"
    assert stale.step == 100 and recovered.step == 200
    assert AlertState.from_json(w.blob).stale == {}


def test_an_undelivered_stale_alert_comes_back_until_delivered() -> None:
    w = Watch()
    w.inbox.up = False
    assert kinds(w.check(T0, T0 + 3 * H)) == ["run_stale"]
    assert kinds(w.check(T0, T0 + 4 * H)) == ["run_stale"]  # Slack was down: try again
    w.inbox.up = True
    assert kinds(w.check(T0, T0 + 5 * H)) == ["run_stale"]
    assert w.check(T0, T0 + 6 * H) == []
    assert kinds(w.inbox.got) == ["run_stale"]
    assert AlertState.from_json(w.blob).stale["r"].notified


def test_an_undelivered_recovered_alert_comes_back_until_delivered() -> None:
    w = Watch()
    w.check(T0, T0 + 3 * H)
    w.inbox.up = False
    assert kinds(w.check(T0 + 4 * H, T0 + 4 * H)) == ["run_recovered"]
    w.inbox.up = True
    assert kinds(w.check(T0 + 4 * H, T0 + 5 * H)) == ["run_recovered"]
    assert w.check(T0 + 5.5 * H, T0 + 6 * H) == []
    assert kinds(w.inbox.got) == ["run_stale", "run_recovered"]


def test_recovery_before_anyone_was_told_is_silent() -> None:
    w = Watch()
    w.inbox.up = False
    w.check(T0, T0 + 3 * H)
    w.inbox.up = True
    assert w.check(T0 + 3.5 * H, T0 + 4 * H) == []
    assert w.inbox.got == []
    assert AlertState.from_json(w.blob).stale == {}


def test_a_second_stall_is_a_second_episode() -> None:
    w = Watch()
    w.check(T0, T0 + 3 * H)
    w.check(T0 + 4 * H, T0 + 4 * H)  # recovered
    w.check(T0 + 4 * H, T0 + 5 * H)  # episode closed
    assert kinds(w.check(T0 + 4 * H, T0 + 7 * H)) == ["run_stale"]
    assert kinds(w.inbox.got) == ["run_stale", "run_recovered", "run_stale"]


def test_stale_at_the_very_check_that_closes_the_last_episode() -> None:
    w = Watch()
    w.check(T0, T0 + 3 * H)
    w.check(T0 + 4 * H, T0 + 4 * H)  # recovered, delivered
    # the next check comes late: the run already stalled again after its new checkpoint
    assert kinds(w.check(T0 + 4 * H, T0 + 9 * H)) == ["run_stale"]


def test_runs_without_checkpoints_or_without_a_threshold_are_not_stale() -> None:
    state = AlertState()
    found, new = stale_runs({"empty": None, "unwatched": T0}, {"empty": 1.0}, state, T0 + 100 * H)
    assert found == []
    assert new.stale == {}


def test_an_episode_of_a_run_no_longer_watched_is_dropped() -> None:
    state = AlertState(stale={"gone": Episode(newest_at=T0, opened_at=T0 + 3 * H, notified=True)})
    found, new = stale_runs({"gone": T0}, {}, state, T0 + 4 * H)
    assert found == []
    assert new.stale == {}


def test_stale_runs_does_not_modify_its_input() -> None:
    state = AlertState()
    before = state.to_json()
    found, new = stale_runs({"r": T0}, {"r": 1.0}, state, T0 + 2 * H)
    assert kinds(found) == ["run_stale"]
    assert state.to_json() == before
    assert "r" in new.stale


def test_threshold_is_strict_and_per_run() -> None:
    found, _ = stale_runs({"a": T0, "b": T0}, {"a": 2.0, "b": 3.0}, AlertState(), T0 + 2.5 * H)
    assert [a.run for a in found] == ["a"]
    found, _ = stale_runs({"a": T0}, {"a": 2.0}, AlertState(), T0 + 2 * H)
    assert found == []


def test_state_round_trips_through_json() -> None:
    s = AlertState(
        sent={"run_stale|r|since=1.000": T0},
        stale={"r": Episode(newest_at=T0 - 5 * H, opened_at=T0, notified=True)},
    )
    assert AlertState.from_json(s.to_json()) == s


@pytest.mark.parametrize("blob", [b"", b"[]", b'{"schema": "other/9"}', b'{"schema": "ckptvault.alerts/1"}'])
def test_unreadable_state_says_how_to_recover(blob: bytes) -> None:
    with pytest.raises(ValueError, match=r"delete _state/alerts\.json"):
        AlertState.from_json(blob)


def test_budget_alert_only_when_over() -> None:
    assert budget_alert(150.0, None) is None
    assert budget_alert(99.0, 100.0) is None
    assert budget_alert(100.0, 100.0) is None
    a = budget_alert(130.0, 100.0)
    assert a is not None
    assert a.kind == "budget_exceeded" and a.run == "*"
    assert "$130.00/month" in a.summary and "$100.00/month" in a.summary
    assert a.details == ["Over by $30.00 (30%)"]


def test_assess_is_the_whole_watch_decision() -> None:
    """Stale runs by each source's threshold and the budget, from catalog states alone."""
    from pathlib import Path

    from ckptvault.alerts.watch_inputs import assess
    from ckptvault.catalog import Event, fold
    from ckptvault.config import SourceConfig
    from ckptvault.pricing import load_prices

    t0 = 1_000_000.0
    gb = 2**30
    states = fold(
        [
            Event("quiet", 1, "verified", t0, bytes=500 * gb, files=1, storage_class="STANDARD", created_at=t0),
            Event("busy", 1, "verified", t0, bytes=1 * gb, files=1, storage_class="STANDARD", created_at=t0 + 5 * H),
        ]
    )
    sources = [
        SourceConfig(run="quiet", path=Path("/x"), stale_after_hours=2),
        SourceConfig(run="busy", path=Path("/y"), stale_after_hours=2),
        SourceConfig(run="unwatched", path=Path("/z")),
    ]
    found = assess(states, sources, 5.0, load_prices(), AlertState(), t0 + 6 * H)
    assert kinds(found.alerts) == ["run_stale", "budget_exceeded"]
    assert found.alerts[0].run == "quiet" and "quiet" in found.state.stale
    assert abs(found.monthly_usd - 501 * 0.023) < 1e-6
    # no budget: no budget alert; the stale alert comes back, since nobody was told yet
    assert kinds(assess(states, sources, None, load_prices(), found.state, t0 + 7 * H).alerts) == ["run_stale"]
    # catalog objects the read skipped: one catalog_unreadable alert per run, the flat layout as every run
    bad = {"busy": {"p/_catalog/run=busy/events/1-a.parquet": "not Parquet"}, None: {"p/_catalog/events/x": "torn"}}
    found = assess(states, sources, None, load_prices(), found.state, t0 + 7 * H, "http://ui/run", bad)
    damaged = [a for a in found.alerts if a.kind == "catalog_unreadable"]
    assert [(a.run, a.reason, a.flow_run_url) for a in damaged] == [
        ("busy", "p/_catalog/run=busy/events/1-a.parquet", "http://ui/run"),
        ("*", "p/_catalog/events/x", "http://ui/run"),
    ]


def _replica_states(copied: tuple[int, ...] = ()) -> list:  # type: ignore[type-arg]
    """Three saves of run r committed 30, 20 and 1 h before T0 + 30 h, from catalog events; `copied`: the
    steps with a `replicated` event for dr."""
    from dataclasses import replace

    from ckptvault.catalog import Event, events, fold

    evs = [Event("r", step, "verified", T0 + at * H, bytes=1, files=1, created_at=T0 + at * H)
           for step, at in ((100, 0), (200, 10), (300, 29))]  # fmt: skip
    for step in copied:
        e = events.replicated("r", step, 1, store="dr", key=f"dr/r/step-{step}/_MANIFEST.json", nbytes=1,
                              seconds=1.0, storage_class="COLD")  # fmt: skip
        evs.append(replace(e, at=T0 + 29.5 * H))
    return fold(evs)


def test_a_replica_behind_its_max_lag_gives_one_alert_naming_it_the_count_and_the_oldest() -> None:
    from ckptvault.alerts.watch_inputs import lagging_replicas
    from ckptvault.config import ReplicaConfig

    dr = ReplicaConfig(name="dr", bucket="dr-bucket", max_lag_hours=12)
    other = ReplicaConfig(name="tape", bucket="tape-bucket", max_lag_hours=48)  # nothing that old yet
    unwatched = ReplicaConfig(name="ceph", bucket="ceph-bucket")  # no max_lag_hours: never an alert
    now = T0 + 30 * H
    states = _replica_states()
    [a] = lagging_replicas([(dr, states), (other, states), (unwatched, states)], AlertState(), now, "http://ui/x")
    assert (a.kind, a.run, a.step, a.flow_run_url) == ("replica_lagging", "*", None, "http://ui/x")
    # steps 100 (30 h) and 200 (20 h) are past 12 h; step 300 (1 h) is not late yet
    assert a.summary == (
        "Replica dr is behind: 2 save(s) committed more than 12 h ago are not copied there; "
        "the oldest, r step 100 save 1, for 30.0 h"
    )
    assert [d.split(":")[0] for d in a.details] == ["r step 100 save 1", "r step 200 save 1"]
    assert "ckptvault replicate --replica dr" in a.next_step
    # a copy recorded for the oldest: the next one is the oldest late save, a new episode
    [b] = lagging_replicas([(dr, _replica_states(copied=(100,)))], AlertState(), now)
    assert "1 save(s)" in b.summary and "r step 200 save 1" in b.summary and b.dedup_key() != a.dedup_key()
    # every late save copied (step 300 is not late): nothing to say
    assert lagging_replicas([(dr, _replica_states(copied=(100, 200)))], AlertState(), now) == []


def test_the_lag_alert_is_sent_once_per_oldest_late_save_not_every_hour() -> None:
    """Hourly watches as the flow runs them (state loaded, assessed, sent through dedup, stored): one
    delivery while the same save is the oldest behind, even past the dedup window; a failed delivery
    comes back."""
    from ckptvault.alerts.watch_inputs import assess
    from ckptvault.config import ReplicaConfig
    from ckptvault.pricing import load_prices

    dr = ReplicaConfig(name="dr", bucket="dr-bucket", max_lag_hours=12)
    inbox, blob = Inbox(), AlertState().to_json()
    delivered: list[int] = []
    for hour, (copied, up) in enumerate([((), False), ((), True), ((), True), ((), True), ((100,), True)]):
        now = T0 + (30 + hour) * H
        states = _replica_states(copied)
        state = AlertState.from_json(blob)
        found = assess(states, [], None, load_prices(), state, now, replicas=[(dr, states)])
        inbox.up = up
        notifier = DedupNotifier(inbox, found.state, window_seconds=1800, now=lambda t=now: t)  # < 1 h
        for alert in found.alerts:
            notifier.send(alert)
        blob = found.state.to_json()
        delivered.append(len(inbox.got))
    # hour 0: Slack down, nothing delivered; hour 1: delivered; hours 2-3: not emitted again;
    # hour 4: step 100 copied, step 200 is now the oldest behind: a new alert
    assert delivered == [0, 1, 1, 1, 2]
    assert ["oldest=r/100/1" in a.reason for a in inbox.got] == [True, False]
