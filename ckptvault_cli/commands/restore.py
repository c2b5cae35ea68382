"""`ckptvault restore` and `ckptvault drill`: bring a checkpoint back, or prove a sample of them loads."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ckptvault_cli import process, running
from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    check_destination_or_usage,
    preflight,
    preflight_runner,
    preflight_store,
    start_prefect_note,
)

if TYPE_CHECKING:
    from ckptvault.config import Config
    from ckptvault_prefect.runtime.scale import RunnerChoice


def cmd_restore(args: argparse.Namespace) -> int:
    cfg, store = preflight_store(args, need_sources=False)
    from ckptvault.catalog import Catalog
    from ckptvault.pricing import load_prices
    from ckptvault.restore import from_manifests
    from ckptvault.restore import steps as lib

    # the run's manifests stand in for whatever of its catalog cannot be read (the flow alerts)
    history = from_manifests.read_run(Catalog(store, cfg.store.prefix), args.run)
    if history.unreadable:
        say(f"ckptvault: warning: {from_manifests.fallback_warning(args.run, history.unreadable)}")
    try:
        # Bad input (an unknown run, step or save, a suspect without --force) is found here, from the
        # catalog alone, before a flow run exists: exit 2, nothing touched, no alert.
        chosen = lib.resolve(history.states(), args.run, lib.parse_step(args.step), args.save, args.force)
    except lib.RestoreError as e:
        raise UsageError(str(e)) from None
    if not args.node_local:  # --node-local: each node checks its own destination
        check_destination_or_usage(lib.check_destination, args)
    choice = restore_runner(cfg, args)
    if not args.json:
        # What it will cost and how long, on stdout, before anything starts: the manifest and one LIST.
        for note in chosen.notes:
            print(note, flush=True)
        manifest = lib.load_manifest(store, cfg.store.prefix, args.run, chosen.step, chosen.save)
        plans = lib.plan_objects(store, cfg.store.prefix, manifest)
        prices = load_prices(cfg.policy.prices)
        est = lib.estimate(manifest, plans, prices, args.tier, cfg.store.egress, history.throughput())
        print(est.report(), flush=True)
    start_prefect_note()
    from ckptvault_prefect.flows.restore import restore

    process.imports_done()
    if choice.needs_prefect:
        from ckptvault_prefect.runtime.runners import task_runner_for

        restore = restore.with_options(task_runner=task_runner_for(choice))  # type: ignore[arg-type]
    result = running.run_flow(
        restore,
        4,
        force_prefect=choice.needs_prefect,
        run=args.run,
        dest=args.dest,
        step=str(chosen.step),
        save=chosen.save,
        tier=args.tier,
        wait=not args.no_wait,
        force=args.force,
        wait_hours=args.wait_hours,
        config_path=args.config,
        node_local=args.node_local,
    )
    if isinstance(result, BaseException):
        if args.json:
            emit_json({"status": "failed", "run": args.run, "step": chosen.step, "save": chosen.save,
                        "error": str(result)})  # fmt: skip
        from ckptvault.restore.nodes import PartialRestoreError

        changed = "" if isinstance(result, PartialRestoreError) else f"\nNothing at {args.dest} was changed."
        say(f"restore failed: {result}{changed}")
        return EXIT_FAILED
    if args.json:
        emit_json(result.as_dict())
        return EXIT_OK if result.status == "restored" or args.no_wait else EXIT_FAILED
    if result.status == "restored":
        print(f"restored {chosen.label} to {result.dest} (every CRC32C verified)")
        if result.pointer:
            print(f"pointer file {result.pointer} written: the framework resumes from this checkpoint")
        if result.replaced:
            print(f"the previous contents of the destination were kept at {result.replaced}")
        return EXIT_OK
    print(result.message or "still thawing")
    return EXIT_OK if args.no_wait else EXIT_FAILED


def restore_runner(cfg: Config, args: argparse.Namespace) -> RunnerChoice:
    """Where the downloads run: the flags, then `[scale]`, as for ingest; a cluster only if every one
    of its workers sees the destination's file system (ckptvault_prefect.runtime.scale.for_restore)."""
    from pathlib import Path

    from ckptvault.config import NODE_ENV
    from ckptvault.restore import nodes
    from ckptvault.restore.resolve import RestoreError
    from ckptvault_prefect.runtime.scale import ProbeError, RunnerChoiceError, for_restore, workers_not_seeing

    if problem := nodes.dest_problem(args.dest, args.node_local, os.environ.get(NODE_ENV)):
        raise UsageError(problem)
    choice = preflight_runner(cfg, address_flag=args.dask_address, workers_flag=args.dask_workers)
    if args.node_local:
        try:
            nodes.placement_for(cfg, args.run)
        except RestoreError as e:
            raise UsageError(str(e)) from None
        if choice.kind != "cluster":
            raise UsageError(
                "--node-local has each node's files written on that node by its Dask worker: give --dask-address "
                "or set [scale] dask_address (a cluster with a worker per node, started with --resources node-I=1)"
            )
        return choice  # the destination is each node's own: no shared file system to check
    if choice.kind != "cluster":
        return choice
    where = Path(args.dest).expanduser().resolve().parent
    while not where.is_dir():  # the staging directory's parents are made at restore: the nearest that exists
        where = where.parent
    try:
        chosen = for_restore(choice, workers_not_seeing(choice, where), where)
    except (RunnerChoiceError, ProbeError) as e:
        raise UsageError(str(e)) from None
    if chosen is not choice:
        say(f"ckptvault: restoring from this host, not on the Dask cluster of {chosen.origin}")
    return chosen


def cmd_drill(args: argparse.Namespace) -> int:
    preflight(args, need_sources=False)
    start_prefect_note()
    import json

    from ckptvault.restore.drill import DrillFailed
    from ckptvault_prefect.flows.drill import drill

    process.imports_done()
    result = running.run_flow(drill, 4, sample=args.sample, tier=args.tier, config_path=args.config)
    if isinstance(result, DrillFailed):
        if args.json:
            print(json.dumps(result.report.as_dict(), indent=1))
        say(str(result))
        return EXIT_FAILED
    if isinstance(result, BaseException):
        say(f"drill failed: {result}")
        return EXIT_FAILED
    if args.json:
        print(json.dumps(result.as_dict(), indent=1))
        return EXIT_OK
    for r in result.drilled:
        seconds = round(r.seconds, 2)
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.run} step {r.step} restored and loaded in {seconds} s")
    if not result.drilled:
        print("nothing to drill: no verified checkpoints in the catalog")
    return EXIT_OK
