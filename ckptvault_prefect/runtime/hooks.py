"""Flow state hooks: a failed or crashed flow run becomes one alert (deduplicated like the rest)."""

from __future__ import annotations

import logging
from typing import Any

from ckptvault.alerts import kinds as alerts
from ckptvault.alerts.sending import send_alerts
from ckptvault.config import load_config
from ckptvault.errors import AlreadyAlerted
from ckptvault.observe import ledger
from ckptvault.store import open_store
from ckptvault_prefect.tasks.notify import load_secret

log = logging.getLogger("ckptvault.alerts")


def alert_on_failure(flow: Any, flow_run: Any, state: Any) -> None:
    """Never raises: a hook that fails would hide the failure it reports."""
    result = state.result(raise_on_failure=False)
    params = flow_run.parameters or {}
    message = str(state.message or state.name)
    alert_failed(flow.name, state.name, message, result, params, getattr(flow_run, "ui_url", None))


def alert_failed(
    flow_name: str, state_name: str, message: str, result: Any, params: dict[str, Any], url: str | None = None
) -> None:
    """One flow_failed alert, unless the flow already alerted for what failed. Never raises. Used by
    the hooks above and by direct mode (ckptvault_prefect/tasks/step.py), where no Prefect state exists."""
    try:
        cfg = load_config(params.get("config_path"))
        store = open_store(cfg.store)
        if flow_name == "restore":  # `ckptvault_restore_failures_total{error_class}` (docs/metrics.md)
            error = type(result).__name__ if isinstance(result, BaseException) else "Unknown"
            counts = {ledger.counter_key("restore_failures", error): 1.0}
            ledger.note_ledger(store, cfg.store.prefix, counts, delete=cfg.store.flows_delete)  # never raises
        if isinstance(result, AlreadyAlerted):  # counted above all the same: a failure alerted is a failure
            return
        run, step = params.get("run"), str(params.get("step") or "")
        kw: dict[str, Any] = {"run": str(run)} if run else {}
        if run and step.isdigit():
            kw["step"] = int(step)
        alert = alerts.build("flow_failed", flow=flow_name, state=state_name, message=message, flow_run_url=url, **kw)
        send_alerts(cfg, store, [alert], load_secret)
    except Exception as e:  # the config itself may be what failed: say so on the console at least
        log.error("flow %s ended %s; the failure alert could not be sent (%s)", flow_name, state_name, e)


HOOKS: dict[str, Any] = {"on_failure": [alert_on_failure], "on_crashed": [alert_on_failure]}
