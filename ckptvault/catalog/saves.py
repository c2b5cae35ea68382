"""Saves of one step, and restarts: which local checkpoint is a new save, and which saves a new one replaces.

A step can be saved more than once: a job that crashes after step 300 and restarts from step 200
writes step 300 again, with other weights. Each is its own save (docs/FORMAT.md, "Saves and
restarts"). Everything here is a pure function of what discovery saw and what the catalog and the
manifest say, so the rules are unit-tested without a server.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ckptvault.catalog.model import CheckpointState
from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.checkpoint.manifest import FileEntry

# mtimes that differ by less than this are the same: a manifest's float mtime has been through JSON
# and some file systems round to microseconds (as tiering's eviction check does).
MTIME_TOLERANCE = 1e-3


@dataclass(frozen=True)
class FileDiff:
    """How a local checkpoint differs from a committed save's manifest, file by file."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # size or mtime differs

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.changed)

    @property
    def is_new_save(self) -> bool:
        """Only a file that is new or rewritten makes a new save. Files that merely went missing, with
        the rest unchanged, are a local copy being evicted or cleaned up, not training writing again:
        uploading that would commit a partial checkpoint as the newest save."""
        return bool(self.added or self.changed)

    def describe(self, limit: int = 5) -> str:
        parts = []
        for label, names in (("changed", self.changed), ("added", self.added), ("removed", self.removed)):
            if names:
                shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
                parts.append(f"{len(names)} {label} ({shown})")
        return "; ".join(parts) or "no difference"


def diff_files(local: Iterable[LocalFile], committed: Iterable[FileEntry]) -> FileDiff:
    """Compare by path, size and mtime: what a stat can tell without reading a byte."""
    mine = {f.rel: (f.size, f.mtime) for f in local}
    theirs = {e.path: (e.size, e.mtime) for e in committed}
    changed = sorted(
        p
        for p in mine.keys() & theirs.keys()
        if mine[p][0] != theirs[p][0] or abs(mine[p][1] - theirs[p][1]) > MTIME_TOLERANCE
    )
    return FileDiff(
        added=tuple(sorted(mine.keys() - theirs.keys())),
        removed=tuple(sorted(theirs.keys() - mine.keys())),
        changed=tuple(changed),
    )


@dataclass(frozen=True)
class Supersede:
    """One save that a newly committed save replaces, and why."""

    state: CheckpointState
    reason: str
    by: tuple[int, int] = (0, 0)  # (step, save) of the save that replaced it


def superseded_by(
    run_states: Sequence[CheckpointState], step: int, save: int, created_at: float, changes: str = ""
) -> list[Supersede]:
    """The current saves of a run that a new commit of (step, save), written at `created_at`, replaces.

    The same step's older save is replaced by definition. A save of a later step that was written
    *before* the new one belongs to the branch the job abandoned when it restarted: its weights come
    from a history the run no longer has. Saves of earlier steps, and anything written after the new
    save (a later step of the new branch, committed out of order), are left alone.
    """
    out = []
    for s in run_states:
        if not s.verified or s.expired or s.superseded or (s.step, s.save) == (step, save) or s.step < step:
            continue
        written = s.created_at if s.created_at is not None else s.uploaded_at
        if written is None or written >= created_at:
            continue
        if s.step == step:
            why = f"step {step} was saved again as save {save}" + (f": {changes}" if changes else "")
        else:
            why = f"run restarted from before step {step} (saved again as save {save}): a save of the abandoned branch"
        out.append(Supersede(s, why, (step, save)))
    return sorted(out, key=lambda x: x.state.key)


def restart_point(run_states: Sequence[CheckpointState], step: int) -> int | None:
    """The step a restart resumed from, as far as the catalog can tell: the newest current save below
    `step` (None when there is none)."""
    below = [s.step for s in run_states if s.verified and not s.superseded and not s.expired and s.step < step]
    return max(below) if below else None


def replay_supersedes(states: Sequence[CheckpointState]) -> list[Supersede]:
    """The supersedes that committing these saves one by one, in the order they were written, would
    have recorded: what a catalog rebuilt from manifests alone must add to know which saves are current."""
    current: dict[tuple[str, int, int], CheckpointState] = {s.key: s for s in states if s.verified}
    out: list[Supersede] = []
    for s in sorted(current.values(), key=lambda s: (s.created_at or 0.0, s.step, s.save)):
        if s.created_at is None:
            continue
        seen = [c for c in current.values() if c.run == s.run]
        for x in superseded_by(seen, s.step, s.save, s.created_at):
            out.append(x)
            current[x.state.key] = replace(x.state, superseded=True, superseded_reason=x.reason)
    return out
