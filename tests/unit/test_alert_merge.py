"""Merging the alert state of several writers (watch.merge_states): what each rule keeps, that the
merge is order-free, and that two watches working from the same stored state lose nothing."""

from __future__ import annotations

import itertools

from ckptvault.alerts.alert import Alert
from ckptvault.alerts.channels import DedupNotifier
from ckptvault.alerts.watch import AlertState, Episode, forget_sent_before, merge_episodes, merge_states, stale_runs

H = 3600.0
T0 = 1_790_000_000.0


class Inbox:
    def __init__(self) -> None:
        self.got: list[Alert] = []

    def send(self, alert: Alert) -> bool:
        self.got.append(alert)
        return True


def test_sent_keeps_every_key_at_its_latest_time() -> None:
    a = AlertState(sent={"x": T0, "y": T0 + 5})
    b = AlertState(sent={"x": T0 + 9, "z": T0 + 1})
    assert merge_states([a, b]).sent == {"x": T0 + 9, "y": T0 + 5, "z": T0 + 1}


def test_a_later_episode_replaces_an_earlier_one() -> None:
    early = Episode(newest_at=T0, opened_at=T0 + 3 * H, notified=True)
    late = Episode(newest_at=T0 + 10 * H, opened_at=T0 + 13 * H)
    assert merge_episodes(early, late) == late
    assert merge_episodes(late, early) == late


def test_copies_of_one_episode_keep_the_first_opening_and_any_delivery() -> None:
    a = Episode(newest_at=T0, opened_at=T0 + 3 * H, notified=False)
    b = Episode(newest_at=T0, opened_at=T0 + 2 * H, notified=True)
    assert merge_episodes(a, b) == Episode(newest_at=T0, opened_at=T0 + 2 * H, notified=True)


def test_a_tombstone_drops_the_closed_episode_and_no_later_one() -> None:
    old_copy = AlertState(stale={"r": Episode(T0, T0 + 3 * H, notified=True), "q": Episode(T0, T0 + 3 * H)})
    closer = AlertState(closed={"r": T0})
    assert merge_states([old_copy, closer]) == AlertState(stale={"q": Episode(T0, T0 + 3 * H)}, closed={"r": T0})
    reopened = AlertState(stale={"r": Episode(T0 + 5 * H, T0 + 8 * H)})
    assert merge_states([old_copy, closer, reopened]).stale["r"] == Episode(T0 + 5 * H, T0 + 8 * H)
    assert merge_states([AlertState(closed={"r": T0 + 5 * H}), closer]).closed == {"r": T0 + 5 * H}


def _samples() -> list[AlertState]:
    return [
        AlertState(sent={"x": T0, "y": T0 + 1}, stale={"r": Episode(T0, T0 + 3 * H)}),
        AlertState(sent={"x": T0 + 2}, stale={"r": Episode(T0, T0 + 2 * H, notified=True)}, closed={"q": T0}),
        AlertState(stale={"q": Episode(T0, T0 + H, notified=True), "s": Episode(T0 + H, T0 + 4 * H)}),
        AlertState(stale={"r": Episode(T0 + 6 * H, T0 + 9 * H)}, closed={"r": T0}),
        AlertState(),
    ]


def test_the_merge_is_commutative_associative_and_idempotent() -> None:
    states = _samples()
    want = merge_states(states)
    for order in itertools.permutations(states):
        assert merge_states(order) == want
    # merging merges (a fold of folds, as successive saves do) changes nothing
    assert merge_states([merge_states(states[:2]), merge_states(states[2:])]) == want
    assert merge_states([want, want, *states]) == want


def test_merge_does_not_modify_its_inputs() -> None:
    states = _samples()
    before = [s.to_json() for s in states]
    merge_states(states)
    assert [s.to_json() for s in states] == before


def test_forget_sent_before_drops_only_older_deliveries() -> None:
    s = AlertState(sent={"old": T0, "edge": T0 + 10, "new": T0 + 20}, closed={"r": T0})
    out = forget_sent_before(s, T0 + 10)
    assert out == AlertState(sent={"edge": T0 + 10, "new": T0 + 20}, closed={"r": T0})
    assert s.sent["old"] == T0


def test_closing_an_episode_leaves_a_tombstone() -> None:
    inbox = Inbox()

    def check(state: AlertState, newest: float, now: float) -> AlertState:
        found, state = stale_runs({"r": newest}, {"r": 2.0}, state, now)
        notifier = DedupNotifier(inbox, state, window_seconds=3600, now=lambda: now)
        for a in found:
            notifier.send(a)
        return state

    state = check(AlertState(), T0, T0 + 3 * H)  # stale, told
    state = check(state, T0 + 4 * H, T0 + 4 * H)  # recovered, told
    assert "r" in state.stale and state.closed == {}
    state = check(state, T0 + 4 * H, T0 + 5 * H)  # the episode is over
    assert state.stale == {} and state.closed == {"r": T0}
    # recovered before anyone was told: closed at once, with a tombstone too
    _, quiet = stale_runs({"r": T0 + 4 * H}, {"r": 2.0}, AlertState(stale={"r": Episode(T0, T0 + 3 * H)}), T0 + 4 * H)
    assert quiet.stale == {} and quiet.closed == {"r": T0}


def test_json_without_tombstones_reads_as_none_and_round_trips_with_them() -> None:
    legacy = b'{"schema": "ckptvault.alerts/1", "sent": {"k": 1.5}, "stale": {}}'
    assert AlertState.from_json(legacy) == AlertState(sent={"k": 1.5})
    s = AlertState(sent={"k": 1.5}, stale={"r": Episode(T0, T0 + H, True)}, closed={"q": T0})
    assert AlertState.from_json(s.to_json()) == s


class Writer:
    """One watch, hourly, against a store that holds several writers' files: it loads their merge,
    checks, sends through dedup, and adds its own file (its whole view)."""

    def __init__(self, files: list[AlertState]) -> None:
        self.files = files
        self.inbox = Inbox()

    def load(self) -> AlertState:
        return merge_states(self.files)

    def check(self, state: AlertState, newest: dict[str, float | None], now: float) -> AlertState:
        found, state = stale_runs(newest, dict.fromkeys(newest, 2.0), state, now)
        notifier = DedupNotifier(self.inbox, state, window_seconds=3600, now=lambda: now)
        for a in found:
            notifier.send(a)
        return state


def test_two_watches_from_the_same_stored_state_lose_nothing() -> None:
    files: list[AlertState] = []
    a, b = Writer(files), Writer(files)
    base = a.check(a.load(), {"r": T0, "q": T0}, T0 + 3 * H)  # both runs go stale, both told
    files.append(base)
    # at once, from the same base: A sees r recover, B sees q recover and a new run go stale
    sa = a.check(a.load(), {"r": T0 + 4 * H, "q": T0}, T0 + 4 * H)
    sb = b.check(b.load(), {"r": T0, "q": T0 + 4 * H, "n": T0 + H}, T0 + 4 * H)
    files += [sa, sb]
    merged = merge_states(files)
    assert set(sa.sent) | set(sb.sent) <= set(merged.sent)
    assert "n" in merged.stale
    # the next check closes both recoveries; neither writer's stale copy brings an episode back
    for _ in range(2):
        files[:] = [a.check(a.load(), {"r": T0 + 4 * H, "q": T0 + 4 * H, "n": T0 + H}, T0 + 5 * H)]
    final = merge_states([*files, base, sa, sb])  # even the old copies, merged in again
    assert set(final.stale) == {"n"}
    assert set(final.closed) == {"r", "q"}
    kinds = sorted(al.kind for al in a.inbox.got + b.inbox.got)
    assert kinds.count("run_recovered") == 2
