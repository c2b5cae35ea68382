"""Prefect tasks of the ingest flow: each wraps one library call with retries and logging."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import FileEntry
from ckptvault.command import memo
from ckptvault.config import Compression, SourceConfig, StoreConfig
from ckptvault.ingest import narrow, nodes, quality
from ckptvault.ingest import steps as lib
from ckptvault.ingest.discovery import DiscoveryResult, Found
from ckptvault.store import ObjectStore, ProgressFn, SplitUpload
from ckptvault.store.manifest_load import load_manifest
from ckptvault_prefect.tasks.common import record_task
from ckptvault_prefect.tasks.retry import io_task, local_task
from ckptvault_prefect.tasks.step import Step


@io_task("ensure-bucket-rules")
def ensure_bucket_rules_task(store: ObjectStore, cfg: StoreConfig) -> bool:
    """Every bucket we write to aborts incomplete multipart uploads after a day (crashed uploads);
    checked once per command for `cfg`'s store (`follow`: every few minutes; ckptvault/command/memo.py)."""
    return memo.ensure_abort_rule(store, cfg, 1)


known_states_task = io_task("catalog-state")(lib.known_states)


# the ingest's own read of a manifest (the other passes' load_manifest_task raises RestoreError)
committed_manifest_task = io_task("load-manifest")(load_manifest)


@local_task("discover", task_run_name="discover-{source.run}")
def find_checkpoints_task(source: SourceConfig) -> DiscoveryResult:
    return lib.find_checkpoints(source)


@local_task("discover-step", task_run_name="discover-{source.run}-step-{step}")
def find_step_task(source: SourceConfig, step: int, settle_wait: bool = True) -> DiscoveryResult:
    if settle_wait:
        return narrow.find_step_settled(source, step)
    return narrow.find_step(source, step, time.time())


@local_task("discover-steps", task_run_name="discover-{source.run}-steps")
def find_steps_task(source: SourceConfig, steps: list[int], settle_wait: bool = True) -> DiscoveryResult:
    if settle_wait:
        return narrow.find_steps_settled(source, steps)
    return narrow.find_steps(source, steps, time.time())


is_committed_task = io_task("is-committed")(lib.is_committed)


validate_structure_task = local_task("validate-structure")(lib.validate_structure)


quality_gate_task = local_task("quality-gate")(lib.quality_gate)


@local_task("release-gate-child")
def release_gate_child_task() -> None:
    """A gate child the CLI started ahead (quality.prewarm) and no checkpoint needed: stop it now, not at exit."""
    quality.discard_prewarmed()


write_validation_task = io_task("write-validation")(lib.write_validation)


write_blocks_task = io_task("write-blocks")(lib.write_blocks)


plan_upload_task = io_task("plan-upload")(lib.plan_upload)


# Runs pinned to the node's worker: what that node's own disk holds of the checkpoint.
list_node_task = local_task("list-node", task_run_name="list-{ckpt_rel}-node-{node}")(nodes.list_node)


validate_gathered_task = local_task("validate-node-structure")(nodes.validate_gathered)


@io_task("upload-file", task_run_name="upload-{job.file.rel}")
def upload_one_task(
    store: ObjectStore,
    job: lib.FileJob,
    found: Found,
    sha256: bool = False,
    progress: ProgressFn | None = None,
    save: int = 1,
    compression: Compression = "off",
) -> FileEntry:
    # its own signature, not the library's: Task.map passes every argument by position, and
    # lib.upload_one takes its options by keyword only
    return lib.upload_one(store, job, found, sha256=sha256, progress=progress, save=save, compression=compression)


# A file over [scale] split_size_mb: begun and completed in the flow, its ranges of parts sent by
# tasks that run wherever upload_one_task would (ckptvault/ingest/split.py says which files).
begin_split_task = io_task("begin-split-upload")(lib.begin_split)


@io_task("upload-range", task_run_name="upload-{job.file.rel}-from-part-{first}")
def send_range_task(
    store: ObjectStore,
    job: lib.FileJob,
    upload: SplitUpload,
    first: int,
    count: int,
    progress: ProgressFn | None = None,
) -> lib.SentRange:
    return lib.send_range(store, job, upload, first, count, progress)


finish_split_task = io_task("complete-split-upload")(lib.finish_split)


abort_split_task = io_task("abort-split-upload")(lib.abort_split)


lock_save_task = io_task("lock-save")(lib.lock_save)


commit_manifest_task = io_task("commit-manifest")(lib.commit_manifest)


@local_task("publish-outcomes", record_only=True)
def publish_outcomes_task(outcomes: Sequence[lib.Outcome]) -> None:
    from prefect.artifacts import create_table_artifact  # record_only: never called in direct mode

    rows = [
        {
            "run": o.run,
            "step": o.step,
            "save": o.save,
            "format": o.format,
            "result": o.result,
            "GiB": round(o.bytes / 2**30, 3),
            "files": o.files,
            "uploaded files": o.uploaded_files,
            "seconds": round(o.seconds, 1),
            "message": o.message[:500],
        }
        for o in outcomes
    ]
    create_table_artifact(key="ingest-outcomes", table=rows, description="Each checkpoint seen by this ingest pass")


# The task of each library call the ingest pass makes (ckptvault/ingest/ingest_pass.py), for the flow's
# submitter: the pass names the library function, and this is how Prefect runs it.
STEPS: dict[Callable[..., Any], Step[..., Any]] = {
    Catalog.append: record_task,
    load_manifest: committed_manifest_task,
    lib.is_committed: is_committed_task,
    lib.validate_structure: validate_structure_task,
    nodes.validate_gathered: validate_gathered_task,
    lib.quality_gate: quality_gate_task,
    lib.write_validation: write_validation_task,
    lib.plan_upload: plan_upload_task,
    nodes.list_node: list_node_task,
    lib.upload_one: upload_one_task,
    lib.begin_split: begin_split_task,
    lib.send_range: send_range_task,
    lib.finish_split: finish_split_task,
    lib.abort_split: abort_split_task,
    lib.lock_save: lock_save_task,
    lib.write_blocks: write_blocks_task,
    lib.commit_manifest: commit_manifest_task,
}
