"""The watch flow (hourly): runs that stopped checkpointing, and the storage budget. Wiring only."""

from __future__ import annotations

import time

from prefect import flow

from ckptvault.alerts.watch_inputs import WatchReport
from ckptvault.catalog import Catalog
from ckptvault_prefect.runtime import events as prefect_events
from ckptvault_prefect.runtime.hooks import HOOKS
from ckptvault_prefect.tasks.common import current_states_task, ledger_task, load_config_task, open_store_task
from ckptvault_prefect.tasks.notify import flow_run_url, notify_task
from ckptvault_prefect.tasks.watch import assess_task, load_alert_state_task


@flow(name="watch", log_prints=True, **HOOKS)
def watch(now: float | None = None, config_path: str | None = None) -> WatchReport:
    cfg = load_config_task(config_path)
    store = open_store_task(cfg)
    catalog = Catalog(store, cfg.store.prefix)
    states = current_states_task(catalog)  # skips what it cannot read, and names it in catalog.unreadable
    state = load_alert_state_task(store, cfg.store.prefix)
    t = now if now is not None else time.time()
    found = assess_task(states, cfg, state, t, flow_run_url(), catalog.unreadable_by_run())
    delivered = notify_task(cfg, store, found.alerts, found.state)
    prefect_events.stale(found.alerts)  # each run found stale, for Prefect automations
    for a in found.alerts:
        print(a.text())
    ledger_task(store, cfg.store.prefix, None, "watch", delete=cfg.store.flows_delete)
    return WatchReport.of(found, delivered)
