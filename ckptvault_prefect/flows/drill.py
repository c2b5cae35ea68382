"""The drill flow: restore a rotating sample into scratch, prove it intact and loadable. Wiring only.

Which checkpoints, and the coverage guarantee, are in ckptvault/restore/drill.py (`select`). Archived objects
are thawed with the Bulk tier by default (cheapest). A drill does not wait for a thaw measured in
hours: it requests it, reports the checkpoint as pending, and the next drill selects it again (nothing
was recorded, so it keeps its place at the front of the queue) and completes it.

`as_of` (`ckptvault drill --as-of TIME`, docs/object-lock.md "After an attack"): the same drill of the
store as it was at that moment, through its read-only point-in-time view: the sample chosen from the
catalog as it was then, every object read as it was then, from the primary. It writes nothing to the
bucket: no drill event in the catalog, no alert, no ledger count, no Prefect event (the catalog it
read is the old one, and the saves it found good may not be today's).
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, unmapped
from prefect.runtime import flow_run

from ckptvault.alerts import kinds as alerts
from ckptvault.catalog import Catalog, Event
from ckptvault.restore.copies import PRIMARY, Copy
from ckptvault.restore.drill import (
    DrillFailed,
    DrillReport,
    DrillResult,
    Key,
    drill_copy,
    holders,
    label,
    render_markdown,
)
from ckptvault.restore.steps import checkpoint_name
from ckptvault.restore.verify import settings_for as verify_settings_for
from ckptvault.transfer.progress import ProgressBar
from ckptvault_prefect.runtime import events as prefect_events
from ckptvault_prefect.runtime.hooks import HOOKS
from ckptvault_prefect.tasks.common import (
    current_states_task,
    ledger_task,
    load_config_task,
    load_manifest_task,
    open_store_task,
    publish_markdown_task,
    record_task,
    run_events_task,
)
from ckptvault_prefect.tasks.drill import (
    coverage_task,
    loaded_with_task,
    lock_drift_task,
    one_save_task,
    other_python_task,
    select_task,
    tamper_task,
    verify_task,
)
from ckptvault_prefect.tasks.futures import settle
from ckptvault_prefect.tasks.notify import flow_run_url, notify_task
from ckptvault_prefect.tasks.restore import (
    discard_task,
    download_one_task,
    load_report_task,
    open_copies_task,
    plan_objects_task,
    request_thaw_task,
    staging_dir_task,
    wait_for_thaw_task,
)

# The drill deployment's schedule (ckptvault_prefect/deployments/prefect.yaml: Sundays) in days; `[drill] cover_days`
# counts drills at this spacing. The deployment passes it explicitly, a test keeps the two equal.
INTERVAL_DAYS = 7.0


@flow(name="drill", log_prints=True, **HOOKS)
def drill(
    sample: int | None = None,
    tier: str | None = None,
    thaw_wait_minutes: float = 5.0,
    config_path: str | None = None,
    interval_days: float = INTERVAL_DAYS,
    as_of: float | None = None,
    verify_only: tuple[str, int] | None = None,
    python: str | None = None,
) -> DrillReport:
    """Returns the drill report (docs/drills.md); raises DrillFailed, carrying it, if any failed. `as_of`:
    a unix time, the drill of the store's view at it, recorded nowhere (the caller checked that the
    bucket keeps versions: ckptvault_cli/preflight.past_view). `verify_only`: (run, step), that save alone
    (`drill --verify-only`), recorded as a drill of it, without the digest or the flow's success. `python`:
    another interpreter (`drill --python PATH`) that runs the load checks and the resume check of each
    restored save as well; what fails only there is format rot, never a verdict on the save."""
    cfg = load_config_task(config_path)
    store = open_store_task(cfg)
    past = as_of is not None
    if as_of is not None:  # every read names the version current then; a write would raise StoreError
        store = store.as_of(as_of)
    catalog = Catalog(store, cfg.store.prefix)
    prefix = cfg.store.prefix
    here = loaded_with_task()
    tier = tier or cfg.drill.restore_tier
    n = sample or cfg.drill.sample
    cover_days = cfg.drill.cover_days
    states = current_states_task(catalog)
    chosen = (select_task(states, n, cover_days, interval_days) if verify_only is None
              else one_save_task(states, *verify_only)).chosen  # fmt: skip
    # With replicas, each save is drilled from its least recently drilled copy (restore/drill.py drill_copy)
    # (of the past: the primary's view only, as `restore --as-of` reads one copy)
    copies: dict[str, Copy] = {c.name: c for c in open_copies_task(cfg)} if cfg.replicas and not past else {}
    runs = sorted({s.run for s in chosen}) if copies else []
    history: dict[str, list[Event]] = {run: run_events_task(catalog, run) for run in runs}
    replicas = [r.name for r in cfg.replicas]
    results: list[DrillResult] = []
    pending: list[Key] = []
    for s in chosen:
        t0 = time.monotonic()
        source, src, src_prefix = PRIMARY, store, prefix
        if copies:
            held = holders(s, replicas)
            down = [h for h in held if copies[h].store is None]
            for h in down:
                print(f"{label(*s.key)}: copy {h} unreachable, not drilled this time: {copies[h].problem}")
            source = drill_copy(s.key, [h for h in held if h not in down] or [PRIMARY], history[s.run])
            picked = copies[source]
            if source != PRIMARY and picked.store is not None:
                src, src_prefix = picked.store, picked.prefix
        tampered: tuple[str, ...] = ()
        try:
            # the versions first: a save someone deleted or overwrote is named as tampered, not only as damaged
            tampered = () if past else tamper_task(src, src_prefix, s.run, s.step, s.save)
            manifest = load_manifest_task(src, src_prefix, s.run, s.step, s.save)
            plans = plan_objects_task(src, src_prefix, manifest)
            if any(not p.thawed for p in plans):
                request_thaw_task(src, plans, tier)
                if wait_for_thaw_task(src, plans, thaw_wait_minutes * 60):
                    pending.append(s.key)
                    continue
            scratch = Path(cfg.drill.scratch) / f"{s.run}-{s.step}-{s.save}"
            staged = staging_dir_task(scratch)
            checks: list[str] = []
            not_run: list[str] = []
            verified = None
            other = None
            try:
                bar = ProgressBar(manifest.total_bytes, f"drill {label(s.run, s.step, s.save)}")
                problems = settle(
                    download_one_task.map(unmapped(src), plans, unmapped(staged), unmapped(manifest), unmapped(bar))
                )
                restored = staged / checkpoint_name(manifest)
                restored_intact = not problems
                if not problems:
                    loaded = load_report_task(restored)
                    problems, checks, not_run = loaded.problems, loaded.descriptions(), loaded.not_run
                # the resume check once everything else passed (docs/drills.md, "Resume check")
                if not problems and not tampered and (settings := verify_settings_for(cfg, s.run)) is not None:
                    verified = verify_task(settings, restored, run_name=s.run, step=s.step, save=s.save,
                                           fmt=manifest.format, metrics=manifest.metrics)  # fmt: skip
                    problems = [p] if (p := verified.problem) else []
                # the other interpreter's turn on every save that restored intact, whatever the checks here said
                if python is not None and restored_intact:
                    other = other_python_task(python, restored, verify_settings_for(cfg, s.run), run_name=s.run,
                                              step=s.step, save=s.save, fmt=manifest.format, metrics=manifest.metrics,
                                              timeout=cfg.drill.verify_timeout_seconds)  # fmt: skip
            finally:
                discard_task(staged)
            problems = [*tampered, *problems]
            results.append(
                DrillResult(s.run, s.step, s.save, not problems, time.monotonic() - t0, manifest.total_bytes,
                            tuple(problems), tuple(checks), tuple(not_run), source, verified, s.suspect, here, other)
            )  # fmt: skip
        except Exception as e:  # a checkpoint that fails to restore is exactly what a drill must report
            results.append(
                DrillResult(s.run, s.step, s.save, False, time.monotonic() - t0, s.bytes, (*tampered, str(e)),
                            store=source, was_suspect=s.suspect)
            )  # fmt: skip
    # the lock ckptvault recorded, still on every object of each drilled save (a HEAD per object)
    drift = [(s.key, tuple(got)) for s in chosen if s.key not in pending if (got := lock_drift_task(store, prefix, s))]
    for (run, step, save), why in drift:
        print(f"lock drift: {label(run, step, save)}: {'; '.join(why)}")
    if as_of is not None:  # recorded nowhere: the coverage is the old catalog's, as it was read
        report = DrillReport(tuple(results), tuple(pending), coverage_task(current_states_task(catalog), as_of, n,
                             cover_days, interval_days), tuple(drift))  # fmt: skip
        if report.failed:
            raise DrillFailed(report)
        return report
    run_id = str(flow_run.id or "")
    record_task(catalog, [r.event(run_id) for r in results])
    prefect_events.drilled(results)  # after the record: the suspect state an automation may look up is there
    # Coverage after this drill's events: what the next drill starts from.
    cov = coverage_task(current_states_task(catalog), time.time(), n, cover_days, interval_days)
    pending_names = [label(*p) for p in pending]
    publish_markdown_task(
        "drill-report", render_markdown(results, pending_names, cov), "restore drill: time and load check"
    )
    report = DrillReport(tuple(results), tuple(pending), cov, tuple(drift))
    failed = report.failed
    url = flow_run_url()
    sent = [alerts.build(kind, flow_run_url=url, **facts) for kind, facts in (r.alert() for r in failed)]
    if verify_only is None:  # one save tried out: its own alert says it all
        sent.append(alerts.build("drill_digest", passed=[(r.run, r.step) for r in results if r.passed],
                                 failed=[(r.run, r.step) for r in failed], flow_run_url=url))  # fmt: skip
    sent += [
        alerts.build("lock_drift", run=run, step=step, save=save, problems=why, flow_run_url=url)
        for (run, step, save), why in drift
    ]
    notify_task(cfg, store, sent)
    # one save tried out is not the scheduled drill: the flow's last success stays the last full drill's
    succeeded = None if failed or verify_only is not None else "drill"
    ledger_task(store, prefix, report.ledger_counts(), succeeded, delete=cfg.store.flows_delete,
                gauges=report.ledger_gauges() or None)  # fmt: skip
    if failed:
        raise DrillFailed(report)
    return report
