"""`ckptvault follow`'s decisions: which steps a scan of the sources shows as newly committed, which
waiting ones are due for another look, and what an ingest's outcome means for the next scan.

The loop itself (ckptvault_cli/commands/follow.py) scans a run when something tells it to look: an
inotify event on a local file system, the poll interval elsewhere (ckptvault/ingest/watching.py
decides which per source), a waiting step's retry time, and with inotify a slow rescan as insurance
(`scan_at`). A scan only
lists candidates and reads their commit rule (the layout's `complete`); it walks no files, so a
run with hundreds of steps costs one listing. The ingest it starts judges the step again exactly as
the scheduled pass does (discovery, settle time, gates): the scan is a hint, like a hook's call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ckptvault.config import SourceConfig
from ckptvault.formats import FormatError
from ckptvault.ingest.discovery import _layout, _one_per_step
from ckptvault.ingest.nodes import node_path

Key = tuple[str, int]  # (run, step)

# What an ingest outcome means for follow: done (never started again by this process) or retried.
# "invalid" is done: the same bytes fail the same gate; a rewrite of the step is a new save, which the
# scheduled ingest picks up.
DONE_RESULTS = frozenset({"uploaded", "warned", "present", "invalid"})
# With inotify, a full rescan this often all the same (or every --poll-seconds, if longer): events are
# never trusted alone, nor is their absence (a watch that could not be added, a directory deeper than
# the watched depth)
RESCAN_SECONDS = 60.0
# A run root that is not there yet (training has not started) is looked for this often under inotify
ROOT_RETRY_SECONDS = 1.0


@dataclass
class FollowState:
    """What this follow process knows: steps it finished with, and waiting ones with when to look again."""

    done: set[Key] = field(default_factory=set)
    retry_at: dict[Key, float] = field(default_factory=dict)


def committed_steps(source: SourceConfig) -> tuple[set[int], list[str]]:
    """The steps of `source` whose commit rule holds now (the layout's `complete`; no file is walked,
    no settle time applied), and problems (an unreadable root, an ambiguous format)."""
    root: Path = node_path(source.path) if source.locality == "node" else source.path
    problems: list[str] = []
    if not root.is_dir():
        return set(), [f"run {source.run!r}: {root} is not a readable directory yet"]
    try:
        layout = _layout(root, source.format, problems)
    except FormatError as e:
        return set(), [f"run {source.run!r}: {e}"]
    if layout is None:
        return set(), problems
    try:
        cands = _one_per_step(layout.candidates(root), problems)
    except OSError as e:  # a directory vanished mid-listing: the next poll sees the new state
        return set(), [f"run {source.run!r}: {root} changed while listing ({e.strerror}); next poll"]
    return {c.step for c in cands if c.complete}, problems


def due(state: FollowState, scan: Mapping[str, Iterable[int]], now: float) -> list[Key]:
    """The (run, step)s to ingest now, in run then step order: committed in this scan, not done, and
    not waiting for a retry time still ahead. Each key at most once, so one ingest per step."""
    out: list[Key] = []
    for run in sorted(scan):
        for step in sorted(set(scan[run])):
            key = (run, step)
            if key in state.done:
                continue
            if state.retry_at.get(key, 0.0) > now:
                continue
            out.append(key)
    return out


def settle(state: FollowState, key: Key, result: str, now: float, retry_after: float) -> None:
    """Record an ingest's result for `key`: done, or retried no sooner than `retry_after` seconds on
    ("waiting", "failed", no outcome at all: the next scan looks again)."""
    if result in DONE_RESULTS:
        state.done.add(key)
        state.retry_at.pop(key, None)
    else:
        state.retry_at[key] = now + retry_after


def scan_at(
    mechanism: str, root_watched: bool, last_scan: float, poll_seconds: float, retries: Iterable[float]
) -> float:
    """When a run is next scanned with no event: polled, every `poll_seconds`; under inotify, every
    RESCAN_SECONDS (or `poll_seconds` if longer), its root looked for every ROOT_RETRY_SECONDS while it
    is missing; and in any case at the first of its waiting steps' retry times set since its last scan
    (an older one was acted on by that scan, or its step has gone)."""
    if mechanism == "poll":
        interval = poll_seconds
    elif not root_watched:
        interval = min(poll_seconds, ROOT_RETRY_SECONDS)
    else:
        interval = max(RESCAN_SECONDS, poll_seconds)
    pending = [t for t in retries if t > last_scan]
    return min([last_scan + interval, *pending])


def retries_of(state: FollowState, run: str) -> list[float]:
    """The retry times of `run`'s waiting steps."""
    return [t for (r, _), t in state.retry_at.items() if r == run]
