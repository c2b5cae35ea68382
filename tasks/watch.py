"""Prefect tasks of the watch flow: one library call each."""

from __future__ import annotations

from ckptvault import alerting, watch
from ckptvault.alerts import Alert
from ckptvault.store import ObjectStore
from tasks.retry import io_task, local_task


@io_task("load-alert-state")
def load_alert_state_task(store: ObjectStore, prefix: str) -> watch.AlertState:
    return alerting.load_alert_state(store, prefix)


@local_task("stale-runs")
def stale_runs_task(
    latest_at: dict[str, float | None],
    watched: dict[str, float],
    state: watch.AlertState,
    now: float,
    latest_step: dict[str, int],
    url: str | None,
) -> tuple[list[Alert], watch.AlertState]:
    return watch.stale_runs(latest_at, watched, state, now, latest_step, url)


@local_task("budget")
def budget_task(monthly_usd: float, budget: float | None, url: str | None) -> Alert | None:
    return watch.budget_alert(monthly_usd, budget, flow_run_url=url)
