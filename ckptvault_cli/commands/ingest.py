"""`ckptvault ingest`: one ingest pass over every [[sources]] entry (or one run's, or one or several steps
of it), and how its outcomes are printed."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault_cli import process, running
from ckptvault_cli.json_text import jsonable
from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_WAITING,
    UsageError,
    preflight_runner,
    preflight_store,
    start_prefect_note,
)

if TYPE_CHECKING:
    from ckptvault.config import Config


def cmd_ingest(args: argparse.Namespace) -> int:
    cfg_path = args.config
    # --step may be given more than once: a hook's queued saves of one run, taken in one pass
    run, named = args.run, list(dict.fromkeys(args.step or ()))
    if named and run is None:
        raise UsageError("--step needs --run: a step number names a checkpoint only within its run")
    words = getattr(args, "written_by", None)  # callers that build their own Namespace need not know it
    if words is not None and not named:
        raise UsageError("--written-by needs --run and --step: it records what the process that saved those steps ran")
    from ckptvault.checkpoint.written_by import ReportedError, parse, render

    try:
        written_by = render(parse(words))
    except ReportedError as e:
        raise UsageError(f"--written-by: {e}") from None
    with phase(timing.PREFLIGHT):
        cfg, store = preflight_store(args, need_sources=True, config_read=lambda c: _start_gate_child(c, args))
        if run is not None:
            from ckptvault.ingest.narrow import UnknownRunError, narrow_sources

            try:
                narrow_sources(cfg.sources, run)
            except UnknownRunError as e:
                raise UsageError(str(e)) from None
        choice = preflight_runner(cfg, address_flag=args.dask_address, workers_flag=args.dask_workers)
    # one step goes as `step`, as before (and as the deployment's trigger passes it); several as `steps`
    step = named[0] if len(named) == 1 else None
    params: dict[str, object] = {"config_path": cfg_path, "run": run, "step": step}
    if len(named) > 1:
        params["steps"] = named
    if written_by:
        params["written_by"] = written_by
    if running.direct() and not choice.needs_prefect:
        # the flow's body without its Prefect flow: no module of this path imports Prefect (1-3 s)
        with phase(timing.IMPORTS):
            from ckptvault.ingest.steps import IngestIncomplete
            from ckptvault_prefect.flows.ingest_body import ingest_body

            process.imports_done()
        # the config parsed and the bucket probed above, not again in the body
        result = running.run_direct(ingest_body, "ingest", 2, **params, preflighted=(cfg, store))
    else:
        with phase(timing.IMPORTS):
            start_prefect_note(force_prefect=choice.needs_prefect)
            from ckptvault.ingest.steps import IngestIncomplete
            from ckptvault_prefect.flows.ingest import ingest

            process.imports_done()
            if choice.needs_prefect:
                from ckptvault_prefect.runtime.runners import task_runner_for

                ingest = ingest.with_options(task_runner=task_runner_for(choice))  # type: ignore[arg-type]
        # Dask workers run Prefect tasks: that needs a flow run, so a temporary API when none is configured
        result = running.run_flow(ingest, 2, force_prefect=choice.needs_prefect, **params)
    with phase(timing.OUTPUT):
        if isinstance(result, IngestIncomplete):
            print_outcomes(result.outcomes, args.json)
            say(str(result))
            return EXIT_FAILED
        if isinstance(result, BaseException):
            if args.json:
                emit_json({"ok": False, "error": str(result), "outcomes": []})
            say(f"ingest failed: {result}")
            return EXIT_FAILED
        print_outcomes(result, args.json)
        if run is not None and named:
            from ckptvault.ingest.narrow import waits_all

            whys = waits_all(result, run, named)
            for why in whys:
                # the hook's word was a hint: the commit rule (or settle_seconds) says not yet
                say(f"{why}; the next ingest (scheduled, or this command again) takes it once it is ready")
            if whys:
                return EXIT_WAITING
        return EXIT_OK


def _start_gate_child(cfg: Config, args: argparse.Namespace) -> None:
    """The gate child's start (interpreter, Great Expectations' import, its engine: ~3 s of CPU) runs
    beside everything after the config is read (the checks, the bucket probe, the imports, discovery)
    instead of after them: the gates then find it ready. With nothing new to validate the flow stops it
    after discovery; a preflight that fails stops it at exit. Not for Dask runs: their gates run in the
    workers, and the runner's own errors are preflight_runner's to report."""
    if not (cfg.validation.enabled and cfg.validation.isolate):
        return
    from ckptvault_prefect.runtime.scale import RunnerChoiceError, choose_runner

    try:
        choice = choose_runner(
            cfg.scale,
            address_flag=args.dask_address,
            workers_flag=args.dask_workers,
            api_url=os.environ.get("PREFECT_API_URL"),
        )
    except RunnerChoiceError:
        return
    if not choice.needs_prefect:
        from ckptvault.ingest import quality_child

        with phase(timing.GATES):
            quality_child.prewarm()


def print_outcomes(outcomes: Sequence[object], as_json: bool = False) -> None:
    from ckptvault.ingest.steps import Outcome

    if as_json:
        rows = [{**jsonable(o), "ok": o.ok} for o in outcomes if isinstance(o, Outcome)]  # type: ignore[dict-item]
        emit_json({"ok": all(r["ok"] for r in rows), "outcomes": rows})
        return
    for o in outcomes:
        assert isinstance(o, Outcome)
        extra = f"  {o.message}" if o.message else ""
        save = f" save {o.save}" if o.save != 1 else ""
        size = f"{o.bytes / 2**20:.1f} MiB"
        print(f"{o.result:9} {o.run} step {o.step}{save} ({o.format}, {size}, {o.files} files){extra}")
