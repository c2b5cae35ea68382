"""The scrub flow: check every object of the rotation's saves on every copy against the manifest, and
repair where `[scrub] repair` (or the `repair` parameter) says so (docs/replicas.md, "Scrub and repair").
Wiring only, the calls of `ckptvault scrub`: config -> the copies, each opened and checked -> the
catalog's saves and events -> the scrub (one task run: the tamper check first) -> the artifact -> one
alert per save and copy with a problem left, and one `tamper` alert per tampered save and copy -> the
ledger (the `ckptvault_tampered_saves` gauge). The run ends Failed when a problem is left or a save was
tampered with, once everything is recorded and alerted, as the command exits 1."""

from __future__ import annotations

from prefect import flow

from ckptvault.catalog import Catalog
from ckptvault.replication.scrub import PRIMARY, Copy
from ckptvault.replication.scrub_pass import ScrubReport
from ckptvault.replication.scrub_report import (
    ScrubIncomplete,
    alerts,
    choose_copies,
    closing_line,
    save_lines,
    tamper_lines,
    tampered_saves,
    to_markdown,
)
from ckptvault_prefect.runtime.hooks import HOOKS
from ckptvault_prefect.tasks.common import (
    current_states_task,
    ledger_task,
    load_config_task,
    open_store_task,
    publish_markdown_task,
)
from ckptvault_prefect.tasks.notify import flow_run_url, notify_task
from ckptvault_prefect.tasks.replicate import open_replica_task
from ckptvault_prefect.tasks.scrub import all_events_task, scrub_task


@flow(name="scrub", log_prints=True, **HOOKS)
def scrub(
    sample: int | None = None,
    repair: bool | None = None,
    replica: str | None = None,
    config_path: str | None = None,
) -> ScrubReport:
    """`sample` saves from the rotation (None: a seventh, so every save within 7 scrubs) plus each one a
    scrub left a problem in, on every copy (`replica`: the primary and that one; "primary": the primary
    alone). `repair` None: the config's `[scrub] repair`. Returns the report; raises ScrubIncomplete,
    carrying it, if a problem is left (each save and copy alerted on)."""
    cfg = load_config_task(config_path)
    choice = choose_copies(cfg.replicas, replica)  # an unknown name fails the run, naming the known ones
    fix = cfg.scrub.repair if repair is None else repair
    primary = open_store_task(cfg)
    # every copy opened and checked before anything is read: each is a repair's source
    copies = [Copy(PRIMARY, primary, cfg.store.prefix)]
    copies += [Copy(r.name, open_replica_task(r, cfg.lock), r.prefix, r.expire_after_days) for r in choice.replicas]
    catalog = Catalog(primary, cfg.store.prefix)
    states = current_states_task(catalog)
    past = all_events_task(catalog)
    report = scrub_task(copies, choice.checked, states, past, sample, fix, cfg.lock, catalog)
    for s in report.saves:
        for _, line in save_lines(s):
            print(line)
    for _, line in tamper_lines(report):
        print(line)
    print(closing_line(report, fix))
    publish_markdown_task("scrub-report", to_markdown(report, fix), "what the scrub checked, repaired and left")
    notify_task(cfg, primary, alerts(report, fix, flow_run_url()))
    n = tampered_saves(report)
    ledger_task(primary, cfg.store.prefix, None, "scrub" if report.ok else None, delete=cfg.store.flows_delete,
                gauges=None if n is None else {"tampered_saves": n})  # fmt: skip
    if not report.ok:
        raise ScrubIncomplete(report, fix)
    return report
