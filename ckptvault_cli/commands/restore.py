"""`ckptvault restore` and `ckptvault drill`: bring a checkpoint back, or prove a sample of them loads."""

from __future__ import annotations

import argparse
import contextvars
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault_cli import process, running
from ckptvault_cli.output import EXIT_PIPE, emit_json, let_go_of_closed_stdout, say
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
    from ckptvault.catalog import Catalog
    from ckptvault.config import Config
    from ckptvault.restore.complete import Chosen
    from ckptvault.restore.copies import Copy
    from ckptvault_prefect.runtime.scale import RunnerChoice


def cmd_restore(args: argparse.Namespace) -> int:
    with phase(timing.IMPORTS):
        from ckptvault.catalog import Catalog
        from ckptvault.command.memo import load_config
        from ckptvault.pricing import load_prices
        from ckptvault.restore import copies as copies_lib
        from ckptvault.restore import from_manifests
        from ckptvault.restore import steps as lib
        from ckptvault.restore.complete import Chosen

    with phase(timing.PREFLIGHT):
        cfg = load_config(args.config)
        names = [copies_lib.PRIMARY, *(r.name for r in cfg.replicas)]
        if args.source is not None and args.source not in names:
            raise UsageError(f"--from {args.source}: no such store (known: {', '.join(names)}); name one of them")
        if not cfg.replicas:  # one store: it must be there, as for every other command
            cfg, store = preflight_store(args, need_sources=False)
            copies = [copies_lib.Copy(copies_lib.PRIMARY, store, cfg.store.prefix)]
        else:
            copies = _open_copies(cfg)
    primary = copies[0].store
    # `--step N`: that step's manifest and listing fetched beside the catalog read, used if it names that save
    early = copies_lib.EarlySurvey(copies, args.run, args.step, args.save)
    with phase(timing.CATALOG_READ):
        if primary is not None:
            # the run's manifests stand in for whatever of its catalog cannot be read (the flow alerts);
            # remembered for this command: the flow it runs next in this process does not read it again
            history = from_manifests.read_run_once(Catalog(primary, cfg.store.prefix), args.run)
            if history.unreadable:
                say(f"ckptvault: warning: {from_manifests.fallback_warning(args.run, history.unreadable)}")
        else:
            say(
                f"ckptvault: warning: the primary store is unreachable ({copies[0].problem}); reading run "
                f"{args.run}'s saves from the replicas' manifests (docs/runbook.md, \"The primary store is down\")"
            )
            history = copies_lib.history_from_replicas(copies, args.run)
        try:
            # Bad input (an unknown run, step or save, a suspect without --force) is found here, from the
            # catalog alone, before a flow run exists: exit 2, nothing touched, no alert.
            chosen = lib.resolve(history.states(), args.run, lib.parse_step(args.step), args.save, args.force)
        except lib.RestoreError as e:
            raise UsageError(str(e)) from None
    with phase(timing.PREFLIGHT):
        if not args.node_local:  # --node-local: each node checks its own destination
            check_destination_or_usage(lib.check_destination, args)
        choice = restore_runner(cfg, args)
    with phase(timing.PLAN):
        # Which copy is read (docs/replicas.md, "Restore from a copy"): each copy's manifest and one LIST,
        # remembered for this command as the history is (the flow's survey of this save is this one)
        statuses = early.statuses(chosen.step, chosen.save)
        if statuses is None:
            statuses = copies_lib.survey_once(copies, args.run, chosen.step, chosen.save)
        try:
            ordered = copies_lib.choose(statuses, args.source)
        except lib.RestoreError as e:
            raise UsageError(str(e)) from None
        first = ordered[0]
        assert first.manifest is not None  # a usable copy has its manifest (copies.survey)
        prices = load_prices(cfg.policy.prices)
        egress = cfg.store.egress if first.order == 0 else cfg.replicas[first.order - 1].egress
        est = lib.estimate(first.manifest, first.plans, prices, args.tier, egress, history.throughput())
        if not args.json:
            # What it will cost and how long, on stdout, before anything starts.
            for note in chosen.notes:
                print(note, flush=True)
            print(est.report(), flush=True)
            if len(statuses) > 1:
                print("\n".join(copies_lib.report(ordered, statuses, args.source)), flush=True)
    if running.direct() and not choice.needs_prefect:
        # No Prefect API and no cluster: nothing of Prefect runs, so none of it is imported, and what
        # this command already read (the config, the stores, the catalog, the manifests) is not read
        # again by a flow: the downloads start from here (docs/performance.md, "Where a command's time goes").
        target = Path(args.dest).expanduser().resolve()
        plan = Chosen(args.run, chosen, target, tuple(ordered), tuple(statuses), est)
        catalog = Catalog(primary, cfg.store.prefix) if primary is not None else None
        with _released_when_final(args, chosen.label, chosen.step, chosen.save, choice):
            result = _restore_here(args, cfg, catalog, plan, history.unreadable)
        return _output(args, chosen.label, chosen.step, chosen.save, result)
    with phase(timing.IMPORTS):
        start_prefect_note()
        from ckptvault_prefect.flows.restore import restore

        process.imports_done()
        if choice.needs_prefect:
            from ckptvault_prefect.runtime.runners import task_runner_for

            restore = restore.with_options(task_runner=task_runner_for(choice))  # type: ignore[arg-type]
    with _released_when_final(args, chosen.label, chosen.step, chosen.save, choice):
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
            source=args.source,
        )
    return _output(args, chosen.label, chosen.step, chosen.save, result)


@contextmanager
def _released_when_final(
    args: argparse.Namespace, label: str, step: int, save: int, choice: RunnerChoice
) -> Iterator[None]:
    """In a warm child (ckptvault_cli/early_exit.py): once the restore's result is final (its bytes
    durable in place and recorded: ckptvault/command/early_result.py), print it, end `--profile`'s breakdown
    there, and give the user the exit code; the alert, the ledger and the flow run's end go on after.
    A cold process: nothing (it prints the result at its end, as always). Nor when the restore starts
    processes of its own that would hold the user's streams open past the release (a local Dask
    cluster's workers, the temporary Prefect API of CKPTVAULT_PREFECT=always without a server)."""
    from ckptvault_cli import early_exit

    own_processes = choice.kind != "threads" or running.temporary_api()
    if not early_exit.armed() or own_processes:
        yield
        return
    from ckptvault.command import early_result
    from ckptvault_cli import profiling

    def report(result: object) -> int | None:
        code: int | None = None
        try:
            with phase(timing.OUTPUT):
                code = _print_restored(args, label, step, save, result)
            profiling.finish(shutdown=False)
        except BrokenPipeError:
            # stdout's reader went away (`restore --json | head`): the user gets what main gives a cold one
            if not let_go_of_closed_stdout():
                raise
            code = EXIT_PIPE if code in (None, EXIT_OK) else code
        finally:
            if code is not None:  # printed: never printed again (`_output`), whatever else fails
                early_exit.release(code)
        return code

    def on_final(result: object) -> None:
        # in a context of its own: in a flow run, Prefect turns print() into log lines (log_prints)
        contextvars.Context().run(report, result)

    with early_result.listening(on_final):
        yield


def _output(args: argparse.Namespace, label: str, step: int, save: int, result: object) -> int:
    """The result printed and the exit code, unless the user was already given both (`_released_when_final`):
    then only what happened after, in the warm log."""
    from ckptvault_cli import early_exit

    with phase(timing.OUTPUT):
        code = early_exit.released()
        if code is None:
            return _print_restored(args, label, step, save, result)
        if isinstance(result, BaseException):  # the user has the result; this process's exit (in the log) says
            say(f"ckptvault: after the restore's result was given (exit {code}), its flow run ended with: {result}")
            return EXIT_FAILED
        return code


def _restore_here(
    args: argparse.Namespace, cfg: Config, catalog: Catalog | None, plan: Chosen, unreadable: Mapping[str, str]
) -> object:
    """The restore's second half in this process (ckptvault/restore/complete.py) with plain threads:
    the result, or the exception it ended with, alerted as a failed restore flow would be."""
    from ckptvault.alerts import kinds as alerts
    from ckptvault.restore import complete
    from ckptvault.transfer.submitter import Threads

    process.imports_done()
    started = time.monotonic()
    if catalog is None:
        say("ckptvault: the primary store is unreachable: this restore is not recorded in its catalog, nor alerted")
    try:
        # as many threads as the flow's task runner; none left running once the restore has returned
        with Threads(workers=4) as submit:
            if catalog is not None and unreadable:
                with phase(timing.ALERTS):
                    submit(complete.alert, cfg, catalog.store,
                           [alerts.catalog_unreadable(args.run, unreadable, None)], _secret)  # fmt: skip
            return complete.complete(submit, cfg, catalog, plan, tier=args.tier,
                                     wait_s=args.wait_hours * 3600 if not args.no_wait else 0.0, force=args.force,
                                     secret=_secret, started=started, catalog_whole=not unreadable)  # fmt: skip
    except Exception as e:  # as a Failed flow state would: one flow_failed alert, unless already alerted
        with phase(timing.ALERTS):
            _alert_failed(cfg, catalog, plan, e)
        return e


def _secret(name: str) -> str | None:
    """A Prefect Secret block's value: Prefect imported only when an alert channel names one."""
    from ckptvault_prefect.tasks.notify import load_secret

    return load_secret(name)


def _alert_failed(cfg: Config, catalog: Catalog | None, plan: Chosen, e: Exception) -> None:
    """What the restore flow's failure hook sends (ckptvault_prefect/runtime/hooks.py). Never raises."""
    from ckptvault.alerts import kinds as alerts
    from ckptvault.alerts.sending import send_alerts
    from ckptvault.errors import AlreadyAlerted

    if catalog is None:
        return
    from ckptvault.observe import ledger

    # `ckptvault_restore_failures_total{error_class}` (docs/metrics.md), as the flow's failure hook counts it
    counts = {ledger.counter_key("restore_failures", type(e).__name__): 1.0}
    ledger.note_ledger(catalog.store, cfg.store.prefix, counts, delete=cfg.store.flows_delete)  # never raises
    if isinstance(e, AlreadyAlerted):
        return
    try:
        alert = alerts.flow_failed("restore", "Failed", str(e), flow_run_url=None, run=plan.run,
                                   step=plan.resolution.step)  # fmt: skip
        send_alerts(cfg, catalog.store, [alert], _secret)
    except Exception as failed:  # say so on the console at least
        say(f"ckptvault: restore failed; the failure alert could not be sent ({failed})")


def _print_restored(args: argparse.Namespace, label: str, step: int, save: int, result: object) -> int:
    from ckptvault.restore import copies as copies_lib
    from ckptvault.restore.result import RestoreResult

    if isinstance(result, BaseException):
        if args.json:
            emit_json({"status": "failed", "run": args.run, "step": step, "save": save, "error": str(result)})
        from ckptvault.restore.nodes import PartialRestoreError

        changed = "" if isinstance(result, PartialRestoreError) else f"\nNothing at {args.dest} was changed."
        say(f"restore failed: {result}{changed}")
        return EXIT_FAILED
    assert isinstance(result, RestoreResult)
    for f in result.fallbacks:  # on stderr, with --json too: a copy that failed needs a person (scrub --repair)
        say(f"ckptvault: fallback: {f['path']} read from {f['from']} ({f['because']})")
    if args.json:
        emit_json(result.as_dict())
        return EXIT_OK if result.status == "restored" or args.no_wait else EXIT_FAILED
    if result.status == "restored":
        where = "" if result.source == copies_lib.PRIMARY else f" from replica {result.source}"
        print(f"restored {label} to {result.dest}{where} (every CRC32C verified)")
        if result.pointer:
            print(f"pointer file {result.pointer} written: the framework resumes from this checkpoint")
        if result.replaced:
            print(f"the previous contents of the destination were kept at {result.replaced}")
        if result.message:  # restored, but the catalog could not be told
            say(f"ckptvault: warning: {result.message}")
        return EXIT_OK
    print(result.message or "still thawing")
    return EXIT_OK if args.no_wait else EXIT_FAILED


def _open_copies(cfg: Config) -> list[Copy]:
    """The primary and every replica, opened; exit 2 when none can be reached."""
    from ckptvault.restore.copies import open_copies

    copies = open_copies(cfg)
    if all(c.store is None for c in copies):
        raise UsageError("no store can be reached: " + "; ".join(f"{c.name}: {c.problem}" for c in copies))
    return copies


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
