"""An ingest narrowed to one run, or to one step of one run (`ckptvault ingest --run R --step S`), or to
several (`--step S1 --step S2`): what a framework hook asks for right after a save returns (ckptvault.hooks;
several when saves came faster than their ingests, and one pass takes them all).

The hook's word is a hint and never trusted alone: the step is judged by its format's commit rule
exactly as the scheduled pass judges it (discovery), so a step whose commit rule does not hold waits
and nothing of it is uploaded. What the hint does change is the settle time. `settle_seconds` exists
for writers whose finished state cannot be told from the files (a file still growing, a rank still
writing after the pointer moved); a format whose commit marker is written last, after every other
file of the save, proves the save finished by the marker itself. So with a step named and its
format in `COMMIT_MARKERS`, the settle time is skipped; every other format still waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ckptvault.config import SourceConfig
from ckptvault.errors import InvalidArgumentError
from ckptvault.ingest.discovery import DiscoveryResult, Found, _quiet_reason, discover
from ckptvault.ingest.nodes import node_path
from ckptvault.ingest.steps import Outcome

# The formats whose commit marker is written after every other file of the save, so its presence is
# the proof (each layout module's docstring cites the writer's code):
#   hf        trainer_state.json: Trainer._save_checkpoint writes it after weights, optimizer, RNG
#   dcp       .metadata: FileSystemWriter.finish renames it into place after every rank's write_data
#   megatron  latest_checkpointed_iteration.txt: rank 0 writes it after a barrier over every rank
#   nemo      the `-unfinished` sibling: deleted only after the save
#   orbax     commit_success.txt / the rename out of `.orbax-checkpoint-tmp`, both in finalize
# Not here: deepspeed (rank 0 writes `latest` with no barrier: other ranks may still be writing) and
# lightning (a bare .ckpt file with no marker; a copy across file systems grows under its final name).
COMMIT_MARKERS: dict[str, str] = {
    "hf": "trainer_state.json",
    "dcp": ".metadata",
    "megatron": "latest_checkpointed_iteration.txt naming the iteration",
    "nemo": "no -unfinished sibling",
    "orbax": "commit_success.txt",
}


# The marker files inside the checkpoint whose mtime is the commit's time (the RPO's start, events.verified):
# the others (megatron's tracker is in the run root and moves with every later save; nemo's marker is an
# absence; orbax's rename leaves no file) fall back to the newest mtime of the checkpoint.
MARKER_FILES: dict[str, str] = {"hf": "trainer_state.json", "dcp": ".metadata", "orbax": "commit_success.txt"}


def commit_time(found: Found) -> float:
    """When the checkpoint was committed: its commit marker's mtime where the format has a marker file
    in the checkpoint and it is there, else the newest mtime of its files (Found.newest_mtime)."""
    marker = MARKER_FILES.get(found.format)
    for f in found.files if marker else ():
        if f.rel == marker:
            return f.mtime
    return found.newest_mtime


def with_reported(found: Sequence[Found], named: Sequence[int], reported: dict[str, str]) -> list[Found]:
    """The named steps' checkpoints carrying what the process that saved them reported it ran (a hook's
    `written_by` words): the report is about the saves the hook named, never about the other steps a
    pass finds."""
    if not reported:
        return list(found)
    pairs = tuple(sorted(reported.items()))
    return [replace(f, reported_by=pairs) if f.step in named else f for f in found]


class UnknownRunError(InvalidArgumentError):
    """`--run` names no `[[sources]]` entry."""


def narrow_sources(sources: Sequence[SourceConfig], run: str | None) -> list[SourceConfig]:
    """The sources an ingest covers: every one, or only `run`'s. Raises UnknownRunError naming the
    configured runs when `run` is none of them."""
    if run is None:
        return list(sources)
    picked = [s for s in sources if s.run == run]
    if not picked:
        names = ", ".join(s.run for s in sources) or "none"
        raise UnknownRunError(
            f"run {run!r} is not in the config's [[sources]] (configured runs: {names}); "
            "name one of them, or add a [[sources]] entry for it"
        )
    return picked


def named_steps(step: int | None, steps: Sequence[int] | None) -> list[int]:
    """The steps an ingest is narrowed to: `step` (one, as the deployment's trigger passes it) and
    `steps` (several, as a hook's drained queue names them), each once, in order; none: every step."""
    return list(dict.fromkeys(([] if step is None else [step]) + list(steps or ())))


def skips_settle(fmt: str) -> bool:
    """A named step of this format needs no settle time: its commit marker is the proof."""
    return fmt in COMMIT_MARKERS


def pick_step(run: str, result: DiscoveryResult, step: int, settle_seconds: float, now: float) -> DiscoveryResult:
    """`result` (discovered with no settle time) cut down to `step`, with the settle time put back on
    it unless its format has a commit marker. A step that is not there at all is a problem line."""
    return pick_steps(run, result, [step], settle_seconds, now)


def pick_steps(
    run: str, result: DiscoveryResult, steps: Sequence[int], settle_seconds: float, now: float
) -> DiscoveryResult:
    """`pick_step` for several named steps of one run at once, from one discovery: each judged alone,
    in the order named (a step named twice once)."""
    problems = list(result.problems)
    picked: list[Found] = []
    for step in dict.fromkeys(steps):
        found = [f for f in result.found if f.step == step]
        if not found:
            problems.append(f"run {run!r}: no checkpoint of step {step} found; nothing uploaded, it waits")
            continue
        f = found[0]
        if f.ready and not skips_settle(f.format):
            reason = _quiet_reason(f.newest_mtime, settle_seconds, now)
            if reason:
                f = replace(f, ready=False, reason=reason)
        picked.append(f)
    return DiscoveryResult(picked, problems)


def find_step(source: SourceConfig, step: int, now: float) -> DiscoveryResult:
    """Discovery of one step of a source: its commit rule judged as always, its settle time skipped
    where the format's commit marker proves the save finished (`skips_settle`)."""
    return find_steps(source, [step], now)


def find_steps(source: SourceConfig, steps: Sequence[int], now: float) -> DiscoveryResult:
    """`find_step` for several steps of a source, with one listing of its run root."""
    path: Path = node_path(source.path) if source.locality == "node" else source.path
    # settle 0 here: the format is known only after detection ("auto"), so pick_steps puts it back
    result = discover(source.run, path, source.format, 0.0, now)
    return pick_steps(source.run, result, steps, source.settle_seconds, now)


# A named step that waits only for its settle time (a format with no commit marker, e.g. lightning) is
# waited for in the same command when the settle time ends within this long: else the hook's signal
# would be spent and the save left to the next scheduled pass. Longer settle times than this are the
# writers that need them (a copy across file systems): those are left to the schedule, as before.
SETTLE_WAIT_MAX_SECONDS = 120.0


def settle_left(result: DiscoveryResult, step: int, settle_seconds: float, now: float) -> float:
    """Seconds until `step` (discovered with no settle time) has settled, where its commit rule holds
    and its format needs the settle time; 0 where nothing is to wait for (absent, not ready by its commit
    rule, a marker format, settled already, or an mtime in the future: clock skew is not waited out)."""
    found = [f for f in result.found if f.step == step]
    if not found or not found[0].ready or skips_settle(found[0].format):
        return 0.0
    age = now - found[0].newest_mtime
    return settle_seconds - age if 0 <= age < settle_seconds else 0.0


def find_step_settled(
    source: SourceConfig,
    step: int,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> DiscoveryResult:
    """`find_step`, except that a step waiting only for its settle time is waited for when that ends
    within SETTLE_WAIT_MAX_SECONDS, and looked at again (a file that changed meanwhile starts the wait
    over, within the same bound from the first look)."""
    return find_steps_settled(source, [step], clock, sleep)


def find_steps_settled(
    source: SourceConfig,
    steps: Sequence[int],
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> DiscoveryResult:
    """`find_step_settled` for several steps of a source: one wait, until the last of the steps whose
    settle time ends within the bound has settled (the pass after it uploads them all together, so
    waiting for each in turn would not start any upload sooner), then one more look at them all."""
    path: Path = node_path(source.path) if source.locality == "node" else source.path
    deadline = clock() + SETTLE_WAIT_MAX_SECONDS
    while True:
        now = clock()
        result = discover(source.run, path, source.format, 0.0, now)
        lefts = [settle_left(result, step, source.settle_seconds, now) for step in steps]
        soon = [left for left in lefts if left > 0 and now + left <= deadline]
        if not soon:
            return pick_steps(source.run, result, steps, source.settle_seconds, now)
        sleep(max(soon) + 0.1)  # a tenth over: the mtime's age is then past settle_seconds, not equal to it


def waits(outcomes: Sequence[Outcome], run: str, step: int) -> str:
    """Why the requested step was not archived by this narrowed pass and waits (empty when it was
    uploaded, was already there, or ended otherwise: a failure or a rejection says so itself)."""
    mine = [o for o in outcomes if o.run == run and o.step == step]
    if not mine:
        return f"run {run!r} has no checkpoint of step {step} yet; nothing uploaded, it waits"
    if mine[0].result == "waiting":
        return f"run {run!r} step {step} waits, nothing uploaded: {mine[0].message}"
    return ""


def waits_all(outcomes: Sequence[Outcome], run: str, steps: Sequence[int]) -> list[str]:
    """`waits` for each named step, in the order named: why each one that waits does (none: every
    named step was archived, was there already, or ended in a way its outcome says itself)."""
    return [why for step in dict.fromkeys(steps) if (why := waits(outcomes, run, step))]
