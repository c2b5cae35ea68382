"""The watch's decision from the catalog: each run's newest checkpoint, the monthly spend, and `assess`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptvault.alerts.alert import Alert
from ckptvault.alerts.kinds import build, catalog_unreadable_by_run
from ckptvault.alerts.watch import AlertState, budget_alert, stale_runs
from ckptvault.catalog import CheckpointState
from ckptvault.config import ReplicaConfig, SourceConfig
from ckptvault.pricing import PriceTable


def latest_by_run(states: Sequence[CheckpointState]) -> tuple[dict[str, float | None], dict[str, int]]:
    """Newest created_at and its step per run, over checkpoints that reached the store or were seen."""
    at: dict[str, float | None] = {}
    step: dict[str, int] = {}
    for s in states:
        t = s.created_at
        if t is None:
            at.setdefault(s.run, None)
            continue
        if at.get(s.run) is None or t > (at[s.run] or 0.0):
            at[s.run] = t
            step[s.run] = s.step
    return at, step


def monthly_spend(states: Sequence[CheckpointState], prices: PriceTable) -> float:
    """USD/month of what the catalog says is stored (verified and not expired), by storage class."""
    total = 0.0
    for s in states:
        if s.verified:
            total += prices.monthly_cost(s.bytes, s.storage_class or "STANDARD", max(s.files, 1))
    return total


def lagging_replicas(
    wanted: Sequence[tuple[ReplicaConfig, Sequence[CheckpointState]]],
    state: AlertState,
    now: float,
    flow_run_url: str | None = None,
) -> list[Alert]:
    """One `replica_lagging` alert per replica with `max_lag_hours` whose wanted saves (`wanted`: each
    replica with `tiering.replica_selection.wanted`'s choice, which alerts may not import) include some
    committed on the primary longer ago than that and without a `replicated` copy there. An alert already
    delivered (its dedup key in `state.sent`, kept a week) is not emitted again, as a stale run's is not:
    the same oldest late save is one episode."""
    out: list[Alert] = []
    for replica, saves in wanted:
        if replica.max_lag_hours is None:
            continue
        limit = replica.max_lag_hours * 3600
        late = sorted(
            ((s.run, s.step, s.save, at) for s in saves
             if now - (at := _committed_at(s)) > limit and not any(c.store == replica.name for c in s.replicas)),
            key=lambda x: (x[3], x[:3]),
        )  # oldest first  # fmt: skip
        if not late:
            continue
        alert = build("replica_lagging", replica=replica.name, late=late, max_lag_hours=replica.max_lag_hours, now=now,
                      flow_run_url=flow_run_url)  # fmt: skip
        if alert.dedup_key() not in state.sent:
            out.append(alert)
    return out


def _committed_at(s: CheckpointState) -> float:
    """When the save reached the primary: its first uploaded/verified event."""
    return s.uploaded_at if s.uploaded_at is not None else s.updated_at


@dataclass(frozen=True)
class WatchResult:
    """What one watch pass found: the alerts to send, the alert state to keep, and the spend."""

    alerts: list[Alert]
    state: AlertState
    monthly_usd: float


@dataclass(frozen=True)
class WatchReport:
    """What the watch flow reports of a pass: `as_dict` is the `ckptvault watch --json` document (docs/commands.md)."""

    alerts: tuple[str, ...]  # the kind of each alert found, delivered or not
    delivered: int  # how many of them went out (the rest were sent before, or a channel failed)
    monthly_usd: float

    @classmethod
    def of(cls, found: WatchResult, delivered: int) -> WatchReport:
        return cls(tuple(a.kind for a in found.alerts), delivered, found.monthly_usd)

    def as_dict(self) -> dict[str, Any]:
        return {"alerts": list(self.alerts), "delivered": self.delivered, "monthly_usd": self.monthly_usd}


def assess(
    states: Sequence[CheckpointState],
    sources: Sequence[SourceConfig],
    budget_usd_per_month: float | None,
    prices: PriceTable,
    state: AlertState,
    now: float,
    flow_run_url: str | None = None,
    unreadable: Mapping[str | None, Mapping[str, str]] | None = None,
    replicas: Sequence[tuple[ReplicaConfig, Sequence[CheckpointState]]] = (),
) -> WatchResult:
    """The whole watch decision, pure: stale runs (per source's stale_after_hours), the budget, the
    catalog objects the read of `states` could not read (`Catalog.unreadable_by_run`): the hourly watch
    is where a fleet hears of them even when nobody runs `ls`; and the replicas lagging behind the
    primary (`replicas`: each with the saves it should hold, see `lagging_replicas`)."""
    latest_at, latest_step = latest_by_run(states)
    watched = {s.run: s.stale_after_hours for s in sources if s.stale_after_hours is not None}
    found, new_state = stale_runs(latest_at, watched, state, now, latest_step, flow_run_url)
    spend = monthly_spend(states, prices)
    over = budget_alert(spend, budget_usd_per_month, flow_run_url=flow_run_url)
    damaged = catalog_unreadable_by_run(unreadable or {}, flow_run_url)
    behind = lagging_replicas(replicas, state, now, flow_run_url)
    return WatchResult([*found, *([over] if over else []), *damaged, *behind], new_state, spend)
