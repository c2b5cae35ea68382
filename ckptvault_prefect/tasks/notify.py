"""Prefect side of alerting: the Secret-block loader, the flow-run link, and the send task."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptvault.alerts.alert import Alert
from ckptvault.alerts.sending import fold_alert_state, send_alerts
from ckptvault.alerts.watch import AlertState
from ckptvault.config import Config
from ckptvault.store import ObjectStore
from ckptvault_prefect.tasks.retry import io_task, local_task


def load_secret(name: str) -> str | None:
    from prefect.blocks.system import Secret

    block: Any = Secret.load(name)  # sync here: we are not in an event loop
    value = block.get()
    return str(value) if value is not None else None


def flow_run_url() -> str | None:
    """The flow run's page; None in direct mode (no flow run, and no Prefect imported for it)."""
    from ckptvault_prefect.tasks.step import in_direct_mode

    if in_direct_mode():
        return None
    from prefect.runtime import flow_run

    url = flow_run.ui_url
    return str(url) if url else None


@local_task("notify")
def notify_task(cfg: Config, store: ObjectStore, alerts: Sequence[Alert], state: AlertState | None = None) -> int:
    return send_alerts(cfg, store, alerts, load_secret, state)


# the tier flow's: its role may delete, so it folds what flows without deletes left in the alert state
fold_alert_state_task = io_task("fold-alert-state")(fold_alert_state)
