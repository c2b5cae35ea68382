"""Restore drills: prove that what sits in the store (archived or not) restores and loads.

Which checkpoints a drill restores (`select`) is a deterministic rotation in the spirit of restic's
`check --read-data-subset=n/t`, a pure function of the catalog states, so it works the same whether
drills run on schedule, late, twice, or by hand:

- Drillable: verified, not expired, not superseded. A superseded save belongs to a training branch the
  job abandoned (a later save of its step, or a restart from before it, replaced it): nothing resumes
  from it, so proving it restores proves nothing anyone needs.
- Every drill restores each run's newest drillable checkpoint (the one a crash reaches for) and every
  suspect one (its last drill failed; it stays out of `restore latest` until a drill passes, so it is
  re-drilled at once rather than waiting its turn). Both come *on top of* the sample.
- Then `sample` more from the rest, the queue: never drilled first (oldest upload first), then least
  recently drilled, ties by (run, step, save).

Guarantee: with M drillable checkpoints that are not their run's newest and a rotating share of s,
every drillable checkpoint is drilled at least once in every ceil(M/s) consecutive drills (1 when
M = 0), and each run's newest in every drill. Since M <= N - runs, that is within ceil(N/s) drills for
N drillable checkpoints, however many runs there are. Why: a drilled checkpoint goes to the back of
the queue; one not drilled keeps its place, so each drill that passes over it takes s of those ahead
of it, and at most M - 1 are. The bound is for a fixed set of checkpoints, counting the drills in
which every selected checkpoint finished: a thaw still pending when a drill ends keeps that checkpoint
at the front (the next drill completes it), and a checkpoint that arrives between drills without
being its run's newest joins the queue ahead of the drilled ones.

`[drill] cover_days` sizes s for time instead of drill count: with drills every `interval_days`,
s = max(sample, ceil(M / floor(cover_days / interval_days))), so ceil(M/s) drills fit in cover_days
(every drillable checkpoint each drill when cover_days is shorter than one interval).

Copies (docs/replicas.md, "Restore from a copy"): with `[[replicas]]`, each drilled save is restored from
one of its copies (`drill_copy`), the primary or a replica holding it (a `replicated` event), the one
least recently drilled for that save (never drilled first, then in the configuration's order), recorded
as `store` in the `drilled` event's detail. So a save with k copies drilled d times has each copy proven
within every k of its drills, and every copy of every save within k windows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptvault.catalog import CheckpointState, Event, events
from ckptvault.errors import AlreadyAlerted, InvalidArgumentError
from ckptvault.restore import loadcheck
from ckptvault.restore.copies import PRIMARY
from ckptvault.restore.environment import ROT, OtherResult, verdict
from ckptvault.restore.verify import VERIFY_ERROR, VerifyResult

DAY = 86400.0
Key = tuple[str, int, int]


def label(run: str, step: int, save: int) -> str:
    """How a checkpoint save is named to people: the save only when there is more than one."""
    return f"{run} step {step}" + (f" save {save}" if save > 1 else "")


@dataclass(frozen=True)
class DrillResult:
    run: str
    step: int
    save: int
    ok: bool
    seconds: float
    bytes: int
    problems: tuple[str, ...] = ()
    # What the load check proved per file and how (loadcheck.FileCheck.describe), including each load it
    # could not run on this worker. Empty for a checkpoint that did not restore.
    checks: tuple[str, ...] = ()
    not_run: tuple[str, ...] = ()  # the checks among those that could not run here (framework not installed)
    store: str = PRIMARY  # the copy it was restored from: "primary" or a replica's name
    # the resume check (ckptvault/restore/verify.py), run once the restore and the load checks passed; None:
    # none configured for the run, or the save did not get that far
    verify: VerifyResult | None = None
    was_suspect: bool = False  # the save's last drill before this one failed
    # the versions the checks above loaded with (ckptvault/restore/environment.py); empty: not recorded
    loaded_with: Mapping[str, str] = field(default_factory=dict)
    # `drill --python PATH`: the same checks with the other interpreter. `ok`, `problems` and `save_ok` stay
    # this environment's: what fails only there is format rot, never a verdict on the save
    other: OtherResult | None = None

    @property
    def key(self) -> Key:
        return (self.run, self.step, self.save)

    @property
    def verify_error(self) -> bool:
        """The resume check broke (not a verdict on the save): the drill fails, the save is not marked."""
        return self.verify is not None and self.verify.outcome == VERIFY_ERROR

    @property
    def passed(self) -> bool:
        """The drill passed for this save: here, and with the other interpreter where one was given."""
        return self.ok and (self.other is None or self.other.ok)

    @property
    def compared(self) -> str | None:
        """environment.verdict of the two environments (None without `--python`)."""
        return verdict(self.ok, self.other)

    @property
    def format_rot(self) -> bool:
        """It passes here and fails with the other interpreter: the upgrade would break it."""
        return self.compared == ROT

    @property
    def all_problems(self) -> tuple[str, ...]:
        """This environment's problems, then the other's, each of those naming its interpreter."""
        if self.other is None:
            return self.problems
        theirs = [*self.other.problems, *([self.other.error] if self.other.error else [])]
        return (*self.problems, *(f"with {self.other.python}: {p}" for p in theirs))

    @property
    def save_ok(self) -> bool:
        """What the `drilled` event records for the save (its `ok`: false makes it suspect): the drill's result,
        but after a verify_error what the restore and the load checks found (they passed, or the check would
        not have run), and a save already suspect stays so: a broken check neither marks nor clears it."""
        if self.verify_error:
            return not self.was_suspect
        return self.ok

    def alert(self) -> tuple[str, dict[str, Any]]:
        """The alert of a drill that did not pass, as (kind, fields) for alerts.build: the resume check that
        broke; format rot (it passed here and not with `--python`'s interpreter, or the check broke there:
        the save is not marked); else the save failed."""
        if self.verify_error:
            return "drill_verify_error", {"run": self.run, "step": self.step, "save": self.save,
                                          "problems": list(self.problems)}  # fmt: skip
        if self.ok and self.other is not None:
            return "drill_format_rot", {"run": self.run, "step": self.step, "save": self.save,
                                        "problems": list(self.all_problems), "python": self.other.python}  # fmt: skip
        return "drill_failed", {"run": self.run, "step": self.step, "problems": list(self.all_problems)}

    def row(self) -> dict[str, Any]:
        return {"run": self.run, "step": self.step, "save": self.save, "ok": self.passed,
                "seconds": round(self.seconds, 2), "problems": list(self.all_problems), "checks": list(self.checks),
                "not_run": list(self.not_run), "store": self.store,
                "verify": None if self.verify is None else self.verify.as_dict()} | self._environments()  # fmt: skip

    def _environments(self) -> dict[str, Any]:
        """`loaded_with` where recorded; with `--python`, the other environment and the comparison."""
        mine = {"loaded_with": dict(self.loaded_with)} if self.loaded_with else {}
        if self.other is None:
            return mine
        return mine | {"other": self.other.as_dict(), "compared": self.compared, "format_rot": self.format_rot}

    def event(self, flow_run: str = "") -> Event:
        """The catalog's `drilled` event of this result (its `ok` is `save_ok`)."""
        return events.drilled(self.run, self.step, self.save, self.save_ok, self.detail(), flow_run)

    def detail(self) -> str:
        mib_s = self.bytes / 2**20 / self.seconds if self.seconds > 0 else 0.0
        return json.dumps(
            {
                "seconds": round(self.seconds, 3),
                "bytes": self.bytes,
                "mib_per_s": round(mib_s, 1),
                "problems": list(self.problems),
                "checks": list(self.checks),
                "not_run": list(self.not_run),
                "store": self.store,
            }
            | ({"verify": self.verify.as_dict()} if self.verify is not None else {})
            | self._environments()
        )


def render_markdown(results: Sequence[DrillResult], pending: Sequence[str], coverage: Coverage | None = None) -> str:
    lines = ["| run | step | save | ok | seconds | GiB | problems |", "|---|---|---|---|---|---|---|"]
    lines += [
        f"| {r.run} | {r.step} | {r.save} | {_ok_cell(r)} | {r.seconds:.1f} | {r.bytes / 2**30:.2f} | "
        f"{'; '.join(r.all_problems)[:300]} |"
        for r in results
    ]
    not_run = [f"{label(r.run, r.step, r.save)}: {c}" for r in results for c in r.not_run]
    if not_run:
        lines.append(f"\nLoad checks this worker could not run (install the framework to run them): {len(not_run)}")
        lines += [f"- {c[:300]}" for c in not_run[:20]]
    lines += _verify_markdown(results)
    lines += _environments_markdown(results)
    if pending:
        lines.append(f"\nStill thawing (completed by the next drill): {', '.join(pending)}")
    if coverage is not None:
        lines.append(f"\n{coverage.describe()}")
    return "\n".join(lines)


def _ok_cell(r: DrillResult) -> str:
    if r.passed:
        return "yes"
    return "**FORMAT ROT**" if r.format_rot else "**NO**"


def _environments_markdown(results: Sequence[DrillResult]) -> list[str]:
    """With `--python`: what each environment loaded with and what the two say together."""
    lines: list[str] = []
    for r in results:
        if r.other is None:
            continue
        here = ", ".join(f"{k} {v}" for k, v in sorted(r.loaded_with.items()))
        there = ", ".join(f"{k} {v}" for k, v in sorted(r.other.loaded_with.items()))
        lines.append(f"\n**{label(r.run, r.step, r.save)}: {r.compared}**: here ({here}): "
                     f"{'passed' if r.ok else 'failed'}; {r.other.python} ({there}): "
                     f"{'passed' if r.other.ok else 'failed'}")  # fmt: skip
    return lines


def _verify_markdown(results: Sequence[DrillResult]) -> list[str]:
    """Each resume check's outcome, how it ended and its output's tails (bounded: verify.TAIL_BYTES each)."""
    lines: list[str] = []
    for r in results:
        v = r.verify
        if v is None:
            continue
        note = " (a broken check: the save is not marked suspect)" if v.outcome == VERIFY_ERROR else ""
        lines.append(f"\n**Resume check of {label(r.run, r.step, r.save)}: {v.outcome}**{note}: {v.why} "
                     f"({v.seconds:.1f} s)")  # fmt: skip
        for name, text in (("stdout", v.stdout_tail), ("stderr", v.stderr_tail)):
            if text.strip():  # a fence in the output must not end ours
                lines += [f"\n{name} (tail):", "```", text.replace("```", "` ` `"), "```"]
    return lines


def _detail_store(e: Event) -> str | None:
    """The copy a `drilled` event says it restored from; drills before copies read the primary."""
    try:
        d = json.loads(e.detail) if e.detail else {}
    except json.JSONDecodeError:
        return PRIMARY
    store = d.get("store", PRIMARY) if isinstance(d, dict) else PRIMARY
    return store if isinstance(store, str) else PRIMARY


def holders(s: CheckpointState, replicas: Sequence[str]) -> list[str]:
    """The copies of a save: the primary, then each of `replicas` (the configuration's order) that holds
    it as the catalog's fold recorded (`CheckpointState.replicas`, from its `replicated` events)."""
    named = {c.store for c in s.replicas}
    return [PRIMARY, *(r for r in replicas if r in named)]


def drill_copy(key: Key, candidates: Sequence[str], history: Iterable[Event]) -> str:
    """Which of `candidates` (a save's reachable copies, primary first) this drill restores `key` from:
    one never drilled, the first such in `candidates`' order, else the least recently drilled (ties by
    that order). Pure: the rotation is a function of the save's `drilled` events alone."""
    if not candidates:
        raise InvalidArgumentError(f"no copy of {label(*key)} to drill")
    last: dict[str, float] = {}
    for e in history:
        if e.event == "drilled" and (e.run, e.step, e.save) == key:
            store = _detail_store(e) or PRIMARY
            last[store] = max(last.get(store, e.at), e.at)
    order = {name: i for i, name in enumerate(candidates)}
    return min(candidates, key=lambda c: (c in last, last.get(c, 0.0), order[c]))


def is_drillable(s: CheckpointState) -> bool:
    return s.verified and not s.expired and not s.superseded


def newest_by_run(states: Iterable[CheckpointState]) -> dict[str, CheckpointState]:
    """Each run's newest drillable checkpoint, by (step, save)."""
    out: dict[str, CheckpointState] = {}
    for s in states:
        if is_drillable(s):
            cur = out.get(s.run)
            if cur is None or (s.step, s.save) > (cur.step, cur.save):
                out[s.run] = s
    return out


def _queue_order(s: CheckpointState) -> tuple[bool, float, str, int, int]:
    # Never drilled first, and among those the longest waiting (uploaded first); a drill always stamps a
    # time later than any upload or earlier drill, which is what sends a drilled checkpoint to the back.
    since = s.last_drill_at if s.last_drill_at is not None else (s.uploaded_at or 0.0)
    return (s.last_drill_at is not None, since, s.run, s.step, s.save)


def rotating_share(sample: int, rotating: int, cover_days: float | None, interval_days: float | None) -> int:
    """How many queued checkpoints each drill takes: `sample`, grown so that ceil(rotating / share) drills,
    one every `interval_days`, fit in `cover_days`."""
    if sample < 1:
        raise InvalidArgumentError(f"sample must be >= 1, got {sample}")
    if cover_days is None:
        return sample
    if interval_days is None or not interval_days > 0:
        raise InvalidArgumentError(f"cover_days needs the drill interval in days (> 0), got {interval_days!r}")
    drills = math.floor(cover_days / interval_days)
    if drills < 1:
        return max(sample, rotating)
    return max(sample, math.ceil(rotating / drills))


def _window(rotating: int, share: int) -> int:
    return max(1, math.ceil(rotating / share))


@dataclass(frozen=True)
class Selection:
    chosen: tuple[CheckpointState, ...]  # what this drill restores, sorted by key
    newest: frozenset[Key]  # each run's newest: drilled every time
    suspect: frozenset[Key]  # suspect and not a newest: drilled every time until a drill passes
    queued: tuple[Key, ...]  # the rotating share, in queue order
    drillable: int
    rotating: int  # M: drillable checkpoints that are not their run's newest
    sample: int  # s: the rotating share, after cover_days
    window: int  # every drillable checkpoint is drilled at least once in every `window` consecutive drills


def select(
    states: Sequence[CheckpointState],
    sample: int,
    *,
    cover_days: float | None = None,
    interval_days: float | None = None,
) -> Selection:
    """This drill's checkpoints: each run's newest, every suspect, then the `sample` (grown by
    `cover_days`) first in the queue. Deterministic, and independent of the order of `states`."""
    able = sorted((s for s in states if is_drillable(s)), key=lambda s: s.key)
    newest = {s.key for s in newest_by_run(able).values()}
    rotating = len(able) - len(newest)
    share = rotating_share(sample, rotating, cover_days, interval_days)
    suspect = {s.key for s in able if s.suspect and s.key not in newest}
    queue = sorted((s for s in able if s.key not in newest and s.key not in suspect), key=_queue_order)
    queued = [s.key for s in queue[:share]]
    picked = newest | suspect | set(queued)
    return Selection(
        chosen=tuple(s for s in able if s.key in picked),
        newest=frozenset(newest),
        suspect=frozenset(suspect),
        queued=tuple(queued),
        drillable=len(able),
        rotating=rotating,
        sample=share,
        window=_window(rotating, share),
    )


def one_save(states: Sequence[CheckpointState], run: str, step: int) -> Selection:
    """`drill --verify-only RUN --step N`: the newest verified, unexpired save of that step, alone (a
    superseded one too: a person trying a check out names the save they mean). InvalidArgumentError naming
    what there is when there is no such save."""
    of_run = [s for s in states if s.run == run]
    if not of_run:
        runs = sorted({s.run for s in states})
        raise InvalidArgumentError(f"no run {run!r} in the catalog (runs: {', '.join(runs) or 'none'}); "
                                   "`ckptvault ls` lists them")  # fmt: skip
    able = [s for s in of_run if s.step == step and s.verified and not s.expired]
    if not able:
        steps = sorted({s.step for s in of_run if s.verified and not s.expired})
        shown = ", ".join(str(x) for x in steps[-10:]) or "none"
        raise InvalidArgumentError(f"run {run!r} has no verified save of step {step} (its verified steps: "
                                   f"{shown}); `ckptvault ls --run {run}` lists them")  # fmt: skip
    chosen = max(able, key=lambda s: s.save)
    return Selection(chosen=(chosen,), newest=frozenset(), suspect=frozenset({chosen.key} if chosen.suspect else ()),
                     queued=(), drillable=1, rotating=0, sample=1, window=1)  # fmt: skip


@dataclass(frozen=True)
class Coverage:
    """How far the rotation has got, from the catalog states at `now`."""

    drillable: int
    never_drilled: int
    suspect: int  # drillable whose last drill failed
    oldest_drill_age_days: float | None  # the longest since a drilled checkpoint's last drill; None if none was
    sample: int
    window: int
    cover_days: float | None
    interval_days: float | None

    def as_dict(self) -> dict[str, Any]:
        age = self.oldest_drill_age_days
        return {
            "drillable": self.drillable,
            "never_drilled": self.never_drilled,
            "suspect": self.suspect,
            "oldest_drill_age_days": None if age is None else round(age, 2),
            "sample": self.sample,
            "window": self.window,
            "cover_days": self.cover_days,
            "interval_days": self.interval_days,
        }

    def describe(self) -> str:
        age = "none drilled yet" if self.oldest_drill_age_days is None else f"{self.oldest_drill_age_days:.1f} d"
        return (
            f"Coverage: {self.drillable} drillable, {self.never_drilled} never drilled, {self.suspect} suspect; "
            f"oldest last drill {age}; every checkpoint drilled within {self.window} drill(s) "
            f"of {self.sample} plus each run's newest"
        )


def coverage(
    states: Sequence[CheckpointState],
    now: float,
    sample: int,
    *,
    cover_days: float | None = None,
    interval_days: float | None = None,
) -> Coverage:
    able = [s for s in states if is_drillable(s)]
    rotating = len(able) - len(newest_by_run(able))
    share = rotating_share(sample, rotating, cover_days, interval_days)
    ages = [(now - s.last_drill_at) / DAY for s in able if s.last_drill_at is not None]
    return Coverage(
        drillable=len(able),
        never_drilled=sum(1 for s in able if s.last_drill_at is None),
        suspect=sum(1 for s in able if s.suspect),
        oldest_drill_age_days=max(ages) if ages else None,
        sample=share,
        window=_window(rotating, share),
        cover_days=cover_days,
        interval_days=interval_days,
    )


@dataclass(frozen=True)
class DrillReport:
    """What one drill reports: `as_dict` is the `ckptvault drill --json` document (docs/drills.md)."""

    drilled: tuple[DrillResult, ...]
    pending: tuple[Key, ...]  # (run, step, save) still thawing: the next drill selects them again
    coverage: Coverage  # after this drill's events: what the next drill starts from
    # drilled saves whose objects lost the Object Lock ckptvault set (ckptvault/objectlock/drift.py), with why
    lock_drift: tuple[tuple[Key, tuple[str, ...]], ...] = ()

    @property
    def failed(self) -> tuple[DrillResult, ...]:
        return tuple(r for r in self.drilled if not r.passed)

    def ledger_counts(self) -> dict[str, float]:
        """What the metrics' ledger counts of this drill (ckptvault/observe/ledger.py): the bytes of every save
        drilled, passed or not, and the seconds they took (for `ckptvault_drill_bytes_total` etc.)."""
        return {"drill_bytes": float(sum(r.bytes for r in self.drilled)),
                "drill_seconds": float(sum(r.seconds for r in self.drilled))}  # fmt: skip

    def ledger_gauges(self) -> dict[str, float]:
        """The gauges this drill sets in the ledger: `drill_verify_seconds`, the seconds its resume checks
        took, all saves together; none when no check ran (the last drill that ran one keeps its value)."""
        ran = [r.verify.seconds for r in self.drilled if r.verify is not None]
        return {"drill_verify_seconds": float(sum(ran))} if ran else {}

    def as_dict(self) -> dict[str, Any]:
        return {
            "drilled": [r.row() for r in self.drilled],
            "pending": [{"run": run, "step": step, "save": save} for run, step, save in self.pending],
            "coverage": self.coverage.as_dict(),
            "lock_drift": [
                {"run": run, "step": step, "save": save, "problems": list(why)}
                for (run, step, save), why in self.lock_drift
            ],
        }


class DrillFailed(AlreadyAlerted):
    """At least one drilled checkpoint did not restore intact or did not load."""

    def __init__(self, report: DrillReport) -> None:
        # the whole drill report, so `drill --json` prints it for a failed drill too
        self.report = report
        bad = report.failed
        lines = [f"{len(bad)} of {len(report.drilled)} drilled checkpoint(s) FAILED:"]
        lines += [f"  {r.run} step {r.step}" + (f" save {r.save}" if r.save != 1 else "") + f": {list(r.all_problems)}"
                  + (" (format rot: it passes in this environment; the save is not marked)" if r.format_rot else "")
                  for r in bad]  # fmt: skip
        super().__init__("\n".join(lines))


def load_report(ckpt_path: Path) -> loadcheck.LoadReport:
    """Every load check of the restored checkpoint (a directory or one file), per file, saying what was
    checked and how; nothing from the bucket is executed (ckptvault/restore/loadcheck.py)."""
    return loadcheck.check(ckpt_path)
