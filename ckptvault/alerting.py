"""Delivering alerts from a flow: the dedup/episode state lives in the bucket beside the catalog.

Sending never raises: an unreachable Slack is logged and counted, and because an undelivered alert
is not recorded as sent, the next flow run sends it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ckptvault.alerts import Alert
from ckptvault.config import Config
from ckptvault.notify import build_notifier
from ckptvault.store import NotFoundError, ObjectStore, StoreError
from ckptvault.watch import AlertState

log = logging.getLogger("ckptvault.alerts")
STATE_NAME = "_state/alerts.json"


def state_key(prefix: str) -> str:
    return "/".join(p for p in (prefix.strip("/"), STATE_NAME) if p)


def load_alert_state(store: ObjectStore, prefix: str) -> AlertState:
    try:
        return AlertState.from_json(store.get_bytes(state_key(prefix)))
    except NotFoundError:
        return AlertState(sent={}, stale={})
    except ValueError as e:
        log.warning(
            "alert state %s unreadable (%s); starting afresh (some alerts may repeat once)", state_key(prefix), e
        )
        return AlertState(sent={}, stale={})


def save_alert_state(store: ObjectStore, prefix: str, state: AlertState) -> None:
    store.put_bytes(state_key(prefix), state.to_json(), content_type="application/json")


def send_alerts(
    cfg: Config,
    store: ObjectStore,
    alerts: Sequence[Alert],
    secret_loader: Callable[[str], str | None] | None = None,
    state: AlertState | None = None,
) -> int:
    """Send through the configured channels with dedup; returns how many were delivered."""
    if not alerts and state is None:
        return 0
    try:
        current = state if state is not None else load_alert_state(store, cfg.store.prefix)
    except StoreError as e:
        log.warning("cannot read alert state (%s); sending without dedup", e)
        current = AlertState(sent={}, stale={})
    notifier = build_notifier(cfg.notify, current, secret_loader)
    delivered = sum(1 for a in alerts if notifier.send(a))
    try:
        save_alert_state(store, cfg.store.prefix, current)
    except StoreError as e:
        log.warning("cannot save alert state (%s); some alerts may repeat", e)
    return delivered
