"""Alert kinds and their builders, in one place: `from ckptvault.alerts import kinds as alerts`, then
`alerts.ingest_failed(...)`. The record lives in ckptvault/alerts/alert.py, the wording in
messages_stages.py and messages_health.py; the names are re-exported here so callers keep one import.
"""

from __future__ import annotations

from collections.abc import Callable

from ckptvault.alerts.alert import ALL_RUNS as ALL_RUNS
from ckptvault.alerts.alert import KINDS as KINDS
from ckptvault.alerts.alert import MAX_DETAIL_CHARS as MAX_DETAIL_CHARS
from ckptvault.alerts.alert import MAX_DETAILS as MAX_DETAILS
from ckptvault.alerts.alert import Alert as Alert
from ckptvault.alerts.alert import Severity as Severity
from ckptvault.alerts.alert import escape as escape
from ckptvault.alerts.messages_health import budget_exceeded as budget_exceeded
from ckptvault.alerts.messages_health import catalog_unreadable as catalog_unreadable
from ckptvault.alerts.messages_health import catalog_unreadable_by_run as catalog_unreadable_by_run
from ckptvault.alerts.messages_health import flow_failed as flow_failed
from ckptvault.alerts.messages_health import replica_lagging as replica_lagging
from ckptvault.alerts.messages_health import run_recovered as run_recovered
from ckptvault.alerts.messages_health import run_restarted as run_restarted
from ckptvault.alerts.messages_health import run_stale as run_stale
from ckptvault.alerts.messages_stages import drill_digest as drill_digest
from ckptvault.alerts.messages_stages import drill_failed as drill_failed
from ckptvault.alerts.messages_stages import evict_skipped as evict_skipped
from ckptvault.alerts.messages_stages import ingest_failed as ingest_failed
from ckptvault.alerts.messages_stages import legal_hold as legal_hold
from ckptvault.alerts.messages_stages import lock_drift as lock_drift
from ckptvault.alerts.messages_stages import replicate_failed as replicate_failed
from ckptvault.alerts.messages_stages import restore_completed as restore_completed
from ckptvault.alerts.messages_stages import restore_failed as restore_failed
from ckptvault.alerts.messages_stages import scrub_problem as scrub_problem
from ckptvault.alerts.messages_stages import tier_applied as tier_applied
from ckptvault.alerts.messages_stages import validation_blocked as validation_blocked
from ckptvault.alerts.messages_stages import validation_warned as validation_warned

# keep the builder list next to KINDS so a new kind cannot be added without its wording
BUILDERS: dict[str, Callable[..., Alert]] = {
    "ingest_failed": ingest_failed,
    "validation_blocked": validation_blocked,
    "validation_warned": validation_warned,
    "drill_failed": drill_failed,
    "drill_digest": drill_digest,
    "tier_applied": tier_applied,
    "evict_skipped": evict_skipped,
    "restore_completed": restore_completed,
    "restore_failed": restore_failed,
    "run_stale": run_stale,
    "run_recovered": run_recovered,
    "budget_exceeded": budget_exceeded,
    "flow_failed": flow_failed,
    "run_restarted": run_restarted,
    "catalog_unreadable": catalog_unreadable,
    "legal_hold": legal_hold,
    "lock_drift": lock_drift,
    "replicate_failed": replicate_failed,
    "replica_lagging": replica_lagging,
    "scrub_problem": scrub_problem,
}
assert tuple(BUILDERS) == KINDS
