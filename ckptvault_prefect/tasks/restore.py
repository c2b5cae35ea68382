"""Prefect tasks of the restore and drill flows: one library call each."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ckptvault.catalog import Catalog
from ckptvault.observe.ledger import note_ledger
from ckptvault.restore import complete, fallback, from_manifests, ranged
from ckptvault.restore import copies as copies_lib
from ckptvault.restore import drill as drill_lib
from ckptvault.restore import nodes as on_nodes
from ckptvault.restore import steps as lib
from ckptvault.store import ObjectStore
from ckptvault_prefect.tasks.common import ledger_task, record_task
from ckptvault_prefect.tasks.retry import io_task, local_task
from ckptvault_prefect.tasks.step import Step

log = logging.getLogger("ckptvault.restore")


@io_task("restore-history")
def restore_history_task(catalog: Catalog, run: str) -> from_manifests.RunHistory:
    """The run's events, from its manifests too when an object of its catalog cannot be read: the command
    line's own read when it made one in this process a moment ago (from_manifests.read_run_once)."""
    history = from_manifests.read_run_once(catalog, run)
    if history.unreadable:
        log.warning("%s", from_manifests.fallback_warning(run, history.unreadable))
    return history


open_copies_task = local_task("open-copies")(copies_lib.open_copies)


replica_history_task = io_task("replica-history")(copies_lib.history_from_replicas)


# the command line's own survey of this save when it made one in this process a moment ago
survey_task = io_task("survey-copies")(copies_lib.survey_once)


plan_objects_task = io_task("plan-objects")(lib.plan_objects)


@io_task("request-thaw")
def request_thaw_task(store: ObjectStore, plans: Sequence[lib.ObjectPlan], tier: str) -> dict[str, int]:
    return lib.request_thaw(store, plans, tier)


@io_task("wait-for-thaw")
def wait_for_thaw_task(store: ObjectStore, plans: Sequence[lib.ObjectPlan], deadline_s: float) -> list[lib.ObjectPlan]:
    return lib.wait_for_thaw(store, plans, deadline_s)


staging_dir_task = local_task("stage")(lib.staging_dir)


download_one_task = io_task("download-file", task_run_name="download-{plan.path}")(lib.download_one)


# a big file as ranges ([scale] split_size_mb): made at its size, its ranges fetched, then verified whole
allocate_task = local_task("allocate-file", task_run_name="allocate-{plan.path}")(ranged.allocate)
fetch_range_task = io_task("download-range", task_run_name="download-{plan.path}@{offset}")(ranged.fetch_range)
seal_task = local_task("verify-file", task_run_name="verify-{plan.path}")(ranged.seal)


# the restore's catalog event and alert (ckptvault/restore/complete.py), after the bytes are in place
alert_task = local_task("notify")(complete.alert)
compact_run_task = io_task("compact-catalog")(complete.compact_run)


write_pointer_task = local_task("write-pointer")(lib.write_pointer)


finalize_task = local_task("finalize")(lib.finalize)


forget_task = local_task("forget-file", task_run_name="forget-{plan.path}")(fallback.forget)
download_guarded_task = io_task("download-file", task_run_name="download-{plan.path}")(fallback.download_guarded)
fetch_range_guarded_task = io_task("download-range", task_run_name="download-{plan.path}@{offset}")(
    fallback.fetch_range_guarded
)


@local_task("discard-staging")
def discard_task(staged: Path) -> None:
    lib.discard(staged)


load_report_task = local_task("load-check")(drill_lib.load_report)


# --node-local: each runs pinned to one node's worker, on that node's own disk
stage_on_node_task = local_task("stage-on-node", task_run_name="stage-on-{node}")(on_nodes.stage_on_node)
finalize_on_node_task = local_task("finalize-on-node", task_run_name="finalize-on-{node}")(on_nodes.finalize_on_node)
discard_on_node_task = local_task("discard-on-node", task_run_name="discard-on-{node}")(on_nodes.discard_on_node)
others_seen_task = local_task("shared-check-on-node", task_run_name="shared-check-on-{node}")(on_nodes.others_seen)
undo_on_node_task = local_task("undo-on-node", task_run_name="undo-on-{node}")(on_nodes.undo_on_node)


# The task of each library call the restore protocols make (ckptvault/restore/downloads.py and
# node_local.py), for the flow's submitter: the protocol names the library function, and this is how
# Prefect runs it.
STEPS: dict[Callable[..., Any], Step[..., Any]] = {
    lib.request_thaw: request_thaw_task,
    lib.wait_for_thaw: wait_for_thaw_task,
    complete.record: record_task,
    complete.alert: alert_task,
    note_ledger: ledger_task,
    complete.compact_run: compact_run_task,
    lib.staging_dir: staging_dir_task,
    lib.download_one: download_one_task,
    ranged.allocate: allocate_task,
    ranged.fetch_range: fetch_range_task,
    ranged.seal: seal_task,
    lib.write_pointer: write_pointer_task,
    lib.discard: discard_task,
    fallback.forget: forget_task,
    fallback.download_guarded: download_guarded_task,
    fallback.fetch_range_guarded: fetch_range_guarded_task,
    lib.finalize: finalize_task,
    on_nodes.stage_on_node: stage_on_node_task,
    on_nodes.others_seen: others_seen_task,
    on_nodes.finalize_on_node: finalize_on_node_task,
    on_nodes.undo_on_node: undo_on_node_task,
    on_nodes.discard_on_node: discard_on_node_task,
}
