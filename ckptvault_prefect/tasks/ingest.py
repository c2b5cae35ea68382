"""Prefect tasks of the ingest flow: each wraps one library call with retries and logging."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect.artifacts import create_table_artifact

from ckptvault.catalog import Catalog, CheckpointState
from ckptvault.config import Compression, SourceConfig, ValidationRules
from ckptvault.ingest import nodes, quality
from ckptvault.ingest import steps as lib
from ckptvault.ingest.discovery import DiscoveryResult, Found
from ckptvault.ingest.gates import ValidationReport
from ckptvault.manifest import FileEntry, Manifest
from ckptvault.store import ObjectStore, ProgressFn
from ckptvault_prefect.tasks.retry import io_task, local_task


@io_task("ensure-bucket-rules")
def ensure_bucket_rules_task(store: ObjectStore) -> bool:
    """Every bucket we write to aborts incomplete multipart uploads after a day (crashed uploads)."""
    return store.ensure_abort_incomplete_mpu_rule(1)


@io_task("catalog-state")
def known_states_task(catalog: Catalog, run: str) -> dict[int, CheckpointState]:
    return lib.known_states(catalog, run)


@local_task("discover", task_run_name="discover-{source.run}")
def find_checkpoints_task(source: SourceConfig) -> DiscoveryResult:
    return lib.find_checkpoints(source)


@io_task("is-committed")
def is_committed_task(store: ObjectStore, prefix: str, found: Found, save: int = 1) -> bool:
    return lib.is_committed(store, prefix, found, save)


@local_task("validate-structure")
def validate_structure_task(found: Found) -> list[str]:
    return lib.validate_structure(found)


@local_task("quality-gate")
def quality_gate_task(
    found: Found, known: dict[int, CheckpointState], previous: Manifest | None, rules: ValidationRules
) -> ValidationReport:
    return lib.quality_gate(found, known, previous, rules)


@local_task("release-gate-child")
def release_gate_child_task() -> None:
    """A gate child the CLI started ahead (quality.prewarm) and no checkpoint needed: stop it now, not at exit."""
    quality.discard_prewarmed()


@io_task("write-validation")
def write_validation_task(
    store: ObjectStore, prefix: str, found: Found, report: ValidationReport, save: int = 1
) -> str:
    return lib.write_validation(store, prefix, found, report, save)


@io_task("plan-upload")
def plan_upload_task(
    store: ObjectStore, prefix: str, found: Found, save: int = 1, read_local: bool = True
) -> list[lib.FileJob]:
    return lib.plan_upload(store, prefix, found, save, read_local)


@local_task("list-node", task_run_name="list-{ckpt_rel}-node-{node}")
def list_node_task(source_path: Path, ckpt_rel: str, node: int, placement: nodes.Placement) -> nodes.NodeListing:
    """Runs pinned to the node's worker: what that node's own disk holds of the checkpoint."""
    return nodes.list_node(source_path, ckpt_rel, node, placement)


@local_task("validate-node-structure")
def validate_gathered_task(gathered: nodes.Gathered, placement: nodes.Placement) -> list[str]:
    return nodes.validate_gathered(gathered, placement)


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
    return lib.upload_one(store, job, found, sha256=sha256, progress=progress, save=save, compression=compression)


@io_task("commit-manifest")
def commit_manifest_task(
    store: ObjectStore, prefix: str, found: Found, entries: list[FileEntry], save: int = 1
) -> Manifest:
    return lib.commit_manifest(store, prefix, found, entries, save)


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
