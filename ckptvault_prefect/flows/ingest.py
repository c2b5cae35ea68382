"""The ingest flow: discover, validate, gate, upload, commit, record. Wiring only; the work is in tasks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from prefect import flow, unmapped
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from ckptvault import events
from ckptvault.alerts import kinds as alerts
from ckptvault.alerts.kinds import Alert
from ckptvault.catalog import Catalog, CheckpointState, Event, fold
from ckptvault.config import Config, SourceConfig
from ckptvault.ingest.decision import (
    Decision,
    Seen,
    decide,
    gates_wait_for_run,
    present_without_nodes,
    records_rejection,
)
from ckptvault.ingest.discovery import Found
from ckptvault.ingest.gates import ValidationReport
from ckptvault.ingest.nodes import (
    Gathered,
    NodeError,
    Placement,
    checkpoint_rel,
    jobs_by_node,
    listing_timed_out,
    merge,
    require_workers,
)
from ckptvault.ingest.split import is_split, largest_first, part_ranges
from ckptvault.ingest.steps import FileJob, Outcome, SentRange, local_fingerprint, previous_verified
from ckptvault.manifest import FileEntry, Manifest
from ckptvault.outcomes import IngestIncomplete
from ckptvault.progress import ProgressBar
from ckptvault.ranges import split_size
from ckptvault.saves import Supersede, diff_files, restart_point, superseded_by
from ckptvault.store import ObjectStore, SplitUpload
from ckptvault_prefect.flows.hooks import HOOKS
from ckptvault_prefect.flows.scale import pinned, worker_resources
from ckptvault_prefect.tasks.common import (
    compact_catalog_task,
    load_config_task,
    load_manifest_task,
    open_store_task,
    publish_markdown_task,
    record_task,
)
from ckptvault_prefect.tasks.futures import settle
from ckptvault_prefect.tasks.ingest import (
    abort_split_task,
    begin_split_task,
    commit_manifest_task,
    ensure_bucket_rules_task,
    find_checkpoints_task,
    finish_split_task,
    is_committed_task,
    known_states_task,
    list_node_task,
    plan_upload_task,
    publish_outcomes_task,
    quality_gate_task,
    release_gate_child_task,
    send_range_task,
    upload_one_task,
    validate_gathered_task,
    validate_structure_task,
    write_validation_task,
)
from ckptvault_prefect.tasks.notify import flow_run_url, notify_task
from ckptvault_prefect.tasks.retry import RETRIES
from ckptvault_prefect.tasks.step import StepFuture, in_direct_mode


def _gate(
    cfg: Config, store: ObjectStore, found: Found, known: dict[int, CheckpointState], save: int
) -> ValidationReport:
    prev = previous_verified(known, found.step)
    prefix = cfg.store.prefix
    previous = load_manifest_task(store, prefix, found.run, prev.step, prev.save) if prev is not None else None
    report = quality_gate_task(found, known, previous, cfg.validation)
    write_validation_task(store, prefix, found, report, save)
    return report


def _validate(
    cfg: Config, store: ObjectStore, found: Found, known: dict[int, CheckpointState],
    reports: list[ValidationReport], save: int, gathered: Gathered | None, placement: Placement | None,
    before_gates: Callable[[], None],
) -> tuple[list[str], list[str]]:  # fmt: skip
    if gathered is not None and placement is not None:
        problems = validate_gathered_task(gathered, placement)
    else:
        problems = validate_structure_task(found)
    if problems or not cfg.validation.enabled:
        return problems, []
    before_gates()
    report = _gate(cfg, store, found, known, save)
    reports.append(report)
    if report.blocked:
        return report.reasons(), []
    return [], report.reasons() if report.warned else []


def _committed(
    catalog: Catalog, manifest: Manifest, known: dict[int, CheckpointState], flagged: list[Event], run_id: str,
    changes: str, restarts: dict[str, list[Supersede]],
) -> None:  # fmt: skip
    """Record a committed save, and every save it supersedes (the same step's older save, the
    abandoned branch's later steps after a restart); keep `known` current for the rest of the pass."""
    recorded = [*flagged, events.verified(manifest, run_id)]
    replaced = superseded_by(list(known.values()), manifest.step, manifest.save, manifest.created_at, changes)
    recorded += [
        events.superseded(x.state.run, x.state.step, x.state.save, x.reason, manifest.step, manifest.save, run_id)
        for x in replaced
    ]
    record_task(catalog, recorded)
    for x in replaced:
        known[x.state.step] = replace(x.state, superseded=True, superseded_reason=x.reason)
    if replaced:
        restarts.setdefault(manifest.run, []).extend(replaced)
    [state] = fold([e for e in recorded if e.step == manifest.step and e.save == manifest.save])
    known[manifest.step] = state


def _gather(cfg: Config, source: SourceConfig, placement: Placement, found: Found) -> Gathered:
    """A node-local checkpoint from every node's listing, each made by that node's own worker."""
    require_workers(placement, worker_resources(), found.run, found.step)
    rel = checkpoint_rel(source.path, found.path)
    futures = []
    for i in range(placement.nodes):
        with pinned(placement.name(i)):
            futures += list_node_task.map(unmapped(source.path), unmapped(rel), [i], unmapped(placement))
    listings = []
    deadline = time.monotonic() + cfg.scale.node_timeout_seconds  # one bound for all nodes, not one each
    for i, future in enumerate(futures):
        try:
            listings.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            raise listing_timed_out(placement, i, found.run, found.step, cfg.scale.node_timeout_seconds) from None
    gathered = merge(found, placement, listings, source.settle_seconds, time.time())
    for note in gathered.notes:
        print(f"{found.run} step {found.step}: {note}")
    return gathered


@dataclass
class _Split:
    """A file sent by range tasks: its upload, begun in the flow, and the ranges' futures."""

    job: FileJob
    upload: SplitUpload
    ranges: list[StepFuture[SentRange]]


def _upload(
    cfg: Config, store: ObjectStore, found: Found, jobs: list[FileJob], save: int, placement: Placement | None
) -> tuple[list[StepFuture[FileEntry]], list[_Split]]:
    bar = ProgressBar(found.total_bytes, f"{found.run} step {found.step}")
    compression = cfg.compression_for(found.run)
    args = (unmapped(found), unmapped(cfg.sha256), unmapped(bar), unmapped(save), unmapped(compression))
    threshold = split_size(cfg.scale.split_size_mb)
    futures: list[StepFuture[FileEntry]] = []
    splits: list[_Split] = []

    def submit(some: list[FileJob]) -> None:
        whole = []
        for job in largest_first(some):  # the biggest file's ranges first, then files by size
            if not is_split(job, threshold, store.transfer, sha256=cfg.sha256, compression=compression):
                whole.append(job)
                continue
            upload = begin_split_task(store, job, found, save)
            firsts, counts = zip(*part_ranges(upload, threshold), strict=True)
            ranges = send_range_task.map(unmapped(store), unmapped(job), unmapped(upload), list(firsts),
                                         list(counts), unmapped(bar))  # fmt: skip
            splits.append(_Split(job, upload, ranges))
        if whole:
            futures.extend(upload_one_task.map(unmapped(store), whole, *args))

    try:
        if placement is None:
            submit(jobs)
            return futures, splits
        for node, node_jobs in jobs_by_node(placement, jobs).items():
            if node_jobs:
                with pinned(placement.name(node)):  # each file is read by the worker of the node that holds it
                    submit(node_jobs)
        return futures, splits
    except BaseException:
        # a begin or a submission failed: the checkpoint fails, so what it started must not outlive it
        settle([*futures, *(f for s in splits for f in s.ranges)])
        for s in splits:
            abort_split_task(store, s.upload)
        raise


def _complete(store: ObjectStore, splits: list[_Split]) -> list[FileEntry]:
    """Complete each split upload, every range of it sent; if one fails, abort it and the ones after it."""
    entries = []
    for i, s in enumerate(splits):
        try:
            entries.append(finish_split_task(store, s.job, s.upload, [f.result() for f in s.ranges]))
        except Exception:
            # this one too: a completion that failed for good (its retries spent) left its upload open
            for rest in splits[i:]:
                abort_split_task(store, rest.upload)
            raise
    return entries


@dataclass
class _Pending:
    """A checkpoint whose uploads are submitted: what `_finish` needs to settle, commit and record it."""

    base: Outcome
    found: Found
    decision: Decision
    warnings: tuple[str, ...]
    jobs: list[FileJob]
    futures: list[StepFuture[FileEntry]]
    splits: list[_Split]
    placement: Placement | None  # a node-local source's: recorded in the manifest
    t0: float


def _nodes_listed(cfg: Config, found: Found, known: dict[int, CheckpointState]) -> Gathered | Outcome | None:
    """A ready node-local checkpoint from every node's listing (None: not node-local, or not ready).
    Every listing of the pass is made before any upload is submitted: a listing pinned to a node
    would otherwise queue behind that node's uploads and time out."""
    source = next(s for s in cfg.sources if s.run == found.run)
    if source.locality != "node" or not found.ready:
        return None
    try:
        return _gather(cfg, source, Placement.of(source), found)
    except NodeError as e:
        kept = present_without_nodes(known.get(found.step), str(e))
        if kept is None:
            raise
        lone = Outcome(found.run, found.step, found.format, "", found.total_bytes, len(found.files))
        return lone.with_save(kept.save).with_result(kept.action, kept.message)


def _prepare(
    cfg: Config, store: ObjectStore, catalog: Catalog, found: Found, gathered: Gathered | None,
    known: dict[int, CheckpointState], reports: list[ValidationReport], run_id: str,
    restarts: dict[str, list[Supersede]], before_gates: Callable[[str], None],
) -> Outcome | _Pending:  # fmt: skip
    """Decide one checkpoint and do what is decided up to its uploads, which are submitted, not
    awaited: a final Outcome, or the pending upload. `before_gates(run)` settles the run's pending
    checkpoints (decision.gates_wait_for_run says why)."""
    t0 = time.monotonic()
    source = next(s for s in cfg.sources if s.run == found.run)
    placement = Placement.of(source) if source.locality == "node" else None
    if gathered is not None:
        found = gathered.found
    base = Outcome(found.run, found.step, found.format, "", found.total_bytes, len(found.files))
    prefix = cfg.store.prefix
    newest = known.get(found.step)
    seen = Seen(
        ready=found.ready,
        reason=found.reason,
        newest=newest,
        local_fingerprint=local_fingerprint(found) if found.ready else "",
        catalog_fingerprint=(newest.fingerprint or None) if newest is not None else None,
    )
    # Ask, do what is asked, learn, ask again: the decision itself lives in ckptvault.ingest.decision.
    while not (d := decide(seen)).final:
        if d.action == "load_manifest":
            committed = load_manifest_task(store, prefix, found.run, found.step, d.save)
            seen = seen.learn(diff=diff_files(found.files, committed.files))
        elif d.action == "check_commit":
            seen = seen.learn(committed=is_committed_task(store, prefix, found, d.save))
        else:  # validate
            gates = partial(before_gates, found.run)
            problems, warnings = _validate(cfg, store, found, known, reports, d.save, gathered, placement, gates)
            seen = seen.learn(problems=tuple(problems), warnings=tuple(warnings))
    base = base.with_save(d.save)
    if d.action in ("waiting", "present"):
        return base.with_result(d.action, d.message)
    if d.action == "record_committed":
        # committed by a run that died before recording it: the manifest is the truth, record it
        manifest = load_manifest_task(store, prefix, found.run, found.step, d.save)
        _committed(catalog, manifest, known, [], run_id, d.changes, restarts)
        return base.with_result("present", d.message)
    if d.action == "invalid":
        if records_rejection(seen):
            record_task(catalog, [events.rejected(found, seen.problems or (), run_id, save=d.save)])
        return base.with_result("invalid", d.message)
    jobs = plan_upload_task(store, prefix, found, d.save, placement is None)
    futures, splits = _upload(cfg, store, found, jobs, d.save, placement)
    return _Pending(base, found, d, seen.warnings, jobs, futures, splits, placement, t0)


def _finish(
    cfg: Config, store: ObjectStore, catalog: Catalog, p: _Pending, known: dict[int, CheckpointState],
    run_id: str, restarts: dict[str, list[Supersede]],
) -> Outcome:  # fmt: skip
    """Wait for a pending checkpoint's uploads; commit its manifest once, after every file is verified."""
    found, d, base = p.found, p.decision, p.base
    errors = settle([*p.futures, *(f for s in p.splits for f in s.ranges)])
    if errors:
        for s in p.splits:
            abort_split_task(store, s.upload)
        return base.with_result("failed", "; ".join(errors), time.monotonic() - p.t0)
    entries = [f.result() for f in p.futures] + _complete(store, p.splits)
    placement = p.placement.record() if p.placement is not None else None
    manifest = commit_manifest_task(store, cfg.store.prefix, found, entries, d.save, placement)
    warnings = list(p.warnings)
    flagged = [events.rejected(found, warnings, run_id, kind="warned", save=d.save)] if warnings else []
    _committed(catalog, manifest, known, flagged, run_id, d.changes, restarts)
    sent = sum(1 for j in p.jobs if j.upload)
    message = "; ".join(warnings)
    if d.supersedes is not None:
        message = "; ".join(
            m for m in (f"new save {d.save} of step {found.step} ({d.changes}); save {d.supersedes} kept, superseded",
                        message) if m
        )  # fmt: skip
    outcome = base.with_result("warned" if warnings else "uploaded", message, time.monotonic() - p.t0)
    return outcome.with_uploaded(sent)


def _failed(found: Found, e: Exception) -> Outcome:
    return Outcome(found.run, found.step, found.format, "failed", found.total_bytes, len(found.files), message=str(e))


def _restart_alerts(
    restarts: dict[str, list[Supersede]], known_before: dict[str, dict[int, CheckpointState]], url: str | None
) -> list[Alert]:
    out = []
    for run, replaced in sorted(restarts.items()):
        first = min(x.state.step for x in replaced)
        point = restart_point(list(known_before.get(run, {}).values()), first)
        resaved = [f"step {x.state.step} save {x.state.save}: {x.reason}" for x in replaced]
        out.append(alerts.run_restarted(run, point, resaved, url))
    return out


@flow(name="ingest", task_runner=ThreadPoolTaskRunner(max_workers=2), log_prints=True, **HOOKS)  # type: ignore[arg-type]
def ingest(config_path: str | None = None) -> list[Outcome]:
    """One pass over every configured source. Fails (after recording everything) if any finished
    checkpoint ended neither uploaded nor already present."""
    cfg = load_config_task(config_path)
    store = open_store_task(cfg)
    ensure_bucket_rules_task(store)
    catalog = Catalog(store, cfg.store.prefix)
    run_id = str(flow_run.id or "")
    reports: list[ValidationReport] = []
    restarts: dict[str, list[Supersede]] = {}
    known_before: dict[str, dict[int, CheckpointState]] = {}
    known_by_run: dict[str, dict[int, CheckpointState]] = {}
    founds: list[Found] = []
    for source in cfg.sources:
        known_by_run[source.run] = known_states_task(catalog, source.run)
        known_before[source.run] = dict(known_by_run[source.run])
        result = find_checkpoints_task(source)
        for problem in result.problems:
            print(f"{source.run}: {problem}")
        founds += result.found
    # Every checkpoint's uploads are submitted before any is awaited, so a backlog overlaps on the
    # workers (the task runner's concurrency bounds what runs, and so the memory; the rest queues).
    # Each step below is per checkpoint: one broken checkpoint must not stop the others.
    slots: list[Outcome | _Pending] = []
    listed: list[Gathered | Outcome | None] = []
    for found in founds:
        try:
            listed.append(_nodes_listed(cfg, found, known_by_run[found.run]))
        except Exception as e:
            listed.append(_failed(found, e))

    def finish(i: int) -> None:
        p = slots[i]
        if isinstance(p, _Pending):
            try:
                slots[i] = _finish(cfg, store, catalog, p, known_by_run[p.found.run], run_id, restarts)
            except Exception as e:
                slots[i] = _failed(founds[i], e)

    def before_gates(run: str) -> None:
        for i in gates_wait_for_run([p.found.run if isinstance(p, _Pending) else None for p in slots], run):
            finish(i)

    for found, got in zip(founds, listed, strict=True):
        if isinstance(got, Outcome):
            slots.append(got)
            continue
        try:
            slots.append(_prepare(cfg, store, catalog, found, got, known_by_run[found.run], reports, run_id,
                                  restarts, before_gates))  # fmt: skip
        except Exception as e:
            slots.append(_failed(found, e))
        if in_direct_mode():
            finish(len(slots) - 1)  # its uploads ran inline: commit now rather than after the next ones'
    for i in range(len(slots)):
        finish(i)
    outcomes = [o for o in slots if isinstance(o, Outcome)]
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
        + [alerts.ingest_failed(o.run, o.step, o.message, 1 + RETRIES, url) for o in outcomes if o.result == "failed"]
        + _restart_alerts(restarts, known_before, url),
    )
    # after the alerts, which must not wait on it: this pass's events into its runs' snapshots, so the
    # next read of a run is one snapshot and a few files; time boxed
    compact_catalog_task(catalog, time.time(), [s.run for s in cfg.sources])
    if not all(o.ok for o in outcomes):
        raise IngestIncomplete(outcomes)
    return outcomes
