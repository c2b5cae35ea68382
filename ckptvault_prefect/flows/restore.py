"""The restore flow: bring back run R at step S (or latest) to a directory, ready to resume. Wiring only.

Waiting for a Glacier thaw takes hours. Run from the command line, the flow polls with backoff up to
`wait_hours` (the operator's terminal is what waits). Run as a deployment, it polls for a short while,
then, if objects are still frozen, schedules a follow-up run of itself for later and ends: no worker
is held for hours, and the follow-up run continues where this one stopped (thaw requests are
idempotent, the destination is untouched until every byte is verified).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prefect import flow, unmapped
from prefect.runtime import deployment, flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from ckptvault import events, humanize
from ckptvault.alerts import kinds as alerts
from ckptvault.catalog import Catalog
from ckptvault.config import Config
from ckptvault.ingest.nodes import require_workers
from ckptvault.manifest import Manifest
from ckptvault.progress import ProgressBar
from ckptvault.ranges import split_size
from ckptvault.restore import nodes as on_nodes
from ckptvault.restore import ranged
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.restore.result import RestoreResult
from ckptvault.store import ObjectStore
from ckptvault.tiering.cost import load_prices
from ckptvault_prefect.flows.hooks import HOOKS
from ckptvault_prefect.flows.scale import pinned, worker_resources
from ckptvault_prefect.tasks.common import (
    load_config_task,
    load_manifest_task,
    open_store_task,
    publish_markdown_task,
    record_task,
)
from ckptvault_prefect.tasks.futures import settle
from ckptvault_prefect.tasks.notify import flow_run_url, notify_task
from ckptvault_prefect.tasks.restore import (
    allocate_task,
    check_destination_task,
    discard_on_node_task,
    discard_task,
    download_one_task,
    estimate_task,
    fetch_range_task,
    finalize_on_node_task,
    finalize_task,
    others_seen_task,
    plan_objects_task,
    request_thaw_task,
    resolve_task,
    restore_history_task,
    seal_task,
    stage_on_node_task,
    staging_dir_task,
    undo_on_node_task,
    wait_for_thaw_task,
    write_pointer_task,
)
from ckptvault_prefect.tasks.step import StepFuture, wait_all


@flow(name="restore", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True, **HOOKS)  # type: ignore[arg-type]
def restore(
    run: str,
    dest: str,
    step: str = "latest",
    save: int | None = None,
    tier: str = "Standard",
    wait: bool = True,
    force: bool = False,
    wait_hours: float = 48.0,
    reschedule: bool = False,
    config_path: str | None = None,
    node_local: bool = False,
) -> RestoreResult:
    t0 = time.monotonic()
    cfg = load_config_task(config_path)
    store = open_store_task(cfg)
    catalog = Catalog(store, cfg.store.prefix)
    prefix = cfg.store.prefix
    target = Path(dest).expanduser().resolve()
    if not node_local:  # node-local: each node checks its own, where it stages
        check_destination_task(target, force)
    history = restore_history_task(catalog, run)  # the one read of the run's catalog
    if history.unreadable:
        notify_task(cfg, store, [alerts.catalog_unreadable(run, history.unreadable, flow_run_url())])
    chosen = resolve_task(history.states(), run, step, save, force)
    for note in chosen.notes:
        print(note)
    n = chosen.step
    manifest = load_manifest_task(store, prefix, run, n, chosen.save)
    plans = plan_objects_task(store, prefix, manifest)
    prices = load_prices(cfg.policy.prices)
    est = estimate_task(manifest, plans, prices, tier, cfg.store.egress, history.throughput())
    publish_markdown_task(
        "restore-estimate", f"### Restore estimate\n\n{est.describe()}\n", "bytes, classes, time, cost"
    )
    # "thawing" until every byte is restored and verified
    begun = RestoreResult(run, n, chosen.save, tuple(chosen.notes), str(target), est.describe(), est.as_record(),
                          status="thawing")  # fmt: skip
    if est.frozen:
        requested = request_thaw_task(store, plans, tier)
        record_task(
            catalog, [events.restore_requested(run, n, tier, requested, str(flow_run.id or ""), save=chosen.save)]
        )
        frozen = wait_for_thaw_task(store, plans, wait_hours * 3600 if wait else 0.0)
        if frozen:
            msg = f"{len(frozen)} of {est.objects} objects still frozen ({tier} tier); rerun this restore to continue"
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
            return replace(begun, frozen=len(frozen), message=msg)
    bar = ProgressBar(manifest.total_bytes, f"restore {run} step {n}")
    t_download = time.monotonic()
    if node_local:
        pointer, aside = _on_nodes(cfg, store, manifest, plans, dest, force, bar)
        where = dest
    else:
        staged = staging_dir_task(target)
        try:
            failed, errors = _download(store, plans, staged, manifest, bar, split_size(cfg.scale.split_size_mb))
            if errors:
                raise RestoreError(f"{failed}; nothing was changed at {target}:\n" + "\n".join(errors))
            pointer = write_pointer_task(staged, manifest)
        except BaseException:
            discard_task(staged)
            raise
        moved = finalize_task(staged, target, force)  # a failure here keeps the verified copy (finalize says where)
        aside = str(moved) if moved else None
        where = str(target)
    download_s = time.monotonic() - t_download
    record_task(catalog, [events.restored(manifest, where, str(flow_run.id or ""), download_s)])
    notify_task(cfg, store, [alerts.restore_completed(run, n, where, time.monotonic() - t0, flow_run_url())])
    report = replace(
        begun,
        status="restored",
        pointer=pointer,
        replaced=aside,
        bytes=manifest.total_bytes,
        files=len(manifest.files),
    )
    publish_markdown_task(
        "restore-result",
        f"### Restored {run} step {n}\n\n- destination: `{where}`\n- files: {len(manifest.files)}, "
        f"{humanize.size(manifest.total_bytes)}, every CRC32C verified\n- pointer file: {pointer or 'none'}\n",
        "what was restored and where",
    )
    return report


def _download(
    store: ObjectStore, plans: list[ObjectPlan], staged: Path, manifest: Manifest, bar: ProgressBar, threshold: int
) -> tuple[str, list[str]]:
    """Every file into `staged`: a small one as one task, a big one as range tasks (spread over the
    workers) between making it at its size and verifying it whole. Returns what failed, counted, and
    every failure (none: all verified). Each phase waits for the last: a range must not write before
    its file exists, nor a file be verified before all its ranges are in."""
    cut = ranged.split_plans(plans, threshold, store.transfer.part_size)
    if cut.split:
        errors = settle(allocate_task.map(cut.split, unmapped(staged), unmapped(manifest)))
        if errors:
            return f"{len(errors)} of {len(cut.split)} files to fetch as ranges could not be created", errors
    ranges_f = []
    if cut.pieces:  # first: the biggest files, whose ranges keep every worker busy
        ranges_f = fetch_range_task.map(unmapped(store), [p.plan for p in cut.pieces], unmapped(staged),
                                        unmapped(manifest), [p.offset for p in cut.pieces],
                                        [p.length for p in cut.pieces], unmapped(bar))  # fmt: skip
    whole_f = []
    if cut.whole:
        whole_f = download_one_task.map(unmapped(store), cut.whole, unmapped(staged), unmapped(manifest),
                                        unmapped(bar))  # fmt: skip
    errors = settle([*ranges_f, *whole_f])
    if errors:
        if not cut.split:
            return f"{len(errors)} of {len(plans)} files failed", errors
        tasks = len(ranges_f) + len(whole_f)
        return f"{len(errors)} of {tasks} downloads ({len(plans)} files, {len(cut.split)} as ranges) failed", errors
    if not cut.split:
        return "", []
    fetched = ranged.by_file(cut.split, [f.result() for f in ranges_f])
    errors = settle(seal_task.map(cut.split, unmapped(staged), unmapped(manifest), fetched))
    return f"{len(errors)} of {len(cut.split)} files fetched as ranges failed their check", errors


def _on_nodes(
    cfg: Config, store: ObjectStore, manifest: Manifest, plans: list[ObjectPlan], dest: str, force: bool,
    bar: ProgressBar,
) -> tuple[str | None, str | None]:  # fmt: skip
    """--node-local: each node's files onto that node's disk, every step on that node's worker
    (ckptvault/restore/nodes.py). Nothing is renamed into place on any node until every file on every
    node is verified; node 0 (the metadata) goes last, and a failed rename puts the others back.
    Returns the pointer file and the kept-aside destinations (--force)."""
    placement, note = on_nodes.placement_to_use(manifest, on_nodes.placement_for(cfg, manifest.run))
    if note:
        print(f"{manifest.run} step {manifest.step}: {note}")
    require_workers(placement, worker_resources(), manifest.run, manifest.step, "written")
    groups = on_nodes.plans_by_node(placement, plans)
    names = {i: placement.name(i) for i in groups}

    staged_on = _each(names, lambda i: stage_on_node_task.map(unmapped(dest), [names[i]], unmapped(force))[0])
    staged = {i: p for i, p in staged_on.items() if isinstance(p, Path)}
    try:
        problems = [f"{names[i]}: {e}" for i, e in staged_on.items() if isinstance(e, BaseException)]
        if problems:
            raise RestoreError("the destination is not usable on every node; nothing was restored:\n"
                               + "\n".join(problems))  # fmt: skip
        paths = list(staged.values())
        seen = _each(names, lambda i: others_seen_task.map([staged[i]], unmapped(paths), [names[i]])[0])
        shared = [f"{names[i]} sees {', '.join(s)}" if isinstance(s, list) else f"{names[i]} could not check: {s}"
                  for i, s in seen.items() if not isinstance(s, list) or s]  # fmt: skip
        if shared:
            raise RestoreError(
                f"--node-local: the nodes share {dest} (or a node could not check), so each node's rename would "
                "replace the last one's; nothing was restored. Give each node its own disk, e.g. "
                "--dest '/local_nvme/${CKPTVAULT_NODE}/restored' (single quotes), or drop --node-local:\n"
                + "\n".join(shared)
            )
        futures = []
        for i, group in groups.items():
            if group:
                with pinned(names[i]):  # each file is written by the worker of the node that holds it
                    futures += download_one_task.map(unmapped(store), group, unmapped(staged[i]), unmapped(manifest),
                                                     unmapped(bar))  # fmt: skip
        errors = settle(futures)
        if errors:
            raise RestoreError(
                f"{len(errors)} of {len(plans)} files failed; nothing was changed at {dest} on any node:\n"
                + "\n".join(errors)
            )
        # every node's ranks look for the framework's pointer file on their own disk
        written = _each(names, lambda i: write_pointer_task.map([staged[i]], unmapped(manifest))[0])
        if failed_pointer := [f"{names[i]}: {e}" for i, e in written.items() if isinstance(e, BaseException)]:
            raise RestoreError("the pointer file could not be written; nothing was restored:\n"
                               + "\n".join(failed_pointer))  # fmt: skip
    except BaseException:
        _each({i: names[i] for i in staged}, lambda i: discard_on_node_task.map([staged[i]], [names[i]])[0])
        raise
    asides = _finalize_on_nodes(names, staged, dest, force)
    pointer = written[0]
    return (pointer if isinstance(pointer, str) else None), ", ".join(asides) if asides else None


def _finalize_on_nodes(names: dict[int, str], staged: dict[int, Path], dest: str, force: bool) -> list[str]:
    """Each node's rename into place: the others first, node 0 (metadata and pointer) last; if one
    fails, the ones done are put back, so a job never resumes from a checkpoint missing a node."""

    def rename(nodes: list[int]) -> dict[int, Any]:
        def one(i: int) -> StepFuture[Any]:
            return finalize_on_node_task.map([staged[i]], unmapped(dest), [names[i]], unmapped(force))[0]

        return _each({i: names[i] for i in nodes}, one)

    moved = rename([i for i in staged if i != 0])
    if not any(isinstance(r, BaseException) for r in moved.values()):
        moved |= rename([0])
    failed = {i: e for i, e in moved.items() if isinstance(e, BaseException)}
    if not failed:
        return [str(a) for a in moved.values() if a]
    done = [i for i in moved if i not in failed]
    undone = _each({i: names[i] for i in done},
                   lambda i: undo_on_node_task.map([staged[i]], unmapped(dest), [names[i]], [moved[i]])[0])  # fmt: skip
    stuck = {i: e for i, e in undone.items() if isinstance(e, BaseException)}
    why = "\n".join(f"{names[i]}: {e}" for i, e in failed.items())
    if stuck:
        raise on_nodes.PartialRestoreError(
            f"every file was verified, but the rename into {dest} failed on {', '.join(names[i] for i in failed)}, "
            f"and putting back the copies already in place failed on {', '.join(names[i] for i in stuck)}: those "
            "nodes hold this checkpoint's files at --dest, the others do not; do not resume from it:\n"
            + why + "\n" + "\n".join(f"{names[i]}: {e}" for i, e in stuck.items())
        )
    _each({i: names[i] for i in staged}, lambda i: discard_on_node_task.map([staged[i]], [names[i]])[0])
    raise RestoreError(
        f"every file was verified, but the rename into {dest} failed on {', '.join(names[i] for i in failed)}; "
        f"the nodes already done were put back, so nothing was changed on any node:\n{why}"
    )


def _each(names: dict[int, str], submit: Callable[[int], StepFuture[Any]]) -> dict[int, Any]:
    """One task per node, each pinned to that node's worker; every result or exception, by node."""
    futures = {}
    for i, name in names.items():
        with pinned(name):
            futures[i] = submit(i)
    wait_all(futures.values())
    return {i: f.result(raise_on_failure=False) for i, f in futures.items()}
