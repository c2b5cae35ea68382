"""The restore flow: bring back run R at step S (or latest) to a directory, ready to resume. Wiring only.

Waiting for a Glacier thaw takes hours. Run from the command line, the flow polls with backoff up to
`wait_hours` (the operator's terminal is what waits). Run as a deployment, it polls for a short while,
then, if objects are still frozen, schedules a follow-up run of itself for later and ends: no worker
is held for hours, and the follow-up run continues where this one stopped (thaw requests are
idempotent, the destination is untouched until every byte is verified).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.client.schemas.objects import State
from prefect.runtime import deployment, flow_run
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner

from ckptvault import humanize
from ckptvault.alerts import kinds as alerts
from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault.errors import CkptvaultError
from ckptvault.restore import steps as lib
from ckptvault.restore.complete import Chosen, complete
from ckptvault.restore.prepare import Request, Ways, prepare
from ckptvault.restore.resolve import Resolution
from ckptvault.restore.result import RestoreResult
from ckptvault.restore.selection import MARKER
from ckptvault_prefect.runtime import events as prefect_events
from ckptvault_prefect.runtime.hooks import HOOKS
from ckptvault_prefect.runtime.restore import restore_submitter
from ckptvault_prefect.tasks.common import (
    load_config_task,
    publish_markdown_task,
)
from ckptvault_prefect.tasks.futures import settle
from ckptvault_prefect.tasks.notify import flow_run_url, load_secret, notify_task
from ckptvault_prefect.tasks.restore import (
    open_copies_task,
    replica_history_task,
    restore_history_task,
    survey_task,
)


@flow(name="restore", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True, **HOOKS)  # type: ignore[arg-type]
def restore(
    run: str,
    dest: str,
    step: str = "latest",
    save: int | None = None,
    tier: Literal["Expedited", "Standard", "Bulk"] = "Standard",
    wait: bool = True,
    force: bool = False,
    wait_hours: float = 48.0,
    reschedule: bool = False,
    config_path: str | None = None,
    node_local: bool = False,
    source: str | None = None,
    only: list[str] | None = None,
    exclude: list[str] | None = None,
    only_keys: list[str] | None = None,
) -> RestoreResult | State:
    """Bring back run R at step S (or the newest good one) into a directory the framework resumes from:
    every file's CRC32C checked, the destination filled only once every byte is in place.

    Args:
        run: The run's name, as in the config's [[sources]] run = ... (`ckptvault ls` lists them).
        dest: An empty or new directory on the worker's machine, absolute: the run root to resume from.
        step: A step number, or `latest`: the newest good save (verified, not superseded, its last drill passed).
        save: Which save of that step, when it was saved more than once (empty: its newest).
        tier: How fast archived (Glacier-class) objects are thawed; the cost rises with the speed.
        wait: Wait for a thaw of archived objects (False: request it and stop).
        force: Restore into a non-empty destination (kept, renamed aside), or a suspect save.
        wait_hours: How long to wait for a thaw before giving up.
        reschedule: Run as a deployment: while objects thaw, end and schedule a follow-up run instead of waiting.
        config_path: The ckptvault config file (empty: $CKPTVAULT_CONFIG in the worker's environment).
        node_local: Put each file back on the node that wrote it (a run whose source has locality = "node").
        source: The copy read first: `primary` or a replica's name (empty: the cheapest complete copy).
        only: Restore only these: model (weights, config, tokenizer), optimizer, or globs on the paths inside
            the checkpoint (empty: every file).
        exclude: Leave out the files these globs match (after only).
        only_keys: Of a torch DCP checkpoint (dcp, megatron torch_dist, nemo), restore only the items whose
            names are or start with these prefixes (e.g. model.layers.0), with every file beside the .distcp ones.

    Run as a deployment (the Prefect UI's "Run", `prefect deployment run restore/restore`), a restore
    that ckptvault refuses (a run not in the catalog, a destination not empty, a step that is not a
    number) ends Failed with the message the command line gives, not a traceback; from the command
    line it raises, as every command does.
    """
    try:
        return _restore(run, dest, step, save, tier, wait, force, wait_hours, reschedule, config_path, node_local,
                        source, tuple(only or ()), tuple(exclude or ()), tuple(only_keys or ()))  # fmt: skip
    except CkptvaultError as e:
        if not deployment.id:
            raise
        print(f"ckptvault: {e}")
        return Failed(message=f"ckptvault: {e}")


def _restore(
    run: str,
    dest: str,
    step: str,
    save: int | None,
    tier: str,
    wait: bool,
    force: bool,
    wait_hours: float,
    reschedule: bool,
    config_path: str | None,
    node_local: bool,
    source: str | None,
    only: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    only_keys: tuple[str, ...] = (),
) -> RestoreResult:
    """The flow's body. `source` (`--from`): the copy read first, `primary` or a replica's name; None: the
    reachable, complete copy cheapest to bring back (docs/replicas.md, "Restore from a copy").

    The first half is the library's (ckptvault/restore/prepare.py, as `ckptvault restore` runs it), with
    this flow's tasks for its reads. The pure decisions before the transfer (the destination's check, the
    step's resolution, the estimate) are plain calls, not task runs: each task run costs ~3-8 ms of
    Prefect's own on the way to the first byte, for a step that cannot be retried into a different answer;
    their outcome is in this flow run's log and, when they refuse, its failure. The estimate's artifact is
    published beside the transfer (docs/performance.md)."""
    t0 = time.monotonic()
    with phase(timing.PREFLIGHT):
        cfg = load_config_task(config_path)
        copies = open_copies_task(cfg)
        if not node_local:  # node-local: each node checks its own, where it stages
            lib.check_destination(Path(dest).expanduser().resolve(), force)

    def alert_unreadable(objects: Mapping[str, str], _: str) -> None:
        primary = copies[0].store  # read from: it is reachable
        assert primary is not None
        unreadable = alerts.build("catalog_unreadable", run=run, objects=objects, flow_run_url=flow_run_url())
        notify_task(cfg, primary, [unreadable])

    def primary_down(problem: str) -> None:
        print(
            f"the primary store is unreachable ({problem}); run {run}'s saves are read from the "
            'replicas\' manifests (docs/runbook.md, "The primary store is down")'
        )

    def print_notes(resolution: Resolution) -> None:
        for note in resolution.notes:
            print(note)

    def print_estimate(plan: Chosen) -> None:
        if plan.selected is not None:
            print(plan.selected.describe())
        for line in plan.copies_report(source):
            print(line.strip())
        print(plan.estimate.describe())

    # the reads as this flow's tasks (retried, in its run's graph); the command line's, when it read them
    ways = Ways(read_history=restore_history_task, replica_history=replica_history_task, survey=survey_task,
                unreadable=alert_unreadable, primary_down=primary_down, resolved=print_notes,
                planned=print_estimate)  # fmt: skip
    prepared = prepare(cfg, copies, Request(run, dest, step, save, tier, force, source, only, exclude, only_keys),
                       ways)  # fmt: skip
    chosen, catalog = prepared.chosen, prepared.catalog
    n, est, manifest = chosen.resolution.step, chosen.estimate, chosen.ordered[0].manifest
    assert manifest is not None  # a usable copy has its manifest (copies.survey)
    with phase(timing.ARTIFACTS):
        estimated = publish_markdown_task.submit(
            "restore-estimate", f"### Restore estimate\n\n{est.describe()}\n", "bytes, classes, time, cost"
        )
    with restore_submitter() as submit:  # plain threads unless on Dask (its docstring)
        report = complete(submit, cfg, catalog, chosen, tier=tier,
                          wait_s=wait_hours * 3600 if wait else 0.0, force=force, secret=load_secret, started=t0,
                          node_local=dest if node_local else None, run_id=str(flow_run.id or ""),
                          url=flow_run_url(), catalog_whole=not prepared.unreadable)  # fmt: skip
    for problem in settle([estimated]):  # the restore's outcome does not hang on its estimate's record
        print(f"the restore estimate's artifact was not published: {problem}")
    if report.status == "thawing":
        msg = report.message
        if reschedule and deployment.name:
            from prefect.deployments import run_deployment

            later = datetime.now(UTC) + timedelta(seconds=max(est.seconds_min, 300))
            run_deployment(
                name=f"{flow_run.flow_name}/{deployment.name}",
                parameters=flow_run.parameters,
                scheduled_time=later,
                timeout=0,
            )
            msg += f"; a follow-up run is scheduled for {later:%Y-%m-%d %H:%M} UTC"
        print(msg)
        return replace(report, message=msg)
    for f in report.fallbacks:
        print(f"fallback: {f['path']}: read from {f['from']} ({f['because']})")
    if catalog is None:
        print("the primary store is unreachable: this restore is not recorded in its catalog, nor alerted")
    where = dest if node_local else report.dest
    prefect_events.restored(report)
    with phase(timing.ARTIFACTS):
        publish_markdown_task(
            "restore-result",
            f"### Restored {run} step {n}\n\n- destination: `{where}`\n- files: {len(manifest.files)}, "
            f"{humanize.size(manifest.total_bytes)}, every CRC32C verified\n"
            + (
                f"- {chosen.selected.describe()}; {MARKER} at the destination lists what was left out\n"
                if chosen.selected is not None
                else ""
            )
            + f"- pointer file: {report.pointer or 'none'}\n",
            "what was restored and where",
        )
    return report
