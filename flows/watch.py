"""The watch flow (hourly): runs that stopped checkpointing, and the storage budget. Wiring only."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow

from ckptvault.catalog import Catalog
from ckptvault.cost import load_prices
from ckptvault.watch_inputs import latest_by_run, monthly_spend
from flows.hooks import HOOKS
from tasks.common import current_states_task, load_config_task, open_store_task
from tasks.notify import flow_run_url, notify_task
from tasks.watch import budget_task, load_alert_state_task, stale_runs_task


@flow(name="watch", log_prints=True, **HOOKS)
def watch(now: float | None = None, config_path: str | None = None) -> dict[str, Any]:
    cfg = load_config_task(config_path)
    store = open_store_task(cfg)
    states = current_states_task(Catalog(store, cfg.store.prefix))
    t = now if now is not None else time.time()
    latest_at, latest_step = latest_by_run(states)
    watched = {s.run: s.stale_after_hours for s in cfg.sources if s.stale_after_hours is not None}
    state = load_alert_state_task(store, cfg.store.prefix)
    url = flow_run_url()
    found, new_state = stale_runs_task(latest_at, watched, state, t, latest_step, url)
    spend = monthly_spend(states, load_prices(cfg.policy.prices))
    over = budget_task(spend, cfg.notify.budget_usd_per_month, url)
    all_alerts = [*found, *([over] if over else [])]
    delivered = notify_task(cfg, store, all_alerts, new_state)
    for a in all_alerts:
        print(a.text())
    return {"alerts": [a.kind for a in all_alerts], "delivered": delivered, "monthly_usd": spend}
