"""The staleness and budget watch, and the alert state it shares with the notifier. Pure: no I/O, no clock.

`AlertState` is the one small record the alerting keeps between runs (ckptvault.alerts.sending stores it
under `<prefix>/_state/alerts/`, one file per writer, merged on read with `merge_states`):
- `sent`: dedup key -> when it was last delivered. Written only by `DedupNotifier`, on success.
- `stale`: run -> its open stale episode. Written only by `stale_runs`, which returns a new state.
- `closed`: run -> `newest_at` of its last closed episode: the tombstone that keeps a closed episode
  closed when another writer's older copy of it is merged in. Written only by `stale_runs`.

The watch learns that its stale/recovered alert was delivered by finding the alert's dedup key in
`sent`. That is what makes a failed delivery (Slack down) come back at the next check instead of
being lost, while a delivered one is never repeated for the same episode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ckptvault.alerts.alert import Alert
from ckptvault.alerts.kinds import build
from ckptvault.errors import InvalidArgumentError

SCHEMA = "ckptvault.alerts/1"


@dataclass(frozen=True)
class Episode:
    newest_at: float  # created_at of the newest checkpoint when the run went stale
    opened_at: float
    notified: bool = False  # the run_stale alert was delivered


@dataclass
class AlertState:
    sent: dict[str, float] = field(default_factory=dict)
    stale: dict[str, Episode] = field(default_factory=dict)
    closed: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            "schema": SCHEMA,
            "sent": self.sent,
            "stale": {run: asdict(ep) for run, ep in self.stale.items()},
            "closed": self.closed,
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, origin: str = "_state/alerts.json") -> AlertState:
        """Parse one stored state; `origin` names the object in the error. A document without
        `closed` (written before tombstones existed) has none."""
        try:
            doc: Any = json.loads(data)
            if doc.get("schema") != SCHEMA:
                raise InvalidArgumentError(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
            sent = {str(k): float(v) for k, v in doc["sent"].items()}
            stale = {
                str(run): Episode(float(e["newest_at"]), float(e["opened_at"]), bool(e["notified"]))
                for run, e in doc["stale"].items()
            }
            # Compat: reads documents from before `closed`; may go: with sending.LEGACY_NAME
            closed = {str(run): float(at) for run, at in doc.get("closed", {}).items()}
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise InvalidArgumentError(
                f"alert state is not readable ({e}); delete {origin} to start afresh "
                "(at worst one repeated alert per open episode)"
            ) from None
        return cls(sent=sent, stale=stale, closed=closed)

    def copy(self) -> AlertState:
        return AlertState(sent=dict(self.sent), stale=dict(self.stale), closed=dict(self.closed))


def merge_episodes(a: Episode, b: Episode) -> Episode:
    """Two writers' copies of a run's episode. A later episode (larger `newest_at`: the run made
    progress after the earlier one went stale) replaces an earlier one. Copies of the same episode
    (equal `newest_at`, e.g. opened by two watches at once) keep the first opening and count as
    notified if either writer saw the alert delivered: `notified` only ever goes from False to True."""
    if a.newest_at != b.newest_at:
        return a if a.newest_at > b.newest_at else b
    return Episode(a.newest_at, min(a.opened_at, b.opened_at), a.notified or b.notified)


def merge_states(states: Iterable[AlertState]) -> AlertState:
    """The union of several writers' states; commutative, associative and idempotent, so files can be
    merged in any order, any number of times, and a record kept by any of them is never lost.

    - `sent`: the latest delivery time per dedup key.
    - `stale`: per run, `merge_episodes` of every copy.
    - `closed`: the largest `newest_at` per run; an episode whose `newest_at` is not above its run's
      tombstone is over and is dropped. A new episode always has a larger `newest_at` than the one
      closed before it (the run recovered: a newer checkpoint exists), so a tombstone never hides it.

    Deletions that are not tombstoned do not survive a merge with an older copy: a `sent` record
    pruned by one writer (see `forget_sent_before`) and an episode dropped because its run is no
    longer watched (`stale_runs` drops it again at each check) can come back from another writer's file.
    """
    out = AlertState()
    for s in states:
        for key, at in s.sent.items():
            out.sent[key] = max(at, out.sent.get(key, at))
        for run, ep in s.stale.items():
            cur = out.stale.get(run)
            out.stale[run] = ep if cur is None else merge_episodes(cur, ep)
        for run, newest_at in s.closed.items():
            out.closed[run] = max(newest_at, out.closed.get(run, newest_at))
    for run in [r for r, ep in out.stale.items() if r in out.closed and ep.newest_at <= out.closed[r]]:
        del out.stale[run]
    return out


def forget_sent_before(state: AlertState, cutoff: float) -> AlertState:
    """A copy without the dedup records of deliveries before `cutoff` (unix s). Applied after a merge:
    the copies in other writers' files would otherwise bring back every record ever pruned."""
    out = state.copy()
    out.sent = {k: at for k, at in state.sent.items() if at >= cutoff}
    return out


def stale_runs(
    latest_created_at: dict[str, float | None],
    stale_after_hours: dict[str, float],
    state: AlertState,
    now: float,
    latest_step: dict[str, int] | None = None,
    flow_run_url: str | None = None,
) -> tuple[list[Alert], AlertState]:
    """Alerts for runs that stopped checkpointing and for runs that resumed; `state` is not modified.

    `stale_after_hours` holds only the runs that are watched. A run with no checkpoint at all (None)
    is never stale: without a first checkpoint there is nothing to measure a gap from.
    Per episode: one run_stale (re-emitted until delivered), then one run_recovered (likewise).
    """
    steps = latest_step or {}
    new = state.copy()
    for gone in set(new.stale) - set(stale_after_hours):
        del new.stale[gone]  # no longer watched: nobody would ever close the episode
    alerts: list[Alert] = []
    for run, hours in sorted(stale_after_hours.items()):
        newest = latest_created_at.get(run)
        step = steps.get(run)
        ep = new.stale.get(run)
        if ep is not None:
            stale_alert = build("run_stale", run=run, newest_at=ep.newest_at, stale_after_hours=hours, now=now,
                                step=step, flow_run_url=flow_run_url)  # fmt: skip
            if not ep.notified and stale_alert.dedup_key() in new.sent:
                ep = new.stale[run] = replace(ep, notified=True)
            if newest is None or newest <= ep.newest_at:
                if not ep.notified:
                    alerts.append(stale_alert)
                continue
            recovered = build("run_recovered", run=run, stale_since=ep.newest_at, newest_at=newest, step=step,
                              flow_run_url=flow_run_url)  # fmt: skip
            if ep.notified and recovered.dedup_key() not in new.sent:
                alerts.append(recovered)
                continue
            # recovered and delivered, or nobody was ever told it was stale: the episode is over
            del new.stale[run]
            new.closed[run] = max(ep.newest_at, new.closed.get(run, ep.newest_at))
        if newest is not None and now - newest > hours * 3600:
            new.stale[run] = Episode(newest_at=newest, opened_at=now)
            alerts.append(build("run_stale", run=run, newest_at=newest, stale_after_hours=hours, now=now, step=step,
                                flow_run_url=flow_run_url))  # fmt: skip
    return alerts, new


def budget_alert(
    monthly_usd: float, budget: float | None, run: str = "*", flow_run_url: str | None = None
) -> Alert | None:
    """The budget alert when spend is over the budget; it repeats once per dedup window while over."""
    if budget is None or monthly_usd <= budget:
        return None
    return build("budget_exceeded", monthly_usd=monthly_usd, budget=budget, run=run, flow_run_url=flow_run_url)
