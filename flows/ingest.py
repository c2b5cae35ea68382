"""The ingest flow: discover, validate, upload, commit, record. Wiring only; the work is in tasks."""

from __future__ import annotations

import time

from prefect import flow, unmapped
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from ckptvault import alerts
from ckptvault.catalog import Catalog
from ckptvault.ingest import DONE_STATES, Outcome, invalid_event, verified_event
from ckptvault.outcomes import IngestIncomplete
from ckptvault.progress import ProgressBar
from flows.hooks import HOOKS
from tasks.ingest import (
    commit_manifest_task,
    ensure_bucket_rules_task,
    find_checkpoints_task,
    is_committed_task,
    known_states_task,
    load_config_task,
    open_store_task,
    plan_upload_task,
    publish_outcomes_task,
    record_task,
    upload_one_task,
    validate_structure_task,
)
from tasks.notify import flow_run_url, notify_task
from tasks.retry import RETRIES


@flow(name="ingest", task_runner=ThreadPoolTaskRunner(max_workers=2), log_prints=True, **HOOKS)  # type: ignore[arg-type]
def ingest(config_path: str | None = None) -> list[Outcome]:
    """One pass over every configured source. Fails (after recording everything) if any finished
    checkpoint ended neither uploaded nor already present."""
    cfg = load_config_task(config_path)
    store = open_store_task(cfg)
    ensure_bucket_rules_task(store)
    catalog = Catalog(store, cfg.store.prefix)
    prefix = cfg.store.prefix
    run_id = str(flow_run.id or "")
    outcomes: list[Outcome] = []
    for source in cfg.sources:
        known = known_states_task(catalog, source.run)
        result = find_checkpoints_task(source)
        for problem in result.problems:
            print(f"{source.run}: {problem}")
        for found in result.found:
            t0 = time.monotonic()
            base = dict(
                run=found.run, step=found.step, format=found.format, bytes=found.total_bytes, files=len(found.files)
            )
            if not found.ready:
                outcomes.append(Outcome(**base, result="waiting", message=found.reason))  # type: ignore[arg-type]
                continue
            state = known.get(found.step)
            if state is not None and state.state in DONE_STATES:
                outcomes.append(Outcome(**base, result="present"))  # type: ignore[arg-type]
                continue
            try:
                if is_committed_task(store, prefix, found):
                    outcomes.append(Outcome(**base, result="present", message="manifest already in the store"))  # type: ignore[arg-type]
                    continue
                problems = validate_structure_task(found)
                if problems:
                    if state is None or state.state != "invalid":
                        record_task(catalog, [invalid_event(found, problems, run_id)])
                    outcomes.append(Outcome(**base, result="invalid", message="; ".join(problems)))  # type: ignore[arg-type]
                    continue
                jobs = plan_upload_task(store, prefix, found)
                bar = ProgressBar(found.total_bytes, f"{found.run} step {found.step}")
                entries = upload_one_task.map(
                    unmapped(store), jobs, unmapped(found), unmapped(cfg.sha256), unmapped(bar)
                ).result()
                manifest = commit_manifest_task(store, prefix, found, list(entries))
                record_task(catalog, [verified_event(manifest, run_id)])
                sent = sum(1 for j in jobs if j.upload)
                outcomes.append(
                    Outcome(**base, result="uploaded", uploaded_files=sent, seconds=time.monotonic() - t0)  # type: ignore[arg-type]
                )
            except Exception as e:  # one broken checkpoint must not stop the others
                outcomes.append(Outcome(**base, result="failed", message=str(e), seconds=time.monotonic() - t0))  # type: ignore[arg-type]
    publish_outcomes_task(outcomes)
    url = flow_run_url()
    notify_task(
        cfg,
        store,
        [
            alerts.validation_blocked(o.run, o.step, o.message.split("; "), url)
            for o in outcomes
            if o.result == "invalid"
        ]
        + [alerts.ingest_failed(o.run, o.step, o.message, 1 + RETRIES, url) for o in outcomes if o.result == "failed"],
    )
    if not all(o.ok for o in outcomes):
        raise IngestIncomplete(outcomes)
    return outcomes
