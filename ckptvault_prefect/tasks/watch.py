"""Prefect tasks of the watch flow: one library call each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ckptvault.alerts import sending as alerting
from ckptvault.alerts import watch, watch_inputs
from ckptvault.catalog import CheckpointState
from ckptvault.config import Config
from ckptvault.pricing import load_prices
from ckptvault.tiering.replica_selection import wanted
from ckptvault_prefect.tasks.retry import io_task, local_task

load_alert_state_task = io_task("load-alert-state")(alerting.load_alert_state)


@local_task("assess")
def assess_task(
    states: Sequence[CheckpointState],
    cfg: Config,
    state: watch.AlertState,
    now: float,
    url: str | None,
    unreadable: Mapping[str | None, Mapping[str, str]] | None = None,
) -> watch_inputs.WatchResult:
    prices = load_prices(cfg.policy.prices)
    budget = cfg.notify.budget_usd_per_month
    # which saves each replica should hold is the tiering wing's choice, which alerts may not import
    lag = [(r, wanted(states, r, cfg.policy, now)) for r in cfg.replicas if r.max_lag_hours is not None]
    return watch_inputs.assess(states, cfg.sources, budget, prices, state, now, url, unreadable, lag)
