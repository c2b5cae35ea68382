"""Which save a restore brings back: `latest` or a step number, suspects and superseded saves, and
the error every restore step raises when it cannot go on."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ckptvault.catalog import CheckpointState
from ckptvault.errors import CkptvaultError


class RestoreError(CkptvaultError):
    """A restore that cannot go on; the message says what and how to fix it. Nothing was changed."""


@dataclass(frozen=True)
class Resolution:
    """Which save a restore brings back, and what the operator must be told about the choice."""

    run: str
    step: int
    save: int
    notes: tuple[str, ...] = ()  # e.g. the suspects `latest` skipped, and why

    @property
    def label(self) -> str:
        return f"{self.run} step {self.step}" + (f" save {self.save}" if self.save != 1 else "")


def _drill_failure(s: CheckpointState) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(s.last_drill_at)) if s.last_drill_at else "a drill"
    problems = ""
    try:
        d = json.loads(s.detail) if s.last_event == "drilled" and s.detail else {}
        problems = "; ".join(str(p) for p in d.get("problems", []))[:300] if isinstance(d, dict) else ""
    except json.JSONDecodeError:
        pass
    return f"its last drill failed ({when})" + (f": {problems}" if problems else "")


def _name(s: CheckpointState) -> str:
    return f"step {s.step}" + (f" save {s.save}" if s.save != 1 else "")


def parse_step(step: str) -> int | str:
    """`latest` or a step number; anything else is an error naming the valid forms."""
    if step == "latest":
        return step
    if not step.isdigit():
        raise RestoreError(f"--step {step!r} is neither a step number nor 'latest' (e.g. --step 300, --step latest).")
    return int(step)


def resolve(
    states: Sequence[CheckpointState], run: str, step: int | str, save: int | None = None, force: bool = False
) -> Resolution:
    """`latest` is the newest good save of the run: verified, not superseded, its last drill did not fail
    (the suspects it skips are named in the notes). A step number means that step's newest verified
    save, or `save` when given. A suspect needs `force`, and the error says why first."""
    mine = [s for s in states if s.run == run and s.verified]
    if not mine:
        known = [s for s in states if s.run == run]
        what = "has no verified checkpoint in the catalog" if known else "is not in the catalog"
        raise RestoreError(
            f"run {run!r} {what}. Check the run name with `ckptvault ls`, "
            "or rebuild the catalog with `ckptvault catalog rebuild --write`."
        )
    mine.sort(key=lambda s: (s.step, s.save))
    if step == "latest":
        if save is not None:
            raise RestoreError("--save names a save of one step: use it with --step N, not with --step latest.")
        good = [s for s in mine if s.good]
        if not good:
            shown = "; ".join(f"{_name(s)}: {s.state}" for s in mine[-5:])
            raise RestoreError(
                f"run {run!r} has no good checkpoint: every verified one is suspect or superseded ({shown}). "
                f"Restore one by name with --step N [--save K] --force after checking `ckptvault ls --run {run}`."
            )
        pick = good[-1]
        skipped = [s for s in mine if s.suspect and not s.superseded and (s.step, s.save) > (pick.step, pick.save)]
        skips = tuple(f"skipped {_name(s)}: suspect, {_drill_failure(s)}" for s in reversed(skipped))
        return Resolution(run, pick.step, pick.save, skips)
    n = int(step)
    of_step = [s for s in mine if s.step == n]
    if not of_step:
        shown = ", ".join(str(x) for x in sorted({s.step for s in mine})[-10:])
        raise RestoreError(f"run {run!r} has no verified checkpoint at step {n} (verified steps: {shown}).")
    if save is None:
        pick = of_step[-1]
    else:
        named = [s for s in of_step if s.save == save]
        if not named:
            saves = ", ".join(str(s.save) for s in of_step)
            raise RestoreError(f"{run} step {n} has no verified save {save} (verified saves: {saves}).")
        pick = named[0]
    notes: list[str] = []
    if pick.suspect:
        why = f"{run} {_name(pick)} is suspect: {_drill_failure(pick)}"
        if not force:
            raise RestoreError(
                f"{why}. Restoring it may bring back damaged data. Pass --force to restore it anyway, "
                f"or restore --step latest for the newest good checkpoint."
            )
        notes.append(f"{why}; restoring it anyway (--force)")
    if pick.superseded:
        notes.append(f"{run} {_name(pick)} is superseded: {pick.superseded_reason or 'a later save replaced it'}")
    return Resolution(run, pick.step, pick.save, tuple(notes))
