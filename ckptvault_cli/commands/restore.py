"""`ckptvault restore` and `ckptvault drill`: bring a checkpoint back, or prove a sample of them loads."""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
    past_view,
    preflight_runner,
    preflight_store,
    start_prefect_note,
)

if TYPE_CHECKING:
    from typing import Any

    from ckptvault.config import Config
    from ckptvault.restore.complete import Chosen
    from ckptvault.restore.copies import Copy
    from ckptvault.restore.drill import DrillReport
    from ckptvault_prefect.runtime.scale import RunnerChoice


def cmd_restore(args: argparse.Namespace) -> int:
    with phase(timing.IMPORTS):
        from ckptvault.restore.complete import complete_here
        from ckptvault.restore.prepare import Request, Ways, prepare
        from ckptvault.restore.selection import NODE_LOCAL_REFUSED
        from ckptvault.restore.steps import RestoreError, check_destination

    with phase(timing.PREFLIGHT):
        cfg, copies = _open_stores(args)
        if args.as_of is not None:
            copies = _as_of(args, copies)
    # chosen once the save resolved and before the copies are surveyed: bad input is refused first, as
    # before a destination that is not empty or a cluster that cannot see it
    runner: list[RunnerChoice] = []

    def before_survey(_: object) -> None:
        with phase(timing.PREFLIGHT):
            if not args.node_local:  # --node-local: each node checks its own destination
                check_destination_or_usage(check_destination, args)
            runner.append(restore_runner(cfg, args))

    def print_estimate(plan: Chosen) -> None:
        if not args.json:
            # What it will cost and how long, on stdout, before anything starts.
            for note in plan.resolution.notes:
                print(note, flush=True)
            print(plan.estimate.report(), flush=True)
            if plan.selected is not None:
                print(plan.selected.describe(), flush=True)
            if len(plan.statuses) > 1:
                print("\n".join(plan.copies_report(args.source)), flush=True)

    ways = Ways(
        # `--step N`: that step's manifest and listing fetched beside the catalog read, used if it names that
        # save; what is read is remembered for this command: the flow it runs next in this process reads none again
        survey_early=True,
        # the run's manifests stand in for whatever of its catalog cannot be read (the flow alerts)
        unreadable=lambda _, why: say(f"ckptvault: warning: {why}"),
        primary_down=lambda problem: say(
            f"ckptvault: warning: the primary store is unreachable ({problem}); reading run "
            f"{args.run}'s saves from the replicas' manifests (docs/runbook.md, \"The primary store is down\")"
        ),
        resolved=before_survey,
        planned=print_estimate,
    )
    try:
        # Bad input (an unknown run, step or save, a suspect without --force, a --from copy that cannot
        # give the save) is found here, before a flow run exists: exit 2, nothing touched, no alert.
        if args.node_local and (args.only or args.exclude or args.only_keys):
            raise RestoreError(NODE_LOCAL_REFUSED)
        prepared = prepare(cfg, copies, Request(args.run, args.dest, args.step, args.save, args.tier, args.force,
                                                args.source, tuple(args.only or ()), tuple(args.exclude or ()),
                                                tuple(args.only_keys or ())),
                           ways)  # fmt: skip
    except RestoreError as e:
        raise UsageError(str(e)) from None
    plan, choice = prepared.chosen, runner[0]
    label, step, save = plan.resolution.label, plan.resolution.step, plan.resolution.save
    # --as-of reads through this process's view of the versions: never a flow, which would open the store anew
    if args.as_of is not None or (running.direct() and not choice.needs_prefect):
        # No Prefect API and no cluster: nothing of Prefect runs, so none of it is imported, and what
        # this command already read (the config, the stores, the catalog, the manifests) is not read
        # again by a flow: the downloads start from here (docs/performance.md, "Where a command's time goes").
        with _released_when_final(args, label, step, save, choice):
            process.imports_done()
            if prepared.catalog is None:
                say("ckptvault: the primary store is unreachable: this restore is not recorded in its catalog, "
                    "nor alerted")  # fmt: skip
            # a view of the past only reads: the restore is recorded nowhere (the catalog it read is the old one)
            catalog = None if args.as_of is not None else prepared.catalog
            result = complete_here(cfg, catalog, plan, tier=args.tier,
                                   wait_s=args.wait_hours * 3600 if not args.no_wait else 0.0, force=args.force,
                                   secret=_secret, unreadable=prepared.unreadable, warn=say)  # fmt: skip
        return _output(args, label, step, save, result)
    with phase(timing.IMPORTS):
        start_prefect_note()
        from ckptvault_prefect.flows.restore import restore

        process.imports_done()
        if choice.needs_prefect:
            from ckptvault_prefect.runtime.runners import task_runner_for

            restore = restore.with_options(task_runner=task_runner_for(choice))  # type: ignore[arg-type]
    with _released_when_final(args, label, step, save, choice):
        result = running.run_flow(
            restore,
            4,
            force_prefect=choice.needs_prefect,
            run=args.run,
            dest=args.dest,
            step=str(step),
            save=save,
            tier=args.tier,
            wait=not args.no_wait,
            force=args.force,
            wait_hours=args.wait_hours,
            config_path=args.config,
            node_local=args.node_local,
            source=args.source,
            only=args.only,
            exclude=args.exclude,
            only_keys=args.only_keys,
        )
    return _output(args, label, step, save, result)


def _as_of(args: argparse.Namespace, copies: list[Copy]) -> list[Copy]:
    """`--as-of TIME`: the copy to read (the primary, or `--from`'s) as its view at TIME; exit 2 on a TIME
    that names no moment or a bucket that keeps no versions, before anything else is read."""
    from dataclasses import replace
    from datetime import UTC, datetime

    if args.node_local:
        raise UsageError("--as-of with --node-local: a point-in-time restore runs in this process; drop one of them")
    wanted = [c for c in copies if args.source is None or c.name == args.source]
    copy = next((c for c in wanted if c.store is not None), None)
    if copy is None or copy.store is None:
        problem = "; ".join(f"{c.name}: {c.problem}" for c in wanted)
        raise UsageError(f"--as-of: the store to read cannot be reached ({problem})")
    view = past_view(copy.store, args.as_of, copy.prefix)
    when = datetime.fromtimestamp(view.at, UTC)
    say(f"ckptvault: reading {copy.name} as it was at {when:%Y-%m-%dT%H:%M:%SZ}; this restore is not recorded")
    return [replace(copy, store=view.store)]


def _open_stores(args: argparse.Namespace) -> tuple[Config, list[Copy]]:
    """The config and every store a save may be read from, the primary first; exit 2 on a `--from` that
    names none of them, or when none can be reached."""
    from ckptvault.command.memo import load_config
    from ckptvault.restore import copies as copies_lib

    cfg = load_config(args.config)
    names = [copies_lib.PRIMARY, *(r.name for r in cfg.replicas)]
    if args.source is not None and args.source not in names:
        raise UsageError(f"--from {args.source}: no such store (known: {', '.join(names)}); name one of them")
    if not cfg.replicas:  # one store: it must be there, as for every other command
        cfg, store = preflight_store(args, need_sources=False)
        return cfg, [copies_lib.Copy(copies_lib.PRIMARY, store, cfg.store.prefix)]
    copies = copies_lib.open_copies(cfg)
    if all(c.store is None for c in copies):
        raise UsageError("no store can be reached: " + "; ".join(f"{c.name}: {c.problem}" for c in copies))
    return cfg, copies


@contextmanager
def _released_when_final(
    args: argparse.Namespace, label: str, step: int, save: int, choice: RunnerChoice
) -> Iterator[None]:
    """In a warm child (ckptvault_cli/warm/early_exit.py): once the restore's result is final (its bytes
    durable in place and recorded: ckptvault/command/early_result.py), print it, end `--profile`'s breakdown
    there, and give the user the exit code; the alert, the ledger and the flow run's end go on after.
    A cold process: nothing (it prints the result at its end, as always). Nor when the restore starts
    processes of its own that would hold the user's streams open past the release (a local Dask
    cluster's workers, the temporary Prefect API of CKPTVAULT_PREFECT=always without a server)."""
    from ckptvault_cli.warm import early_exit

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
    from ckptvault_cli.warm import early_exit

    with phase(timing.OUTPUT):
        code = early_exit.released()
        if code is None:
            return _print_restored(args, label, step, save, result)
        if isinstance(result, BaseException):  # the user has the result; this process's exit (in the log) says
            say(f"ckptvault: after the restore's result was given (exit {code}), its flow run ended with: {result}")
            return EXIT_FAILED
        return code


def _secret(name: str) -> str | None:
    """A Prefect Secret block's value: Prefect imported only when an alert channel names one."""
    from ckptvault_prefect.tasks.notify import load_secret

    return load_secret(name)


def _print_restored(args: argparse.Namespace, label: str, step: int, save: int, result: object) -> int:
    from ckptvault.restore import copies as copies_lib
    from ckptvault.restore.result import RestoreResult
    from ckptvault.restore.selection import MARKER

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
        if result.selection is not None:
            sel = result.selection
            print(f"partial: {sel['files']} of {sel['of_files']} files; {MARKER} there lists the "
                  f"{sel['of_files'] - sel['files']} left out, so nothing mistakes it for the whole save")  # fmt: skip
            if (t := sel.get("tensors")) is not None:  # the .distcp files hold only the chosen items' bytes
                print(f"of {len(sel['by_tensor'])} .distcp files only {t['items']} of {t['of_items']} items were "
                      f"written ({t['tensors']} of {t['of_tensors']} tensors); the rest reads as zeros")  # fmt: skip
        if result.pointer:
            print(f"pointer file {result.pointer} written: the framework resumes from this checkpoint")
        if result.replaced:
            print(f"the previous contents of the destination were kept at {result.replaced}")
        if result.message:  # restored, but the catalog could not be told
            say(f"ckptvault: warning: {result.message}")
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
    import json

    if args.verify_only is None and args.step is not None:
        raise UsageError("--step N goes with --verify-only RUN (one save's resume check); a drill chooses its saves")
    if args.as_of is not None:
        if args.verify_only is not None:
            raise UsageError("--verify-only with --as-of: try the resume check on the store as it is; drop --as-of")
        if getattr(args, "python", None) is not None:
            raise UsageError("--python with --as-of: compare environments on the store as it is; drop --as-of")
        return _drill_as_of(args)
    python = _other_python(args.python) if getattr(args, "python", None) is not None else None
    cfg, store = preflight_store(args, need_sources=False)
    verify_only = _verify_only(args, cfg, store) if args.verify_only is not None else None
    if verify_only is None:
        from ckptvault.restore.verify import config_problems

        if problems := config_problems(cfg):  # before anything is restored
            raise UsageError("\n".join(problems))
    start_prefect_note()

    from ckptvault.restore.drill import DrillFailed
    from ckptvault_prefect.flows.drill import drill

    process.imports_done()
    result = running.run_flow(drill, 4, sample=args.sample, tier=args.tier, config_path=args.config,
                              verify_only=verify_only, python=python)  # fmt: skip
    if isinstance(result, DrillFailed):
        if args.json:
            print(json.dumps(result.report.as_dict(), indent=1))
        else:
            _print_verify(args, result.report)
            _print_environments(result.report)
        say(str(result))
        return EXIT_FAILED
    if isinstance(result, BaseException):
        say(f"drill failed: {result}")
        return EXIT_FAILED
    doc: dict[str, Any] = result.as_dict()
    return _print_drilled(args, result, doc)


def _verify_only(args: argparse.Namespace, cfg: Config, store: Any) -> tuple[str, int]:
    """`--verify-only RUN --step N`: (run, step), once the save exists and the run has a verify command that
    can be run here; exit 2 naming the fix otherwise, before anything is restored."""
    from ckptvault.catalog import Catalog
    from ckptvault.errors import InvalidArgumentError
    from ckptvault.restore.drill import one_save
    from ckptvault.restore.verify import config_problems

    run = args.verify_only
    if args.step is None:
        raise UsageError(f"--verify-only {run} needs --step N: the step whose save to try the resume check on")
    if args.sample is not None:
        raise UsageError("--verify-only drills one save: drop --sample")
    if cfg.verify_command_for(run) is None:
        raise UsageError(
            f"no resume check is configured for run {run!r}: set [drill] verify_command (or verify_command in the "
            'run\'s [[sources]] entry), e.g. verify_command = ["python", "resume_check.py", "{dest}"] '
            '(docs/drills.md, "Resume check")'
        )
    if problems := config_problems(cfg, [run]):
        raise UsageError("\n".join(problems))
    try:
        one_save(Catalog(store, cfg.store.prefix).current(run), run, args.step)
    except InvalidArgumentError as e:
        raise UsageError(str(e)) from None
    return run, args.step


def _other_python(given: str) -> str:
    """`--python PATH` as an absolute interpreter that runs ckptvault's load checks (probed: a few hundred
    ms), or exit 2 naming why, before anything is restored."""
    import shutil

    from ckptvault.restore.environment import OtherPythonError, probe

    found = shutil.which(given) if os.sep not in given else (given if os.path.isfile(given) else None)
    if found is None or not os.access(found, os.X_OK):
        raise UsageError(f"--python {given}: not an executable file. Give the interpreter of the environment to "
                         "compare, e.g. --python /opt/venv-next/bin/python")  # fmt: skip
    try:
        probe(found)
    except OtherPythonError as e:
        raise UsageError(f"--python {given}: {e}. Give the interpreter of the environment to compare, a Python "
                         "3.11 or later (e.g. /opt/venv-next/bin/python)") from None  # fmt: skip
    return os.path.abspath(found)


def _print_environments(report: DrillReport) -> None:
    """`--python`: each environment's versions and result, and what they say together."""
    for r in report.drilled:
        if r.other is None:
            continue
        for who, versions, ok in (("here", r.loaded_with, r.ok), (r.other.python, r.other.loaded_with, r.other.ok)):
            loaded = ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or "versions unknown"
            print(f"  {r.run} step {r.step} with {who} ({loaded}): {'passed' if ok else 'FAILED'}")
        if r.format_rot:
            print(f"  format rot: {r.run} step {r.step} loads here but not with {r.other.python}; the save is not "
                  "marked suspect")  # fmt: skip


def _print_verify(args: argparse.Namespace, report: DrillReport) -> None:
    """`--verify-only` without --json: what the command printed (its tails), for the person trying it out."""
    if args.verify_only is None:
        return
    for r in report.drilled:
        if r.verify is None:
            continue
        for name, text in (("stdout", r.verify.stdout_tail), ("stderr", r.verify.stderr_tail)):
            if text.strip():
                print(f"--- verify command's {name} (tail) ---\n{text.rstrip()}")
        print(f"resume check {r.verify.outcome}: {r.verify.why} ({r.verify.seconds:.1f} s)")


def _print_drilled(args: argparse.Namespace, result: DrillReport, doc: dict[str, Any]) -> int:
    import json

    if args.json:
        print(json.dumps(doc, indent=1))
        return EXIT_OK
    _print_verify(args, result)
    _print_environments(result)
    for r in result.drilled:
        seconds = round(r.seconds, 2)
        checked = "restored, loaded and resumed" if r.verify is not None else "restored and loaded"
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.run} step {r.step} {checked} in {seconds} s")
    if not result.drilled:
        print("nothing to drill: no verified checkpoints in the catalog")
    return EXIT_OK


def _drill_as_of(args: argparse.Namespace) -> int:
    """`drill --as-of TIME`: the drill of the primary store as it was at TIME (its sample chosen from the
    catalog as it was then, as `restore --as-of` decides which save `latest` is), in this process (never a
    flow run: a view of the past is this process's), recorded nowhere: no drill event in the catalog, no
    alert, no metric. Exit 2 on a TIME that names no moment or a bucket that keeps no versions, before
    anything else is read (or imported); else the drill's exit codes."""
    import json
    from datetime import UTC, datetime

    cfg, store = preflight_store(args, need_sources=False)
    view = past_view(store, args.as_of, cfg.store.prefix)
    when = f"{datetime.fromtimestamp(view.at, UTC):%Y-%m-%dT%H:%M:%SZ}"
    unrecorded = "not recorded: no drill event in the catalog, no alert, no metric; the bucket is only read"
    say(f"ckptvault: drilling the primary store as it was at {when}; this drill is {unrecorded}")
    from ckptvault.restore.drill import DrillFailed, DrillReport
    from ckptvault_prefect.flows.drill import drill
    from ckptvault_prefect.tasks.step import direct_mode

    process.imports_done()
    # the flow's body as direct mode runs it, without run_direct's flow_failed alert (a write): the
    # failure is this command's exit code and message only. What the flow prints is its log: on stderr.
    with direct_mode(4), contextlib.redirect_stdout(sys.stderr):
        try:
            result: object = drill.fn(sample=args.sample, tier=args.tier, config_path=args.config, as_of=view.at)
        except Exception as e:
            result = e
    past = {"as_of": when, "recorded": False}
    if isinstance(result, DrillFailed):
        if args.json:
            print(json.dumps(result.report.as_dict() | past, indent=1))
        say(str(result))
        return EXIT_FAILED
    if isinstance(result, BaseException):
        say(f"drill failed: {result}")
        return EXIT_FAILED
    assert isinstance(result, DrillReport)
    code = _print_drilled(args, result, result.as_dict() | past)
    if not args.json:
        print(f"drilled as it was at {when}; {unrecorded}")
    return code
