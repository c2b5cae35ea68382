"""The `ckptvault` command line: an entry layer beside deployments. It may drive flows.

Exit codes: 0 success; 1 the work ran but something did not end well (an invalid checkpoint, a
failed upload, a failed drill); 2 bad input or an unusable environment (config, paths, store),
reported before anything is touched.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from ckptvault.config import Config, ConfigError, check_sources, load_config
from ckptvault.errors import CkptvaultError
from ckptvault_cli import process, running

if TYPE_CHECKING:
    from ckptvault.catalog import Catalog  # imported when a command reads it: pyarrow costs start-up

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad input or environment: exit 2 with the message."""


def _quiet_prefect_env() -> None:
    # Telemetry off, always: offline it fails noisily, and we promise users it is off.
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _jsonable(o: object) -> object:
    import dataclasses

    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    return str(o)  # exceptions, paths, anything else: its text


def _emit_json(doc: object) -> None:
    """The one JSON document a `--json` command prints on stdout (schemas in the README)."""
    import json

    print(json.dumps(doc, indent=1, default=_jsonable), flush=True)


def _preflight(args: argparse.Namespace, *, need_sources: bool) -> Config:
    """Everything that can be checked before touching anything: config, source paths, the bucket."""
    from ckptvault.store import StoreError, open_store

    cfg = load_config(args.config)
    if need_sources:
        problems = check_sources(cfg)
        if problems:
            raise UsageError("\n".join(problems))
        if not cfg.sources:
            raise UsageError("no [[sources]] in the configuration: add one per training run to ingest.")
    try:
        open_store(cfg.store).check_bucket()
    except StoreError as e:
        raise UsageError(str(e)) from None
    return cfg


_noted: list[bool] = []


def _start_prefect_note(force_prefect: bool = False) -> None:
    _quiet_prefect_env()
    if (force_prefect or not running.direct()) and not os.environ.get("PREFECT_API_URL") and not _noted:
        _noted.append(True)  # the temporary API lives as long as this process: say it once
        _say(
            "starting a temporary Prefect API for this command (10-30 s; "
            "set PREFECT_API_URL to a running server, e.g. `make up`, to skip this)"
        )


def cmd_ingest(args: argparse.Namespace) -> int:
    cfg_path = args.config
    cfg = _preflight(args, need_sources=True)
    from ckptvault_prefect.flows.scale import RunnerChoiceError, SchedulerUnreachable, check_scheduler, choose_runner

    try:
        choice = choose_runner(
            cfg.scale,
            address_flag=args.dask_address,
            workers_flag=args.dask_workers,
            api_url=os.environ.get("PREFECT_API_URL"),
        )
        if choice.kind == "cluster":
            check_scheduler(choice)  # bounded: a wrong address is exit 2 now, not a hang in the flow
    except (RunnerChoiceError, SchedulerUnreachable) as e:
        raise UsageError(str(e)) from None
    if cfg.validation.enabled and cfg.validation.isolate and not choice.needs_prefect:
        from ckptvault.ingest import quality
        # The gate child's Great Expectations import (~3 s) runs beside Prefect's start-up and discovery
        # instead of after them; with nothing new to validate the flow stops it after discovery.
        quality.prewarm()
    _start_prefect_note(force_prefect=choice.needs_prefect)
    from ckptvault.outcomes import IngestIncomplete
    from ckptvault_prefect.flows.ingest import ingest

    process.imports_done()
    if choice.needs_prefect:
        from ckptvault_prefect.flows.runners import task_runner_for

        ingest = ingest.with_options(task_runner=task_runner_for(choice))  # type: ignore[arg-type]
    # Dask workers run Prefect tasks: that needs a flow run, so a temporary API when none is configured
    result = running.run_flow(ingest, 2, force_prefect=choice.needs_prefect, config_path=cfg_path)
    if isinstance(result, IngestIncomplete):
        _print_outcomes(result.outcomes, args.json)
        _say(str(result))
        return EXIT_FAILED
    if isinstance(result, BaseException):
        if args.json:
            _emit_json({"ok": False, "error": str(result), "outcomes": []})
        _say(f"ingest failed: {result}")
        return EXIT_FAILED
    _print_outcomes(result, args.json)
    return EXIT_OK


def _print_outcomes(outcomes: Sequence[object], as_json: bool = False) -> None:
    from ckptvault.ingest.steps import Outcome

    if as_json:
        rows = [{**_jsonable(o), "ok": o.ok} for o in outcomes if isinstance(o, Outcome)]  # type: ignore[dict-item]
        _emit_json({"ok": all(r["ok"] for r in rows), "outcomes": rows})
        return
    for o in outcomes:
        assert isinstance(o, Outcome)
        extra = f"  {o.message}" if o.message else ""
        save = f" save {o.save}" if o.save != 1 else ""
        size = f"{o.bytes / 2**20:.1f} MiB"
        print(f"{o.result:9} {o.run} step {o.step}{save} ({o.format}, {size}, {o.files} files){extra}")


def cmd_ls(args: argparse.Namespace) -> int:
    import time

    from ckptvault.catalog import LIFECYCLE_STATES, Catalog
    from ckptvault.listing import SINCE_EXAMPLES, parse_since, render_table, select
    from ckptvault.store import open_store

    since = None
    if args.since is not None:
        try:
            since = parse_since(args.since, time.time())
        except ValueError as e:
            raise UsageError(f"--since {e}; give {SINCE_EXAMPLES}") from None
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: give a number of checkpoint saves, 1 or more (e.g. --limit 20)")
    if args.state and args.state not in LIFECYCLE_STATES:
        raise UsageError(f"--state {args.state!r} is not a state; one of: {', '.join(LIFECYCLE_STATES)}")
    cfg = _preflight(args, need_sources=False)
    catalog = Catalog(open_store(cfg.store), cfg.store.prefix)
    if args.json:
        # from the Arrow tables, without a CheckpointState per save: the same text, a fraction of the time
        from ckptvault.catalog.table_view import current_table, select_table, write_json_table

        table = select_table(current_table(catalog, args.run), args.state, since, args.limit)
        _alert_unreadable(cfg, catalog)
        sys.stdout.flush()
        write_json_table(table, sys.stdout.buffer)  # bytes a slice at a time: no str of the whole document
        sys.stdout.buffer.write(b"\n")  # as print() ended it
        sys.stdout.flush()
        return EXIT_OK
    states = catalog.current(args.run)
    _alert_unreadable(cfg, catalog)
    if args.state:
        states = [s for s in states if s.state == args.state]
    states = select(states, since, args.limit)
    print(render_table(states))
    return EXIT_OK


def _alert_unreadable(cfg: Config, catalog: Catalog) -> None:
    """Say on stderr which catalog objects could not be read (skipped: the rest is listed), and send a
    `catalog_unreadable` alert per run: deduplicated like every alert, never what makes the command fail."""
    from ckptvault.alerts import kinds
    from ckptvault.alerts.sending import send_alerts

    if not catalog.unreadable:
        return
    for key, why in sorted(catalog.unreadable.items()):
        _say(f"ckptvault: warning: skipped the unreadable catalog object {key}: {why}")
    found = catalog.unreadable_by_run()
    alerts = [kinds.catalog_unreadable(run or kinds.ALL_RUNS, objs) for run, objs in sorted(found.items(), key=str)]
    try:
        send_alerts(cfg, catalog.store, alerts)
    except CkptvaultError as e:
        _say(f"ckptvault: could not send the catalog_unreadable alert ({e})")


def cmd_catalog_stats(args: argparse.Namespace) -> int:
    from ckptvault import humanize
    from ckptvault.catalog import Catalog
    from ckptvault.store import open_store

    cfg = _preflight(args, need_sources=False)
    catalog = Catalog(open_store(cfg.store), cfg.store.prefix)
    st = catalog.stats()
    _alert_unreadable(cfg, catalog)
    if args.json:
        _emit_json(st.as_dict())
        return EXIT_OK
    print(f"{st.runs} runs, {st.checkpoints} checkpoint saves, {st.events} events")
    print(f"catalog objects: {st.event_files} event files, {st.snapshots} snapshots, {st.flat_files} in the flat "
          f"layout, {st.set_aside} set aside ({humanize.size(st.catalog_bytes)})")  # fmt: skip
    print("by state: " + (", ".join(f"{k} {v}" for k, v in sorted(st.by_state.items())) or "-"))
    for cls, (n, b) in sorted(st.by_class.items()):
        print(f"{cls:20} {n:8} saves  {humanize.size(b)}")
    for key in sorted(st.unreadable):
        print(f"unreadable: {key}")
    return EXIT_OK


def cmd_catalog_rebuild(args: argparse.Namespace) -> int:
    from ckptvault.catalog import Catalog
    from ckptvault.store import open_store

    cfg = _preflight(args, need_sources=False)
    from ckptvault import events as event_builders
    from ckptvault.catalog import fold
    from ckptvault.progress import ProgressBar
    from ckptvault.saves import replay_supersedes

    catalog = Catalog(open_store(cfg.store), cfg.store.prefix)
    # on stderr, and only on a terminal: --json keeps stdout one document
    events = catalog.rebuild_from_manifests(lambda n: ProgressBar(n, "rebuild", unit="manifests"))
    found = len(events)
    # Manifests say which saves exist, not which are current: replay the commits in the order written.
    replaced = [
        event_builders.superseded(x.state.run, x.state.step, x.state.save, x.reason, *x.by)
        for x in replay_supersedes(fold(events))
    ]
    events += replaced
    key = catalog.append(events) if args.write and events else None
    if args.json:
        _emit_json({"saves_found": found, "superseded": len(replaced), "written": key is not None, "key": key})
    elif key is not None:
        print(f"appended {len(events)} events rebuilt from manifests to {key}")
    else:
        print(
            f"{found} checkpoint saves found by their manifests, {len(replaced)} of them superseded "
            "(pass --write to append them to the catalog)"
        )
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    cfg = _preflight(args, need_sources=False)
    from ckptvault.catalog import Catalog, fold
    from ckptvault.restore import from_manifests
    from ckptvault.restore import steps as lib
    from ckptvault.store import open_store
    from ckptvault.tiering.cost import load_prices

    store = open_store(cfg.store)
    # the run's manifests stand in for whatever of its catalog cannot be read (the flow alerts)
    run_events, unreadable = from_manifests.run_events(Catalog(store, cfg.store.prefix), args.run)
    if unreadable:
        _say(f"ckptvault: warning: {from_manifests.fallback_warning(args.run, unreadable)}")
    try:
        # Bad input (an unknown run, step or save, a suspect without --force) is found here, from the
        # catalog alone, before a flow run exists: exit 2, nothing touched, no alert.
        chosen = lib.resolve(fold(run_events), args.run, lib.parse_step(args.step), args.save, args.force)
    except lib.RestoreError as e:
        raise UsageError(str(e)) from None
    check_destination_or_usage(lib.check_destination, args)
    if not args.json:
        # What it will cost and how long, on stdout, before anything starts: the manifest and one LIST.
        for note in chosen.notes:
            print(note, flush=True)
        manifest = lib.load_manifest(store, cfg.store.prefix, args.run, chosen.step, chosen.save)
        plans = lib.plan_objects(store, cfg.store.prefix, manifest)
        throughput = lib.restore_throughput(run_events)
        prices = load_prices(cfg.policy.prices)
        print(lib.estimate(manifest, plans, prices, args.tier, cfg.store.egress, throughput).report(), flush=True)
    _start_prefect_note()
    from ckptvault_prefect.flows.restore import restore

    process.imports_done()
    result = running.run_flow(
        restore,
        4,
        run=args.run,
        dest=args.dest,
        step=str(chosen.step),
        save=chosen.save,
        tier=args.tier,
        wait=not args.no_wait,
        force=args.force,
        wait_hours=args.wait_hours,
        config_path=args.config,
    )
    if isinstance(result, BaseException):
        if args.json:
            _emit_json({"status": "failed", "run": args.run, "step": chosen.step, "save": chosen.save,
                        "error": str(result)})  # fmt: skip
        _say(f"restore failed: {result}\nNothing at {args.dest} was changed.")
        return EXIT_FAILED
    if args.json:
        _emit_json(result)
        return EXIT_OK if result["status"] == "restored" or args.no_wait else EXIT_FAILED
    if result["status"] == "restored":
        print(f"restored {chosen.label} to {result['dest']} (every CRC32C verified)")
        if result.get("pointer"):
            print(f"pointer file {result['pointer']} written: the framework resumes from this checkpoint")
        if result.get("replaced"):
            print(f"the previous contents of the destination were kept at {result['replaced']}")
        return EXIT_OK
    print(result.get("message", "still thawing"))
    return EXIT_OK if args.no_wait else EXIT_FAILED


def check_destination_or_usage(check: Callable[..., None], args: argparse.Namespace) -> None:
    from pathlib import Path

    from ckptvault.restore.steps import RestoreError

    try:
        check(Path(args.dest).expanduser().resolve(), args.force)
    except RestoreError as e:
        raise UsageError(str(e)) from None


def cmd_drill(args: argparse.Namespace) -> int:
    _preflight(args, need_sources=False)
    _start_prefect_note()
    import json

    from ckptvault.outcomes import DrillFailed
    from ckptvault_prefect.flows.drill import drill

    process.imports_done()
    result = running.run_flow(drill, 4, sample=args.sample, tier=args.tier, config_path=args.config)
    if isinstance(result, DrillFailed):
        if args.json:
            print(json.dumps(result.report, indent=1))
        _say(str(result))
        return EXIT_FAILED
    if isinstance(result, BaseException):
        _say(f"drill failed: {result}")
        return EXIT_FAILED
    if args.json:
        print(json.dumps(result, indent=1))
        return EXIT_OK
    for r in result["drilled"]:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['run']} step {r['step']} restored and loaded in {r['seconds']} s")
    if not result["drilled"]:
        print("nothing to drill: no verified checkpoints in the catalog")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    """The tiering plan without Prefect: fast, read-only, what `tier --apply` would do."""
    import time

    from ckptvault.catalog import Catalog
    from ckptvault.store import open_store
    from ckptvault.tiering.cost import load_prices
    from ckptvault.tiering.policy import plan
    from ckptvault.tiering.report import plan_record, render_text

    cfg = _preflight(args, need_sources=False)
    store = open_store(cfg.store)
    kind = cfg.store.kind if cfg.store.kind != "auto" else store.kind()
    states = Catalog(store, cfg.store.prefix).current()
    p = plan(states, cfg.policy, load_prices(cfg.policy.prices), kind, time.time())
    if args.json:
        _emit_json(plan_record(p))
    else:
        print(render_text(p))
    return EXIT_OK


def cmd_tier(args: argparse.Namespace) -> int:
    _preflight(args, need_sources=False)
    _start_prefect_note()
    from ckptvault_prefect.flows.tier import tier

    process.imports_done()
    result = running.run_flow(tier, 4, apply=args.apply, config_path=args.config)
    if isinstance(result, BaseException):
        if args.json:
            _emit_json({"applied": False, "error": str(result)})
        _say(f"tier failed: {result}")
        return EXIT_FAILED
    if args.json:
        _emit_json(result)
    if not args.apply:
        _say("dry run: nothing was changed. Pass --apply to carry out this plan.")
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    _preflight(args, need_sources=False)
    _start_prefect_note()
    from ckptvault_prefect.flows.watch import watch

    process.imports_done()
    result = running.run_flow(watch, 4, config_path=args.config)
    if isinstance(result, BaseException):
        if args.json:
            _emit_json({"error": str(result)})
        _say(f"watch failed: {result}")
        return EXIT_FAILED
    if args.json:
        _emit_json(result)
        return EXIT_OK
    print(f"{len(result['alerts'])} alert(s); storage ${result['monthly_usd']:.2f}/month")
    return EXIT_OK


def cmd_accept(args: argparse.Namespace) -> int:
    """Release a quarantined checkpoint after human review; the next ingest uploads it."""
    import getpass

    from ckptvault import events
    from ckptvault.catalog import Catalog
    from ckptvault.store import open_store

    cfg = _preflight(args, need_sources=False)
    catalog = Catalog(open_store(cfg.store), cfg.store.prefix)
    from ckptvault.catalog import newest_saves

    current = {step: s for (_, step), s in newest_saves(catalog.current(args.run)).items()}
    s = current.get(args.step)
    if s is None or s.state != "invalid":
        shown = "not in the catalog" if s is None else f"in state {s.state!r}"
        raise UsageError(
            f"{args.run} step {args.step} is {shown}; only an invalid (quarantined) checkpoint can be accepted. "
            f"See `ckptvault ls --run {args.run} --state invalid`."
        )
    catalog.append([events.accepted(args.run, args.step, s.format, getpass.getuser(), args.reason, save=s.save)])
    print(f"accepted {args.run} step {args.step}; the next ingest pass uploads it")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    cfg_path = args.config or os.environ.get("CKPTVAULT_CONFIG")
    _preflight(args, need_sources=False)
    _quiet_prefect_env()
    from ckptvault_prefect.deployments.serve import serve_all

    process.imports_done()  # a long-lived process from here on: collection back on
    serve_all(cfg_path)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    from ckptvault import __version__
    config_help = "the TOML config (default: $CKPTVAULT_CONFIG)"
    p = argparse.ArgumentParser(prog="ckptvault", description="Training checkpoints: ingest, tier, drill, restore.")
    p.add_argument("--config", help=config_help)
    p.add_argument("--version", action="version", version=f"ckptvault {__version__}")
    # The global options again on every subcommand, so `ckptvault ingest --config c.toml` works as well
    # as `ckptvault --config c.toml ingest`. SUPPRESS: a subcommand sets it only when it is given there.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help=config_help)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("ingest", parents=[common], help="one ingest pass over every [[sources]] entry")
    s.add_argument(
        "--dask-workers", type=int, metavar="N", help="fan file uploads out over a new local Dask cluster of N workers"
    )
    s.add_argument(
        "--dask-address",
        metavar="tcp://HOST:PORT",
        help="fan file uploads out over the existing Dask cluster of this scheduler (overrides [scale])",
    )
    s.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    s.set_defaults(fn=cmd_ingest)

    s = sub.add_parser("ls", parents=[common], help="list checkpoints from the catalog")
    s.add_argument("--run", help="only this run")
    s.add_argument(
        "--state",
        metavar="STATE",
        help="only this lifecycle state: pending, invalid, accepted, verified, suspect, superseded, expired",
    )
    s.add_argument(
        "--since",
        metavar="WHEN",
        help="only saves written at or after WHEN: 2026-11-01, 2026-11-01T12:00:00Z, or back from now: 7d, 12h, 30m",
    )
    s.add_argument("--limit", type=int, metavar="N", help="only the N newest saves (listed in the usual order)")
    s.add_argument("--json", action="store_true", help="one JSON object per checkpoint save (schema in the README)")
    s.set_defaults(fn=cmd_ls)

    s = sub.add_parser(
        "restore", parents=[common], help="bring back a checkpoint to a directory the framework resumes from"
    )
    s.add_argument("run", help="the run name, as in [[sources]] run = ... (see `ckptvault ls`)")
    s.add_argument(
        "--step", default="latest", help="a step number or 'latest' (newest good: verified, not superseded or suspect)"
    )
    s.add_argument(
        "--save", type=int, metavar="K", help="which save of --step N (default: its newest; see `ls --run R`)"
    )
    s.add_argument("--dest", required=True, help="an empty or new directory (the run root to resume from)")
    s.add_argument(
        "--tier",
        default="Standard",
        choices=["Expedited", "Standard", "Bulk"],
        help="thaw speed for archived objects (cost rises with speed)",
    )
    s.add_argument("--no-wait", action="store_true", help="request the thaw and return; rerun later to finish")
    s.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    s.add_argument("--wait-hours", type=float, default=48.0, help="give up waiting for a thaw after this long")
    s.add_argument(
        "--force",
        action="store_true",
        help="restore into a non-empty destination (kept aside, not deleted), or restore a suspect checkpoint",
    )
    s.set_defaults(fn=cmd_restore)

    s = sub.add_parser("drill", parents=[common], help="restore a rotating sample into scratch and prove it loads")
    s.add_argument("--sample", type=int, help="how many checkpoints (default [drill].sample)")
    s.add_argument("--tier", choices=["Expedited", "Standard", "Bulk"], help="thaw tier (default [drill].restore_tier)")
    s.add_argument("--json", action="store_true", help="the drill report as JSON (README, Restore drills)")
    s.set_defaults(fn=cmd_drill)

    s = sub.add_parser("plan", parents=[common], help="show the tiering plan and its cost (read-only, no Prefect)")
    s.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    s.set_defaults(fn=cmd_plan)

    s = sub.add_parser("tier", parents=[common], help="run the tier flow: the plan, and with --apply, carry it out")
    s.add_argument("--apply", action="store_true", help="carry out the plan (default: dry run)")
    s.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    s.set_defaults(fn=cmd_tier)

    s = sub.add_parser("watch", parents=[common], help="stale runs and storage budget; alerts")
    s.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    s.set_defaults(fn=cmd_watch)

    s = sub.add_parser("accept", parents=[common], help="release a quarantined (invalid) checkpoint after review")
    s.add_argument("run", help="the run name (see `ckptvault ls --state invalid`)")
    s.add_argument("step", type=int, help="the quarantined step")
    s.add_argument("--reason", required=True, help="why it is fine: recorded in the catalog with your user name")
    s.set_defaults(fn=cmd_accept)

    s = sub.add_parser(
        "serve", parents=[common], help="serve all five deployments from this process (one machine, no work pool)"
    )
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("catalog", parents=[common], help="catalog maintenance")
    csub = s.add_subparsers(dest="catalog_command", required=True)
    r = csub.add_parser("rebuild", parents=[common], help="reconstruct catalog events from the manifests in the bucket")
    r.add_argument("--write", action="store_true", help="append the rebuilt events to the catalog")
    r.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    r.set_defaults(fn=cmd_catalog_rebuild)
    r = csub.add_parser("stats", parents=[common], help="runs, checkpoints, events, catalog files, bytes per class")
    r.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    r.set_defaults(fn=cmd_catalog_stats)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    fn: Callable[[argparse.Namespace], int] = args.fn
    try:
        return fn(args)
    except (ConfigError, UsageError) as e:
        _say(f"ckptvault: {e}")
        return EXIT_USAGE
    except CkptvaultError as e:  # the work ran and ckptvault said why it stopped: no traceback
        _say(f"ckptvault: {e}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        _say("ckptvault: interrupted; rerun the same command to continue where it stopped")
        return EXIT_INTERRUPTED


# After Ctrl-C the work gets this long to stop by itself (a flow run reports its state to the server),
# then the process ends anyway: Prefect's task runner otherwise waits for an upload in flight to finish.
INTERRUPT_GRACE_S = 3.0


def _on_interrupt(signum: int, frame: object) -> None:
    """The first SIGINT interrupts as Python does by default, with a deadline: a hard exit (130, the
    message) if the process is still here INTERRUPT_GRACE_S later. Nothing committed is at risk: the
    manifest is written last, and a rerun resumes what was in flight."""

    def deadline() -> None:
        _say("ckptvault: interrupted; rerun the same command to continue where it stopped")
        os._exit(EXIT_INTERRUPTED)

    timer = threading.Timer(INTERRUPT_GRACE_S, deadline)
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise KeyboardInterrupt


def run() -> NoReturn:
    """The console-script entry (`ckptvault`): `main` in a process that ends with it."""
    process.begin_one_shot()
    signal.signal(signal.SIGINT, _on_interrupt)
    rc = main()
    process.end_one_shot()
    if rc == EXIT_INTERRUPTED:
        # Worker threads may still be inside a part upload: an ordinary exit would join them first.
        # Nothing needs them: the work is committed only after every file is verified, and a rerun
        # resumes what they leave half-done.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    run()
