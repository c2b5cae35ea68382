"""Delivering alerts from a flow: the dedup/episode state lives in the bucket beside the catalog.

Sending never raises: an unreachable Slack is logged and counted, and because an undelivered alert
is not recorded as sent, the next flow run sends it again.

The state is stored one object per save, `<prefix>/_state/alerts/<time_ns:020d>-<uuid4hex>.json`,
never rewritten, and read as the `watch.merge_states` of every such object plus the single
`<prefix>/_state/alerts.json` that older versions rewrote in place. A save re-reads and merges what is
stored, writes the result as a new object, and only then deletes the objects it merged (as
`catalog.compact` does). A record is therefore always in at least one object: two flows saving at once
each write their own object, and the next save folds both into one.

Why not one object updated with conditional writes (If-Match on its ETag, read-merge-retry): tried on
our servers, SeaweedFS and moto honour If-Match on PUT, but Ceph RGW 16.2 answers 412 to the quoted
ETag that S3 returns and boto3 sends back (it matches only the bare hex), and a server that ignores the
header (rclone serve s3 ignores even If-None-Match) would silently turn the loop back into the lost
update it is meant to prevent. One key per writer needs only PUT, LIST, GET and DELETE, which every
server implements the same way.

With `[store] deletes = "tier-only"` (credentials without s3:DeleteObject) a save writes the merge only
when it adds something to what is stored, and deletes nothing; the tier flow's `fold_alert_state` folds
and deletes what those saves left.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence

from ckptvault.alerts.alert import Alert
from ckptvault.alerts.channels import SENT_RETENTION_SECONDS, build_notifier
from ckptvault.alerts.watch import AlertState, forget_sent_before, merge_states
from ckptvault.config import Config
from ckptvault.observe import ledger
from ckptvault.store import ChecksumMismatchError, NotFoundError, ObjectStore, StoreError

log = logging.getLogger("ckptvault.alerts")
STATE_DIR = "_state/alerts/"
# Compat: older versions' single state object, folded in; may go: never, an older writer may recreate it
LEGACY_NAME = "_state/alerts.json"
_FILE_RE = re.compile(r"\d{20}-[0-9a-f]{32}\.json")
# A listing can name an object that a concurrent save folds and deletes before we GET it; its records
# are then in a newer object, which the next listing shows. Rounds, not time, bound the retrying.
_READ_ROUNDS = 5


def _join(prefix: str, name: str) -> str:
    return "/".join(p for p in (prefix.strip("/"), name) if p)


def state_dir(prefix: str) -> str:
    return _join(prefix, STATE_DIR)


def legacy_key(prefix: str) -> str:
    return _join(prefix, LEGACY_NAME)


def new_state_key(prefix: str) -> str:
    return f"{state_dir(prefix)}{time.time_ns():020d}-{uuid.uuid4().hex}.json"


def stored_state_keys(store: ObjectStore, prefix: str) -> list[str]:
    """The objects that make up the stored state: the per-save objects and the legacy one, if present."""
    folder, legacy = state_dir(prefix), legacy_key(prefix)
    # One listing finds both: "_state/alerts" is a prefix of "_state/alerts.json" and "_state/alerts/".
    return [
        o.key
        for o in store.list(folder.removesuffix("/"))
        if o.key == legacy or (o.key.startswith(folder) and _FILE_RE.fullmatch(o.key[len(folder) :]))
    ]


def read_stored_states(store: ObjectStore, prefix: str) -> list[tuple[str, AlertState]]:
    """Each readable stored object with its state. Unreadable ones (bad JSON or schema, CRC32C
    mismatch) are logged and left out: neither merged nor ever deleted, so nothing a newer version
    wrote is destroyed, and one corrupt object does not cost every flow its dedup."""
    legacy = legacy_key(prefix)
    # Per-save objects are never rewritten, so one read is enough; the legacy one may be rewritten
    # by an older version still running.
    known: dict[str, AlertState | None] = {}
    keys: list[str] = []
    for _ in range(_READ_ROUNDS):
        keys = stored_state_keys(store, prefix)
        vanished = False
        for k in keys:
            if k in known and k != legacy:
                continue
            try:
                data = store.get_bytes(k)
            except NotFoundError:
                vanished = True
                continue
            except ChecksumMismatchError as e:
                log.warning("skipping alert state %s: %s", k, e)
                known[k] = None
                continue
            try:
                known[k] = AlertState.from_json(data, origin=k)
            except ValueError as e:
                log.warning("skipping alert state %s: %s", k, e)
                known[k] = None
        if not vanished:
            break
    else:
        log.warning("alert state under %s kept changing while read; using what could be read", state_dir(prefix))
    return [(k, s) for k in keys if (s := known.get(k)) is not None]


def load_alert_state(store: ObjectStore, prefix: str) -> AlertState:
    return merge_states(s for _, s in read_stored_states(store, prefix))


def save_alert_state(
    store: ObjectStore,
    prefix: str,
    state: AlertState,
    *,
    forget_before: float | None = None,
    delete: bool = True,
) -> str | None:
    """Merge `state` into the stored state: write the merge as a new object, then delete the objects
    merged into it. Dedup records older than `forget_before` (unix s) are dropped from the
    merge. Returns the new key, or None when nothing needed writing (the store held exactly this).
    Raises StoreError only if the new object could not be written; then nothing was deleted.
    With `delete=False` nothing is deleted, and nothing is written when the stored objects together
    already say all the merge says (readers merge every object, so folding them gains nothing then)."""
    try:
        parts = read_stored_states(store, prefix)
    except StoreError as e:
        # Writing ours unmerged loses nothing: the next save merges it with what we could not read.
        log.warning("cannot read the stored alert state (%s); writing this run's beside it", e)
        parts = []
    merged = merge_states([state, *(s for _, s in parts)])
    if forget_before is not None:
        merged = forget_sent_before(merged, forget_before)
    if not parts and merged == AlertState():
        return None
    # The hourly watch usually changes nothing: rewriting the one object then is churn, not safety.
    if len(parts) == 1 and parts[0][0] != legacy_key(prefix) and parts[0][1] == merged:
        return None
    if not delete and parts:
        stored = merge_states(s for _, s in parts)
        if forget_before is not None:
            stored = forget_sent_before(stored, forget_before)  # the pruning alone is no news
        if stored == merged:
            return None
    key = new_state_key(prefix)
    store.put_bytes(key, merged.to_json(), if_none_match=True, content_type="application/json")
    if not delete:
        return key  # the folded objects stay until a save that may delete (the tier flow's fold)
    for k, _ in parts:
        try:
            store.delete(k)
        except StoreError as e:
            log.info(
                "could not delete folded alert state %s (%s); the next save folds it again (a role without "
                's3:DeleteObject needs [store] deletes = "tier-only")',
                k,
                e,
            )
    return key


def send_alerts(
    cfg: Config,
    store: ObjectStore,
    alerts: Sequence[Alert],
    secret_loader: Callable[[str], str | None] | None = None,
    state: AlertState | None = None,
) -> int:
    """Send through the configured channels with dedup; returns how many were delivered. The state
    (loaded here unless given) is merged into the stored one afterwards, never written over it."""
    if not alerts and state is None:
        return 0
    try:
        current = state if state is not None else load_alert_state(store, cfg.store.prefix)
    except StoreError as e:
        log.warning("cannot read alert state (%s); sending without dedup", e)
        current = AlertState()
    notifier = build_notifier(cfg.notify, current, secret_loader)
    sent = [a.kind for a in alerts if notifier.send(a)]
    delivered = len(sent)
    try:
        save_alert_state(
            store, cfg.store.prefix, current, forget_before=_forget_before(cfg), delete=cfg.store.flows_delete
        )
    except StoreError as e:
        log.warning("cannot save alert state (%s); some alerts may repeat", e)
    if sent:  # `ckptvault_alerts_sent_total{kind}` (docs/metrics.md): counted where they are delivered
        ledger.note_ledger(store, cfg.store.prefix, ledger.alerts_sent(sent), delete=cfg.store.flows_delete)
    return delivered


def _forget_before(cfg: Config) -> float:
    # The same retention DedupNotifier prunes with: without it here, other writers' copies would bring
    # every pruned record back.
    return time.time() - max(cfg.notify.dedup_window_minutes * 60, SENT_RETENTION_SECONDS)


def fold_alert_state(cfg: Config, store: ObjectStore) -> str | None:
    """The tier flow's tidy-up (its role may delete): merge every stored alert-state object into one and
    delete the rest, as a save does. Flows without deletes (`[store] deletes = "tier-only"`) leave one
    object per save that changed the state; this is what keeps that number to a day's worth."""
    return save_alert_state(store, cfg.store.prefix, AlertState(), forget_before=_forget_before(cfg))
