"""`ckptvault follow`: watch the sources and ingest each step as soon as its commit marker appears, the
same narrowed ingest as `ckptvault ingest --run R --step S`, one step at a time, until Ctrl-C.

The mechanism is polling (a listing of every run root each `--poll-seconds`): inotify sees nothing of
what another node writes to a network file system, which is where checkpoints usually are. The
decisions (new, done, due for a retry) are ckptvault/ingest/follow.py's.
"""

from __future__ import annotations

import argparse
import sys
import time

from ckptvault_cli import running
from ckptvault_cli.commands.ingest import print_outcomes
from ckptvault_cli.output import say
from ckptvault_cli.preflight import UsageError, preflight


def cmd_follow(args: argparse.Namespace) -> int:
    if args.poll_seconds <= 0:
        raise UsageError(f"--poll-seconds {args.poll_seconds:g}: give a positive number of seconds (default 5)")
    cfg = preflight(args, need_sources=True)
    from ckptvault.ingest.follow import DONE_RESULTS, FollowState, committed_steps, due, settle
    from ckptvault.ingest.narrow import UnknownRunError, narrow_sources

    try:
        sources = narrow_sources(cfg.sources, args.run)
    except UnknownRunError as e:
        raise UsageError(str(e)) from None
    from ckptvault_prefect.flows.ingest import ingest

    by_run = {s.run: s for s in sources}
    state = FollowState()
    said: set[str] = set()  # problems already printed: a run root not there yet is said once, not every poll
    runs = ", ".join(sorted(by_run))
    say(f"following {runs}: a scan every {args.poll_seconds:g} s; Ctrl-C stops")
    while True:
        scan: dict[str, set[int]] = {}
        for source in sources:
            steps, problems = committed_steps(source)
            for p in problems:
                if p not in said:
                    said.add(p)
                    say(p)
            scan[source.run] = steps
        for run, step in due(state, scan, time.time()):
            result = _ingest_one(ingest, args.config, run, step)
            retry_after = max(by_run[run].settle_seconds, args.poll_seconds)
            settle(state, (run, step), result, time.time(), retry_after)
            if result not in DONE_RESULTS:
                say(f"{run} step {step}: {result}; looking again in {retry_after:g} s")
        time.sleep(args.poll_seconds)


def _ingest_one(ingest: object, config: str | None, run: str, step: int) -> str:
    """One narrowed ingest (the flow `ingest --run R --step S` runs), its outcome for (run, step) printed;
    the outcome's result, or "failed" when the pass ended without one."""
    from ckptvault.ingest.steps import IngestIncomplete, Outcome

    result = running.run_flow(ingest, 2, config_path=config, run=run, step=step)
    if isinstance(result, IngestIncomplete):
        outcomes: list[Outcome] = result.outcomes
    elif isinstance(result, BaseException):
        say(f"{run} step {step}: ingest failed: {result}")
        return "failed"
    else:
        outcomes = [o for o in result if isinstance(o, Outcome)]
    mine = [o for o in outcomes if o.run == run and o.step == step]
    print_outcomes(mine)
    sys.stdout.flush()  # a log file (block-buffered stdout) shows each step as it is archived
    return mine[0].result if mine else "waiting"
