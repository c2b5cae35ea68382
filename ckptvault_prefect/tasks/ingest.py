"""Prefect tasks of the ingest flow: each wraps one library call with retries and logging."""

from __future__ import annotations

from collections.abc import Sequence

from prefect.artifacts import create_table_artifact

from ckptvault.config import Compression, SourceConfig
from ckptvault.ingest import nodes, quality
from ckptvault.ingest import steps as lib
from ckptvault.ingest.discovery import DiscoveryResult, Found
from ckptvault.manifest import FileEntry
from ckptvault.store import ObjectStore, ProgressFn, SplitUpload
from ckptvault_prefect.tasks.retry import io_task, local_task


@io_task("ensure-bucket-rules")
def ensure_bucket_rules_task(store: ObjectStore) -> bool:
    """Every bucket we write to aborts incomplete multipart uploads after a day (crashed uploads)."""
    return store.ensure_abort_incomplete_mpu_rule(1)


known_states_task = io_task("catalog-state")(lib.known_states)


@local_task("discover", task_run_name="discover-{source.run}")
def find_checkpoints_task(source: SourceConfig) -> DiscoveryResult:
    return lib.find_checkpoints(source)


is_committed_task = io_task("is-committed")(lib.is_committed)


validate_structure_task = local_task("validate-structure")(lib.validate_structure)


quality_gate_task = local_task("quality-gate")(lib.quality_gate)


@local_task("release-gate-child")
def release_gate_child_task() -> None:
    """A gate child the CLI started ahead (quality.prewarm) and no checkpoint needed: stop it now, not at exit."""
    quality.discard_prewarmed()


write_validation_task = io_task("write-validation")(lib.write_validation)


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


commit_manifest_task = io_task("commit-manifest")(lib.commit_manifest)


@local_task("publish-outcomes", record_only=True)
def publish_outcomes_task(outcomes: Sequence[lib.Outcome]) -> None:
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
