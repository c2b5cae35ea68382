"""One ingest pass over the checkpoints discovery found: decide each, gate it, send its files, commit
its manifest once every file is verified, record it and every save it supersedes.

Every checkpoint's uploads are submitted before any is awaited, so a backlog overlaps on the workers
(the submitter's concurrency bounds what runs, and so the memory; the rest queues); each checkpoint
is then finished in turn. Two things settle a checkpoint earlier: the gates of a later checkpoint
of the same run (ckptvault.ingest.decision.gates_wait_for_run says why), and a submitter that runs
calls inline, which has finished the uploads by the time they are submitted. Each step is per
checkpoint: one broken checkpoint becomes a failed Outcome and never stops the others.

Every call to the store, the catalog or a node's disk goes through the Submitter
(ckptvault/transfer/submitter.py): Prefect tasks in the ingest flow, plain calls in the unit tests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

from ckptvault.alerts import kinds as alerts
from ckptvault.alerts.kinds import Alert
from ckptvault.catalog import Catalog, CheckpointState, Event, events, fold
from ckptvault.catalog.saves import Supersede, diff_files, restart_point, superseded_by
from ckptvault.checkpoint.manifest import Manifest
from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault.config import Config, SourceConfig
from ckptvault.ingest import uploads
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
from ckptvault.ingest.narrow import commit_time
from ckptvault.ingest.nodes import Gathered, checkpoint_rel, list_node, listing_timed_out, merge, validate_gathered
from ckptvault.ingest.steps import (
    FileJob,
    Outcome,
    commit_manifest,
    is_committed,
    local_fingerprint,
    lock_save,
    plan_upload,
    previous_verified,
    quality_gate,
    validate_structure,
    write_blocks,
    write_validation,
)
from ckptvault.objectlock.save_lock import save_retention
from ckptvault.store import ObjectStore, Retention
from ckptvault.store.manifest_load import load_manifest
from ckptvault.transfer.placement import NodeError, Placement, require_workers
from ckptvault.transfer.submitter import Submitter, first_error_class, settle


@dataclass(frozen=True)
class InFlight:
    """A checkpoint whose uploads are submitted: what finishing it needs to settle, commit and record it."""

    base: Outcome
    found: Found
    decision: Decision
    warnings: tuple[str, ...]
    jobs: list[FileJob]
    sent: uploads.Sent
    placement: Placement | None  # a node-local source's: recorded in the manifest
    t0: float
    store: ObjectStore  # the pass's store, writing with the save's Object Lock retention if [lock] is on
    retention: Retention | None
    upload_started_at: float  # wall time the save's first file was planned for sending: its upload_seconds' start


class IngestPass:
    """One pass: `run` it once over what discovery found. `known` is each run's catalog state as the
    pass began, kept current as it commits; `reports` and `restarts` are what it saw, for the caller's
    artifacts and alerts."""

    def __init__(
        self, cfg: Config, store: ObjectStore, catalog: Catalog, run_id: str,
        known: dict[str, dict[int, CheckpointState]], submit: Submitter,
    ) -> None:  # fmt: skip
        self.cfg, self.store, self.catalog, self.run_id = cfg, store, catalog, run_id
        self.known, self.submit = known, submit
        self.known_before = {run: dict(states) for run, states in known.items()}
        self.reports: list[ValidationReport] = []
        self.restarts: dict[str, list[Supersede]] = {}
        self.recorded: list[Event] = []  # every catalog event this pass recorded, in order (for the caller's notices)
        self._founds: list[Found] = []
        self._slots: list[Outcome | InFlight] = []

    def run(self, founds: Sequence[Found]) -> list[Outcome]:
        """An Outcome per checkpoint, in discovery's order."""
        self._founds = list(founds)
        # Every listing of the pass is made before any upload is submitted: a listing pinned to a node
        # would otherwise queue behind that node's uploads and time out.
        listed: list[Gathered | Outcome | None] = []
        for found in self._founds:
            try:
                listed.append(self._nodes_listed(found))
            except Exception as e:
                listed.append(_failed(found, e))
        for found, got in zip(self._founds, listed, strict=True):
            if isinstance(got, Outcome):
                self._slots.append(got)
                continue
            try:
                self._slots.append(self._prepare(found, got))
            except Exception as e:
                self._slots.append(_failed(found, e))
            if self.submit.inline:  # its uploads ran inline: commit now rather than after the next ones'
                self._finish(len(self._slots) - 1)
        for i in range(len(self._slots)):
            self._finish(i)
        return [o for o in self._slots if isinstance(o, Outcome)]

    def alerts(self, outcomes: Sequence[Outcome], url: str | None, attempts: int) -> list[Alert]:
        """What the pass tells people: blocked and warned checkpoints, failed ones (after `attempts`
        tries each), and each run that restarted from an earlier step."""
        out = [alerts.build("validation_blocked", run=o.run, step=o.step, problems=o.message.split("; "),
                            flow_run_url=url)
               for o in outcomes if o.result == "invalid"]  # fmt: skip
        out += [alerts.build("validation_warned", run=o.run, step=o.step, problems=o.message.split("; "),
                             flow_run_url=url)
                for o in outcomes if o.result == "warned"]  # fmt: skip
        out += [alerts.build("ingest_failed", run=o.run, step=o.step, error=o.message, attempts=attempts,
                             flow_run_url=url)
                for o in outcomes if o.result == "failed"]  # fmt: skip
        for run, replaced in sorted(self.restarts.items()):
            first = min(x.state.step for x in replaced)
            point = restart_point(list(self.known_before.get(run, {}).values()), first)
            resaved = [f"step {x.state.step} save {x.state.save}: {x.reason}" for x in replaced]
            out.append(alerts.build("run_restarted", run=run, step=point, resaved=resaved, flow_run_url=url))
        return out

    def _finish(self, i: int) -> None:
        p = self._slots[i]
        if isinstance(p, InFlight):
            try:
                self._slots[i] = self._commit(p)
            except Exception as e:
                self._slots[i] = _failed(self._founds[i], e)

    def _settle_run(self, run: str) -> None:
        for i in gates_wait_for_run([p.found.run if isinstance(p, InFlight) else None for p in self._slots], run):
            self._finish(i)

    def _source(self, found: Found) -> SourceConfig:
        return next(s for s in self.cfg.sources if s.run == found.run)

    def _nodes_listed(self, found: Found) -> Gathered | Outcome | None:
        """A ready node-local checkpoint from every node's listing (None: not node-local, or not ready)."""
        source = self._source(found)
        if source.locality != "node" or not found.ready:
            return None
        try:
            return self._gather(source, Placement.of(source), found)
        except NodeError as e:
            kept = present_without_nodes(self.known[found.run].get(found.step), str(e))
            if kept is None:
                raise
            lone = Outcome(found.run, found.step, found.format, "", found.total_bytes, len(found.files))
            return lone.with_save(kept.save).with_result(kept.action, kept.message)

    def _gather(self, source: SourceConfig, placement: Placement, found: Found) -> Gathered:
        """A node-local checkpoint from every node's listing, each made by that node's own worker."""
        require_workers(placement, self.submit.node_workers(), found.run, found.step)
        rel = checkpoint_rel(source.path, found.path)
        futures = []
        for i in range(placement.nodes):
            futures += self.submit.map([partial(list_node, source.path, rel, i, placement)], placement.name(i))
        listings = []
        timeout = self.cfg.scale.node_timeout_seconds
        deadline = time.monotonic() + timeout  # one bound for all nodes, not one each
        for i, future in enumerate(futures):
            try:
                listings.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                raise listing_timed_out(placement, i, found.run, found.step, timeout) from None
        gathered = merge(found, placement, listings, source.settle_seconds, time.time())
        for note in gathered.notes:  # print, looked up now: a flow with log_prints logs it
            print(f"{found.run} step {found.step}: {note}")
        return gathered

    def _prepare(self, found: Found, gathered: Gathered | None) -> Outcome | InFlight:
        """Decide one checkpoint and do what is decided up to its uploads, which are submitted, not
        awaited: a final Outcome, or the checkpoint in flight."""
        t0 = time.monotonic()
        source = self._source(found)
        placement = Placement.of(source) if source.locality == "node" else None
        if gathered is not None:
            found = gathered.found
        base = Outcome(found.run, found.step, found.format, "", found.total_bytes, len(found.files))
        store, prefix, known = self.store, self.cfg.store.prefix, self.known[found.run]
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
                with phase(timing.CATALOG_READ):
                    committed = self.submit(load_manifest, store, prefix, found.run, found.step, d.save)
                seen = seen.learn(diff=diff_files(found.files, committed.files))
            elif d.action == "check_commit":
                with phase(timing.CATALOG_READ):
                    seen = seen.learn(committed=self.submit(is_committed, store, prefix, found, d.save))
            else:  # validate
                problems, warnings = self._validate(found, d.save, gathered, placement)
                seen = seen.learn(problems=tuple(problems), warnings=tuple(warnings))
        base = base.with_save(d.save)
        if d.action in ("waiting", "present"):
            return base.with_result(d.action, d.message)
        if d.action == "record_committed":
            # committed by a run that died before recording it: the manifest is the truth, record it
            manifest = self.submit(load_manifest, store, prefix, found.run, found.step, d.save)
            self._committed(manifest, [], d.changes, commit_time(found), split=local_parts(found, manifest))
            return base.with_result("present", d.message)
        if d.action == "invalid":
            if records_rejection(seen):
                self._record([_rejected(found, seen.problems or (), self.run_id, save=d.save)])
            return base.with_result("invalid", d.message)
        upload_started_at = time.time()
        with phase(timing.TRANSFER):
            jobs = self.submit(plan_upload, store, prefix, found, d.save, placement is None)
            # One retain-until date per save, from when its upload starts (ckptvault/objectlock/save_lock.py)
            retention = save_retention(self.cfg.lock, time.time())
            locked = store.with_retention(retention) if retention is not None else store
            sent = uploads.send(self.submit, self.cfg, locked, found, jobs, d.save, placement)
        return InFlight(base, found, d, seen.warnings, jobs, sent, placement, t0, locked, retention, upload_started_at)

    def _validate(
        self, found: Found, save: int, gathered: Gathered | None, placement: Placement | None
    ) -> tuple[list[str], list[str]]:
        """(problems, warnings): the structure's problems, else the gates' reasons when they block."""
        with phase(timing.GATES):
            if gathered is not None and placement is not None:
                problems = self.submit(validate_gathered, gathered, placement)
            else:
                problems = self.submit(validate_structure, found)
        if problems or not self.cfg.validation.enabled:
            return problems, []
        self._settle_run(found.run)
        with phase(timing.GATES):
            report = self._gate(found, save)
        self.reports.append(report)
        if report.blocked:
            return report.reasons(), []
        return [], report.reasons() if report.warned else []

    def _gate(self, found: Found, save: int) -> ValidationReport:
        known, prefix = self.known[found.run], self.cfg.store.prefix
        prev = previous_verified(known, found.step)
        previous = None
        if prev is not None:
            previous = self.submit(load_manifest, self.store, prefix, found.run, prev.step, prev.save)
        report = self.submit(quality_gate, found, known, previous, self.cfg.validation)
        self.submit(write_validation, self.store, prefix, found, report, save)
        return report

    def _commit(self, p: InFlight) -> Outcome:
        """Wait for a checkpoint's uploads; commit its manifest once, after every file is verified."""
        found, d, base = p.found, p.decision, p.base
        with phase(timing.TRANSFER):  # each upload's bytes are checked (CRC32C) as they are sent
            calls = p.sent.calls()
            errors = settle(calls)
            if errors:
                uploads.abort(self.submit, p.store, p.sent.splits)
                failed = base.with_result("failed", "; ".join(errors), time.monotonic() - p.t0)
                return replace(failed, error=first_error_class(calls))
        with phase(timing.VERIFICATION):  # split files: their parts completed, the whole's CRC32C checked
            entries = [f.result() for f in p.sent.files] + uploads.complete(self.submit, p.store, p.sent.splits)
        placement = p.placement.record() if p.placement is not None else None
        with phase(timing.WRITES):
            if p.retention is not None:  # the manifest is written with the lock; the data must hold it too
                self.submit(lock_save, p.store, p.retention, self.cfg.lock.days, p.jobs)
            # the block CRCs' sidecar before the manifest, with the save's lock: the commit marker stays last
            self.submit(write_blocks, p.store, self.cfg.store.prefix, found, entries, d.save)
            manifest = self.submit(commit_manifest, p.store, self.cfg.store.prefix, found, entries, d.save, placement)
        warnings = list(p.warnings)
        flagged = [_rejected(found, warnings, self.run_id, kind="warned", save=d.save)] if warnings else []
        split = local_parts(found, manifest)
        self._committed(manifest, flagged, d.changes, commit_time(found), p.upload_started_at, split)
        sent = sum(1 for j in p.jobs if j.upload)
        message = "; ".join(warnings)
        if d.supersedes is not None:
            resaved = f"new save {d.save} of step {found.step} ({d.changes}); save {d.supersedes} kept, superseded"
            message = "; ".join(m for m in (resaved, message) if m)
        outcome = base.with_result("warned" if warnings else "uploaded", message, time.monotonic() - p.t0)
        return outcome.with_uploaded(sent)

    def _committed(
        self,
        manifest: Manifest,
        flagged: list[Event],
        changes: str,
        committed_at: float,
        upload_started_at: float | None = None,
        split: dict[str, int] | None = None,
    ) -> None:
        """Record a committed save (with the lock its manifest says it was committed with), and every
        save it supersedes (the same step's older save, the abandoned branch's later steps after a
        restart); keep `known` current for the rest of the pass."""
        known = self.known[manifest.run]
        # The manifest's own record, not this pass's retention: a commit lost to a concurrent ingest,
        # or one a killed pass made and this one only records, was locked as that manifest says.
        until = manifest.lock.retain_until if manifest.lock is not None else None
        mine = events.verified(
            manifest,
            self.run_id,
            locked_until=until,
            committed_at=committed_at,
            upload_started_at=upload_started_at,
            split=split,
        )
        recorded = [*flagged, mine]
        replaced = superseded_by(list(known.values()), manifest.step, manifest.save, manifest.created_at, changes)
        recorded += [
            events.superseded(x.state.run, x.state.step, x.state.save, x.reason, manifest.step, manifest.save,
                              self.run_id)
            for x in replaced
        ]  # fmt: skip
        self._record(recorded)
        for x in replaced:
            known[x.state.step] = replace(x.state, superseded=True, superseded_reason=x.reason)
        if replaced:
            self.restarts.setdefault(manifest.run, []).extend(replaced)
        [state] = fold([e for e in recorded if e.step == manifest.step and e.save == manifest.save])
        known[manifest.step] = state

    def _record(self, recorded: list[Event]) -> None:
        with phase(timing.WRITES):
            self.submit(Catalog.append, self.catalog, recorded)
        self.recorded += recorded


def local_parts(found: Found, manifest: Manifest) -> dict[str, int] | None:
    """A torch DCP layout's model and optimizer bytes (dcp, Megatron torch_dist, NeMo 2) where the
    manifest's paths cannot tell them (a `.distcp` holds both): each `.distcp` of the manifest split by
    its items' lengths from the `.metadata` on disk (after the upload only a download could read it).
    None where the paths tell (events.parts), for any other layout, and where the `.metadata` cannot be
    read: the split is information, and never fails an ingest."""
    if events.parts(manifest) is not None or not any(f.path.endswith(".distcp") for f in manifest.files):
        return None
    from ckptvault.formats import dcp_tensors  # here: the layouts' modules load only where a save needs them

    try:
        return dcp_tensors.part_bytes(found.path, manifest.format, [(f.path, f.size) for f in manifest.files])
    except Exception:  # a torn or hostile .metadata: the split is unknown, the save is not
        return None


def _rejected(found: Found, problems: Sequence[str], flow_run: str, kind: str = "invalid", save: int = 1) -> Event:
    return events.rejected(found.run, found.step, found.format, found.total_bytes, len(found.files),
                           found.newest_mtime, problems, flow_run, kind, save)  # fmt: skip


def _failed(found: Found, e: Exception) -> Outcome:
    return Outcome(found.run, found.step, found.format, "failed", found.total_bytes, len(found.files), message=str(e),
                   error=type(e).__name__)  # fmt: skip
