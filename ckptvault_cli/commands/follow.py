"""`ckptvault follow`: watch the sources and ingest each step as soon as its commit marker appears, the
same narrowed ingest as `ckptvault ingest --run R --step S`, one step at a time, until Ctrl-C.

Each source gets inotify when its run root is on a local file system and polling (a listing every
`--poll-seconds`) elsewhere: inotify sees nothing of what another node writes to a network file system
(ckptvault/ingest/watching.py decides, and says why). An event only makes follow look: the run is
scanned and the ingest judges the step by its commit rule. The decisions (new, done, due for a retry,
when to rescan) are ckptvault/ingest/follow.py's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ckptvault_cli import running
from ckptvault_cli.commands.ingest import print_outcomes
from ckptvault_cli.output import say
from ckptvault_cli.preflight import UsageError, preflight

if TYPE_CHECKING:
    from ckptvault.ingest.watching import Choice, TreeWatcher


def cmd_follow(args: argparse.Namespace) -> int:
    if args.poll_seconds <= 0:
        raise UsageError(f"--poll-seconds {args.poll_seconds:g}: give a positive number of seconds (default 5)")
    cfg = preflight(args, need_sources=True)
    from ckptvault.ingest.follow import DONE_RESULTS, FollowState, committed_steps, due, retries_of, scan_at, settle
    from ckptvault.ingest.narrow import UnknownRunError, narrow_sources
    from ckptvault.ingest.nodes import node_path
    from ckptvault.ingest.watching import TreeWatcher, decide, read_mountinfo

    try:
        sources = narrow_sources(cfg.sources, args.run)
    except UnknownRunError as e:
        raise UsageError(str(e)) from None
    from ckptvault_prefect.flows.ingest import ingest

    by_run = {s.run: s for s in sources}
    roots = {s.run: node_path(s.path) if s.locality == "node" else s.path for s in sources}
    mountinfo = read_mountinfo()
    choices = {run: decide(root, mountinfo, getattr(args, "watch", "auto")) for run, root in roots.items()}
    mechanism: dict[str, str] = {run: c.mechanism for run, c in choices.items()}
    watcher = _open_watcher(TreeWatcher, choices, roots, mechanism)
    for run in sorted(by_run):
        c = choices[run]
        where = f" ({c.reason})" if mechanism[run] == c.mechanism else ""
        how = "inotify" if mechanism[run] == "inotify" else f"polling every {args.poll_seconds:g} s"
        say(f"following {run} at {roots[run]}: {how}{where}")
    say("Ctrl-C stops")

    state = FollowState()
    said: set[str] = set()  # problems already printed: a run root not there yet is said once, not every poll
    last_scan = {run: float("-inf") for run in by_run}
    changed: set[str] = set(by_run)  # the first pass scans every run
    try:
        while True:
            if watcher is not None:
                changed.update(watcher.retry_roots())
            now = time.time()
            for run in by_run:
                watched = watcher is not None and watcher.watched.get(run, False)
                if now >= scan_at(mechanism[run], watched, last_scan[run], args.poll_seconds, retries_of(state, run)):
                    changed.add(run)
            if changed:
                scan: dict[str, set[int]] = {}
                for run in sorted(changed):
                    last_scan[run] = time.time()
                    steps, problems = committed_steps(by_run[run])
                    for p in problems:
                        if p not in said:
                            said.add(p)
                            say(p)
                    scan[run] = steps
                changed = set()
                for run, step in due(state, scan, time.time()):
                    result = _ingest_one(ingest, args.config, run, step)
                    retry_after = max(by_run[run].settle_seconds, args.poll_seconds)
                    settle(state, (run, step), result, time.time(), retry_after)
                    if result not in DONE_RESULTS:
                        say(f"{run} step {step}: {result}; looking again in {retry_after:g} s")
            now = time.time()
            wake = min(
                scan_at(
                    mechanism[run],
                    watcher is not None and watcher.watched.get(run, False),
                    last_scan[run],
                    args.poll_seconds,
                    retries_of(state, run),
                )
                for run in by_run
            )
            timeout = max(0.0, wake - now)
            if watcher is not None:
                changed = watcher.wait(timeout)
            else:
                time.sleep(timeout)
    finally:
        if watcher is not None:
            watcher.close()


def _open_watcher(
    watcher_cls: type[TreeWatcher], choices: dict[str, Choice], roots: dict[str, Path], mechanism: dict[str, str]
) -> TreeWatcher | None:
    """The inotify watcher over the runs that got inotify (None when none did). A run whose watches the
    kernel refuses is polled instead, and `mechanism` says so; said once here."""
    from ckptvault.ingest.watching import Inotify

    wanted = sorted(run for run, c in choices.items() if c.mechanism == "inotify")
    if not wanted:
        return None
    try:
        watcher = watcher_cls(Inotify())
    except OSError as e:
        for run in wanted:
            mechanism[run] = "poll"
        say(f"inotify is not available ({e.strerror or e}); polling every source")
        return None
    for run in wanted:
        try:
            watcher.watch(run, roots[run])
        except OSError as e:
            watcher.forget(run)
            mechanism[run] = "poll"
            say(
                f"{run}: inotify refused a watch ({e.strerror or e}: raise fs.inotify.max_user_watches); "
                "polling this source"
            )
    if not any(m == "inotify" for m in mechanism.values()):
        watcher.close()
        return None
    return watcher


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
