"""The second half of a restore, once the save, the copies to read it from and the estimate are known:
thaw what is frozen, fetch and verify every byte into the destination, then record the restore in
the catalog and send its alert.

One function for both ways a restore runs (docs/performance.md, "Where a command's time goes"): the
command line without a Prefect API calls it straight after its own preflight and plan, with plain
threads (`Threads`, no Prefect imported, nothing read twice); the restore flow calls it after the
flow's own preflight and plan, on the same plain threads, or with each call as its Prefect task when a
Dask cluster runs the flow's tasks (ckptvault_prefect/runtime/restore.py). The catalog event and the
alert are written only after the bytes are durable (every file fsynced, the staging directory renamed
into place), as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ckptvault.alerts import kinds as alerts
from ckptvault.alerts.alert import Alert
from ckptvault.alerts.sending import send_alerts
from ckptvault.catalog import Catalog, Event, events
from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault.command import early_result
from ckptvault.config import Config
from ckptvault.errors import AlreadyAlerted
from ckptvault.observe.ledger import counter_key, note_ledger
from ckptvault.pricing import load_prices
from ckptvault.restore.copies import CopyStatus
from ckptvault.restore.copies import report as copies_report
from ckptvault.restore.estimate import Estimate, estimate
from ckptvault.restore.fallback import restore_from_copies
from ckptvault.restore.node_local import restore_on_nodes
from ckptvault.restore.plan import ObjectPlan, request_thaw, wait_for_thaw
from ckptvault.restore.resolve import Resolution, RestoreError
from ckptvault.restore.result import RestoreResult
from ckptvault.restore.selection import NODE_LOCAL_REFUSED, Selected
from ckptvault.restore.tensors import ranges_of
from ckptvault.store import ObjectStore, StoreError
from ckptvault.transfer.progress import ProgressBar
from ckptvault.transfer.ranges import split_size
from ckptvault.transfer.submitter import Submitter, Threads

log = logging.getLogger("ckptvault.restore")

SecretLoader = Callable[[str], str | None]
Warn = Callable[[str], None]

# A restore's compaction is its own run's partition: the time box (checked between partitions and between
# the runs a flat-layout catalog's migration moves) keeps an old catalog's migration, up to a minute in
# an ingest, from holding a cold restore's exit; what it does not reach waits for the next compaction.
RESTORE_COMPACT_SECONDS = 2.0


def record(catalog: Catalog, evs: Sequence[Event]) -> str | None:
    """Append `evs` to the catalog (a step of its own)."""
    return catalog.append(evs)


def alert(cfg: Config, store: ObjectStore, sent: Sequence[Alert], secret: SecretLoader | None) -> int:
    """Send `sent` through the configured channels, deduplicated (ckptvault/alerts/sending.py)."""
    return send_alerts(cfg, store, sent, secret)


def compact_run(catalog: Catalog, run: str, deletes: bool) -> int:
    """Fold the run's catalog partition with this restore's event in it (ckptvault/catalog/compaction.py),
    as every ingest does for the saves it records: each restore adds an event file, and a run restored or
    drilled ten times without an ingest between read 0.14 -> 0.27 s at its next restore's start (Ceph;
    compacted, 0.02 s). Returns the event files merged."""
    return catalog.compact(time.time(), runs=[run], max_seconds=RESTORE_COMPACT_SECONDS, deletes=deletes)


@dataclass(frozen=True)
class Chosen:
    """What the first half decided: the save, where it goes, the copies in the order they are read
    (`copies.choose`), every copy as surveyed, and the estimate."""

    run: str
    resolution: Resolution
    target: Path
    ordered: Sequence[CopyStatus]
    statuses: Sequence[CopyStatus]
    estimate: Estimate
    selected: Selected | None = None  # a partial restore's files (--only/--exclude); None: the whole save
    # a tensor-level part from the archive: the frozen .metadata objects to thaw and read before its
    # ranges (and so the .distcp files to thaw) are known; `selected`'s ranges are then not resolved yet
    awaiting: tuple[ObjectPlan, ...] = ()

    def copies_report(self, forced: str | None) -> list[str]:
        """The estimate's lines about copies (`forced`: `--from`)."""
        return copies_report(self.ordered, self.statuses, forced)

    def begun(self) -> RestoreResult:
        """The result before any byte moved: "thawing" until every byte is restored and verified."""
        r, first = self.resolution, self.ordered[0]
        return RestoreResult(self.run, r.step, r.save, tuple(r.notes), str(self.target), self.estimate.describe(),
                             self.estimate.as_record(), status="thawing", source=first.name,
                             copies=tuple(s.as_dict() for s in self.statuses),
                             selection=None if self.selected is None else self.selected.as_dict())  # fmt: skip


def _resolved(cfg: Config, chosen: Chosen, tier: str) -> Chosen:
    """`chosen` once its .metadata objects are thawed: the ranges of its tensor-level part read from them,
    and the part's estimate (what is thawed and read) made again; the whole's stays."""
    from ckptvault.restore import tensors

    first = chosen.ordered[0]
    assert chosen.selected is not None and first.store is not None and first.manifest is not None
    # the .metadata objects are thawed now; one a pattern left out of the part is still read for the ranges
    thawed = {p.path: replace(p, thawed=True) for p in chosen.awaiting}
    plans = tuple(thawed.pop(p.path, p) for p in first.plans)
    selected = tensors.resolve(chosen.selected, first.store, (*plans, *thawed.values()),
                               tensors.copies_blocks(chosen.ordered))  # fmt: skip
    was = chosen.estimate
    est = estimate(first.manifest, list(plans), load_prices(cfg.policy.prices), tier, was.egress,
                   was.throughput_mib_s, selected.reads)  # fmt: skip
    ordered = (replace(first, plans=plans), *chosen.ordered[1:])
    return replace(chosen, ordered=ordered, selected=selected, estimate=replace(est, whole=was.whole), awaiting=())


def complete(
    submit: Submitter, cfg: Config, catalog: Catalog | None, chosen: Chosen, *, tier: str, wait_s: float,
    force: bool, secret: SecretLoader | None, started: float, node_local: str | None = None, run_id: str = "",
    url: str | None = None, catalog_whole: bool = True,
) -> RestoreResult:  # fmt: skip
    """Thaw, fetch, verify, rename into place, then record and alert. `catalog`: the primary's, None
    when the primary is unreachable (nothing is then recorded nor alerted: both live on the primary).
    `node_local`: the destination as given, each node writing its own files there (one copy, no
    fallback). `started`: a `time.monotonic()` the alert's duration counts from. A "thawing" result
    when objects are still frozen after `wait_s`; RestoreError (nothing changed at the destination)
    when some file could be read from no copy. `catalog_whole`: the run's catalog read in full; when it
    did not (the restore chose from the run's manifests), its partition is not compacted after: the
    compaction would set the unreadable objects aside and leave a partition that looks whole without the
    saves they held, where a person (`catalog rebuild`) should find them as the alert said."""
    if node_local is not None and chosen.selected is not None:  # before any thaw is paid for
        raise RestoreError(NODE_LOCAL_REFUSED)
    run, n, save = chosen.run, chosen.resolution.step, chosen.resolution.save
    first, est, begun = chosen.ordered[0], chosen.estimate, chosen.begun()
    store, manifest, plans = first.store, first.manifest, list(first.plans)
    assert store is not None and manifest is not None  # a usable copy has both (copies.survey)
    # one deadline for every thaw: a part from the archive thaws its .metadata, then its .distcp files
    deadline = time.monotonic() + wait_s
    if chosen.awaiting:
        requested = submit(request_thaw, store, list(chosen.awaiting), tier)
        if catalog is not None:
            submit(record, catalog, [events.restore_requested(run, n, tier, requested, run_id, save=save)])
        frozen = submit(wait_for_thaw, store, list(chosen.awaiting), wait_s)
        if frozen:
            assert chosen.selected is not None
            msg = (f"{len(frozen)} of {len(chosen.awaiting)} .metadata objects still frozen ({tier} tier): "
                   f"{chosen.selected.selection.describe()} reads them first to learn which .distcp files and "
                   "ranges it needs, then thaws only those; rerun this restore to continue")  # fmt: skip
            return replace(begun, frozen=len(frozen), message=msg)
        chosen = _resolved(cfg, chosen, tier)
        est, begun, plans = chosen.estimate, chosen.begun(), list(chosen.ordered[0].plans)
    if est.frozen:
        # a .distcp holding none of the chosen items is created empty, never read: it is not thawed either
        # (the estimate's rule: nothing read of it)
        reads = chosen.selected.reads if chosen.selected is not None else {}
        read = [p for p in plans if reads.get(p.path) != 0]
        requested = submit(request_thaw, store, read, tier)
        if catalog is not None:
            submit(record, catalog, [events.restore_requested(run, n, tier, requested, run_id, save=save)])
        frozen = submit(wait_for_thaw, store, read, max(0.0, deadline - time.monotonic()))
        if frozen:
            msg = f"{len(frozen)} of {est.objects} objects still frozen ({tier} tier); rerun this restore to continue"
            return replace(begun, frozen=len(frozen), message=msg)
    bar = ProgressBar(manifest.total_bytes, f"restore {run} step {n}")
    t_download = time.monotonic()
    fallbacks: tuple[dict[str, str], ...] = ()
    # The catalog's write after the bytes first asks the primary what it can do (a probe of ~10 small
    # requests, 0.03 s on Ceph RGW, once per process): asked beside the transfer, it is off the path to
    # the result.
    with _asked_beside(catalog.store.capabilities if catalog is not None else None):
        if node_local is not None:  # one copy: the node-local protocol does not fall back yet (docs/replicas.md)
            pointer, aside = restore_on_nodes(submit, cfg, store, manifest, plans, node_local, force, bar)
            where = node_local
        else:
            threshold = split_size(cfg.scale.split_size_mb)
            marker = None if chosen.selected is None else chosen.selected.marker(manifest)
            done = restore_from_copies(submit, chosen.ordered, chosen.target, manifest, bar, threshold, force, marker,
                                       ranges_of(chosen.selected))  # fmt: skip
            pointer, aside = done.pointer, done.replaced
            fallbacks = tuple(f.as_dict() for f in done.fallbacks)
            where = str(chosen.target)
    download_s = time.monotonic() - t_download
    # the bytes are durable and in place: what follows only tells the catalog and the operator, and a
    # store that cannot be told now makes it a restore said to be unrecorded, never a failed one (the
    # operator would read "nothing changed" of a destination that did change)
    unrecorded = ""
    recorded = False
    # the catalog keeps the save's own size: a partial restore's event says the part in its detail
    whole, part = manifest, None
    if chosen.selected is not None:
        whole = replace(manifest, files=chosen.selected.files + chosen.selected.left_out)
        part = {k: v for k, v in chosen.selected.as_dict().items() if k in ("only", "exclude", "files", "bytes")}
    if catalog is not None:
        try:
            with phase(timing.WRITES):
                submit(record, catalog, [events.restored(whole, where, run_id, download_s,
                                                         store=None if first.order == 0 else first.name,
                                                         fallbacks=len(fallbacks), partial=part)])  # fmt: skip
            recorded = True
        except StoreError as e:
            unrecorded = f"restored, but not recorded in the catalog nor alerted: {e}"
            log.warning("%s step %s: %s", run, n, unrecorded)
    done_result = replace(begun, status="restored", pointer=pointer, replaced=aside, bytes=manifest.total_bytes,
                          files=len(manifest.files), fallbacks=fallbacks, message=unrecorded)  # fmt: skip
    # Durable and in place, and recorded (or the result says why not): what the user is told cannot change
    # any more (ckptvault/command/early_result.py). What follows only tells others of it, so nothing that fails in
    # it fails the restore: a warm command line's user has already gone on with this result.
    early_result.announce(done_result)
    if catalog is not None and recorded:
        try:
            with phase(timing.ALERTS):
                took = time.monotonic() - started
                finished = alerts.build("restore_completed", run=run, step=n, destination=where, seconds=took,
                                        flow_run_url=url)  # fmt: skip
                submit(alert, cfg, catalog.store, [finished], secret)
        except Exception as e:
            log.warning("%s step %s: restored and recorded, but the alert could not be sent: %s", run, n, e)
    if catalog is not None:  # the metrics' ledger is the primary's, beside its catalog (docs/FORMAT.md)
        with phase(timing.WRITES):
            submit(note_ledger, catalog.store, cfg.store.prefix, done_result.ledger_counts(download_s), "restore",
                   delete=cfg.store.flows_delete)  # fmt: skip
    if catalog is not None and recorded and catalog_whole:
        try:
            with phase(timing.COMPACTION):
                submit(compact_run, catalog, run, cfg.store.flows_delete)
        except Exception as e:  # the next ingest's or restore's compaction does it
            log.warning("%s step %s: restored and recorded; the run's catalog was not compacted: %s", run, n, e)
    return done_result


def complete_here(
    cfg: Config, catalog: Catalog | None, chosen: Chosen, *, tier: str, wait_s: float, force: bool,
    secret: SecretLoader | None, unreadable: Mapping[str, str], warn: Warn,
) -> RestoreResult | Exception:  # fmt: skip
    """`complete` in this process on plain threads, for a restore that runs no flow (the command line
    without a Prefect API): what the flow around `complete` would also do is done here, the alert of a
    catalog read from the run's manifests (`unreadable`: its objects that could not be read) and, when
    the restore fails, what the flow's failure hook sends (`alert_failed`). The result, or the exception
    it ended with, returned: the caller prints either. `warn`: where a failure alert that could not be
    sent is said (the console's stderr)."""
    started = time.monotonic()
    try:
        # as many threads as the flow's task runner; none left running once the restore has returned
        with Threads(workers=4) as submit:
            if catalog is not None and unreadable:
                with phase(timing.ALERTS):
                    said = alerts.build("catalog_unreadable", run=chosen.run, objects=unreadable)
                    submit(alert, cfg, catalog.store, [said], secret)
            return complete(submit, cfg, catalog, chosen, tier=tier, wait_s=wait_s, force=force, secret=secret,
                            started=started, catalog_whole=not unreadable)  # fmt: skip
    except Exception as e:  # as a Failed flow state would: one flow_failed alert, unless already alerted
        with phase(timing.ALERTS):
            alert_failed(cfg, catalog, chosen, e, secret, warn)
        return e


def alert_failed(
    cfg: Config, catalog: Catalog | None, chosen: Chosen, e: Exception, secret: SecretLoader | None, warn: Warn
) -> None:
    """What the restore flow's failure hook sends (ckptvault_prefect/runtime/hooks.py), for a restore
    that ran without a flow. Never raises."""
    # looked up when called, not bound at import as `alert`'s is: a test stands in for the sending
    from ckptvault.alerts.sending import send_alerts

    if catalog is None:
        return
    # `ckptvault_restore_failures_total{error_class}` (docs/metrics.md), as the flow's failure hook counts it
    counts = {counter_key("restore_failures", type(e).__name__): 1.0}
    note_ledger(catalog.store, cfg.store.prefix, counts, delete=cfg.store.flows_delete)  # never raises
    if isinstance(e, AlreadyAlerted):
        return
    try:
        failed = alerts.build("flow_failed", flow="restore", state="Failed", message=str(e), run=chosen.run,
                              step=chosen.resolution.step)  # fmt: skip
        send_alerts(cfg, catalog.store, [failed], secret)
    except Exception as unsent:  # say so on the console at least
        warn(f"ckptvault: restore failed; the failure alert could not be sent ({unsent})")


# How long a restore whose transfer failed waits for the question asked beside it: a probe cut off by the
# process's exit would leave its objects in the bucket; one slower than this (a dead endpoint) is not
# waited for. After a transfer that succeeded the catalog's write waits for it anyway (the store's own
# lock), and asks again if it failed: on a primary slower to probe than the transfer took, the result
# comes that much later than it would have, never sooner than the probe.
BESIDE_JOIN_SECONDS = 5.0


@contextmanager
def _asked_beside(ask: Callable[[], object] | None) -> Iterator[None]:
    """`ask()` on a thread of its own while the body runs, for the answer it caches where it keeps it (a
    store's capabilities); its error is dropped: the step that needs the answer asks again and meets
    the error there, where it is reported as that step's."""
    if ask is None:
        yield
        return

    def quietly() -> None:
        try:
            ask()
        except Exception as e:  # asked again, and reported, by the step that needs it
            log.debug("asked beside the transfer: %s", e)

    thread = threading.Thread(target=quietly, name="ckptvault-asked-beside", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(BESIDE_JOIN_SECONDS)
