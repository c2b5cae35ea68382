"""The ingest flow: discover, validate, gate, upload, commit, record. Wiring only; the work is in tasks."""

from __future__ import annotations

import time

from prefect import flow, unmapped
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from ckptvault import alerts, events
from ckptvault.catalog import Catalog, CheckpointState
from ckptvault.config import Config
from ckptvault.discovery import Found
from ckptvault.gates import ValidationReport
from ckptvault.ingest import DONE_STATES, Outcome, previous_verified_step
from ckptvault.outcomes import IngestIncomplete
from ckptvault.progress import ProgressBar
from ckptvault.store import ObjectStore
from flows.hooks import HOOKS
from tasks.common import load_config_task, load_manifest_task, open_store_task, publish_markdown_task, record_task
from tasks.futures import settle
from tasks.ingest import (
    commit_manifest_task,
    ensure_bucket_rules_task,
    find_checkpoints_task,
    is_committed_task,
    known_states_task,
    plan_upload_task,
    publish_outcomes_task,
    quality_gate_task,
    release_gate_child_task,
    upload_one_task,
    validate_structure_task,
    write_validation_task,
)
from tasks.notify import flow_run_url, notify_task
from tasks.retry import RETRIES


def _gate(cfg: Config, store: ObjectStore, found: Found, known: dict[int, CheckpointState]) -> ValidationReport:
    prev_step = previous_verified_step(known, found.step)
    previous = load_manifest_task(store, cfg.store.prefix, found.run, prev_step) if prev_step is not None else None
    report = quality_gate_task(found, known, previous, cfg.validation)
    write_validation_task(store, cfg.store.prefix, found, report)
    return report


def _ingest_one(
    cfg: Config, store: ObjectStore, catalog: Catalog, found: Found, state: CheckpointState | None,
    known: dict[int, CheckpointState], reports: list[ValidationReport], run_id: str,
) -> Outcome:  # fmt: skip
    t0 = time.monotonic()
    base = Outcome(found.run, found.step, found.format, "", found.total_bytes, len(found.files))
    if not found.ready:
        return base.with_result("waiting", found.reason)
    if state is not None and state.state in DONE_STATES:
        return base.with_result("present")
    prefix = cfg.store.prefix
    if is_committed_task(store, prefix, found):
        if state is None or not state.verified:
            # committed by a run that died before recording it: the manifest is the truth, record it
            manifest = load_manifest_task(store, prefix, found.run, found.step)
            record_task(catalog, [events.verified(manifest, run_id)])
        return base.with_result("present", "manifest already in the store")
    accepted = state is not None and state.state == "accepted"  # a human reviewed it: no gates
    problems = [] if accepted else validate_structure_task(found)
    warnings: list[str] = []
    if not problems and not accepted and cfg.validation.enabled:
        report = _gate(cfg, store, found, known)
        reports.append(report)
        if report.blocked:
            problems = report.reasons()
        elif report.warned:
            warnings = report.reasons()
    if problems:
        if state is None or state.state != "invalid":
            record_task(catalog, [events.rejected(found, problems, run_id)])
        return base.with_result("invalid", "; ".join(problems))
    jobs = plan_upload_task(store, prefix, found)
    bar = ProgressBar(found.total_bytes, f"{found.run} step {found.step}")
    futures = upload_one_task.map(unmapped(store), jobs, unmapped(found), unmapped(cfg.sha256), unmapped(bar))
    errors = settle(futures)
    if errors:
        return base.with_result("failed", "; ".join(errors), time.monotonic() - t0)
    manifest = commit_manifest_task(store, prefix, found, [f.result() for f in futures])
    flagged = [events.rejected(found, warnings, run_id, kind="warned")] if warnings else []
    record_task(catalog, [*flagged, events.verified(manifest, run_id)])
    sent = sum(1 for j in jobs if j.upload)
    outcome = base.with_result("warned" if warnings else "uploaded", "; ".join(warnings), time.monotonic() - t0)
    return outcome.with_uploaded(sent)


@flow(name="ingest", task_runner=ThreadPoolTaskRunner(max_workers=2), log_prints=True, **HOOKS)  # type: ignore[arg-type]
def ingest(config_path: str | None = None) -> list[Outcome]:
    """One pass over every configured source. Fails (after recording everything) if any finished
    checkpoint ended neither uploaded nor already present."""
    cfg = load_config_task(config_path)
    store = open_store_task(cfg)
    ensure_bucket_rules_task(store)
    catalog = Catalog(store, cfg.store.prefix)
    run_id = str(flow_run.id or "")
    outcomes: list[Outcome] = []
    reports: list[ValidationReport] = []
    for source in cfg.sources:
        known = known_states_task(catalog, source.run)
        result = find_checkpoints_task(source)
        for problem in result.problems:
            print(f"{source.run}: {problem}")
        for found in result.found:
            try:
                outcomes.append(_ingest_one(cfg, store, catalog, found, known.get(found.step), known, reports, run_id))
            except Exception as e:  # one broken checkpoint must not stop the others
                outcomes.append(Outcome(found.run, found.step, found.format, "failed", found.total_bytes,
                                        len(found.files), message=str(e)))  # fmt: skip
    release_gate_child_task()
    publish_outcomes_task(outcomes)
    if reports:
        publish_markdown_task("ingest-validation", "\n\n".join(r.to_markdown() for r in reports), "quality gates")
    url = flow_run_url()
    notify_task(
        cfg,
        store,
        [
            alerts.validation_blocked(o.run, o.step, o.message.split("; "), url)
            for o in outcomes
            if o.result == "invalid"
        ]
        + [
            alerts.validation_warned(o.run, o.step, o.message.split("; "), url)
            for o in outcomes
            if o.result == "warned"
        ]
        + [alerts.ingest_failed(o.run, o.step, o.message, 1 + RETRIES, url) for o in outcomes if o.result == "failed"],
    )
    if not all(o.ok for o in outcomes):
        raise IngestIncomplete(outcomes)
    return outcomes
