"""What ingest does next with one discovered checkpoint: a pure function of what is known so far.

The ingest flow asks `decide` what to do, does only that (a HEAD, a manifest read, a validation, an
upload), adds what it learned to the `Seen` record and asks again, until the answer is final. Every
branch of the ingest decision lives here, reachable by a unit test without Prefect or a server:

    waiting              not finished by its format's rule, or written to within settle_seconds
    present              the newest save of its step is in the store and the local copy still matches
    load_manifest        the catalog cannot say whether the local copy matches: read the manifest
    check_commit         ask the store whether the target save's manifest exists (a crashed run's commit)
    record_committed     committed, but the catalog does not know: record it from the manifest
    validate             run the structural and statistical gates
    invalid              a gate blocked it: quarantine (record it once), do not upload
    upload               send it as save `save` (warned: with the gates' warnings), then commit
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ckptvault.catalog import CheckpointState
from ckptvault.catalog.saves import FileDiff
from ckptvault.checkpoint.manifest import FIRST_SAVE

Action = Literal[
    "waiting", "present", "load_manifest", "check_commit", "record_committed", "validate", "invalid", "upload"
]
FINAL: frozenset[str] = frozenset({"waiting", "present", "record_committed", "invalid", "upload"})


@dataclass(frozen=True)
class Seen:
    """Everything known about one discovered checkpoint at this point of the pass. `None` means
    "not asked yet"; the flow fills a field in when `decide` asks for it."""

    ready: bool
    reason: str = ""  # why it is not ready
    newest: CheckpointState | None = None  # the catalog's newest save of this step
    local_fingerprint: str = ""
    catalog_fingerprint: str | None = None  # the newest save's, when its verified event recorded one
    diff: FileDiff | None = None  # local against the newest committed save's manifest
    committed: bool | None = None  # the target save's manifest exists in the store
    problems: tuple[str, ...] | None = None  # gates that blocked; () when they passed
    warnings: tuple[str, ...] = ()

    def learn(self, **known: object) -> Seen:
        return replace(self, **known)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Decision:
    action: Action
    save: int = FIRST_SAVE  # the save this action is about (a new save when `supersedes` is set)
    message: str = ""
    supersedes: int | None = None  # the committed save a new save replaces
    changes: str = ""  # how the local copy differs from the save it replaces

    @property
    def final(self) -> bool:
        return self.action in FINAL


def _committed(s: CheckpointState | None) -> bool:
    """The newest save is (or was) in the store: verified, or expired by the policy since."""
    return s is not None and (s.verified or s.expired)


def present_without_nodes(newest: CheckpointState | None, why: str) -> Decision | None:
    """A node-local checkpoint that some node could not list (no worker, a listing timed out): its
    committed save stays present, with `why` named, so a job whose nodes are gone does not fail every
    pass for checkpoints already safe. None (the failure stands) when nothing of that step is committed."""
    if not _committed(newest):
        return None
    assert newest is not None
    return Decision("present", newest.save, f"{why}; the committed save {newest.save} holds (not checked again)")


def decide(seen: Seen) -> Decision:
    if not seen.ready:
        return Decision("waiting", message=seen.reason)
    newest = seen.newest
    if _committed(newest):
        assert newest is not None
        if newest.expired:
            # the retention policy deleted it from the store on purpose; the hot tier still has a copy
            return Decision("present", newest.save, "expired from the store by the retention policy")
        if newest.local_evicted:
            return Decision("present", newest.save, "local copy evicted after upload")
        if seen.diff is None:
            if seen.catalog_fingerprint is not None and seen.catalog_fingerprint == seen.local_fingerprint:
                return Decision("present", newest.save)
            return Decision("load_manifest", newest.save)
        if not seen.diff.is_new_save:
            note = "" if seen.diff.same else f"local copy incomplete ({seen.diff.describe()}); the committed save holds"
            return Decision("present", newest.save, note)
        return _toward_upload(seen, newest.save + 1, supersedes=newest.save, changes=seen.diff.describe())
    target = newest.save if newest is not None else FIRST_SAVE
    return _toward_upload(seen, target)


def _toward_upload(seen: Seen, save: int, supersedes: int | None = None, changes: str = "") -> Decision:
    def d(action: Action, message: str = "") -> Decision:
        return Decision(action, save, message, supersedes, changes)

    if seen.committed is None:
        return d("check_commit")
    if seen.committed:
        return d("record_committed", "manifest already in the store")
    accepted = seen.newest is not None and seen.newest.last_event == "accepted"
    if accepted:  # a person reviewed it: no gates
        return d("upload")
    if seen.problems is None:
        return d("validate")
    if seen.problems:
        return d("invalid", "; ".join(seen.problems))
    return d("upload", "; ".join(seen.warnings))


def records_rejection(seen: Seen) -> bool:
    """Quarantine is recorded once: not again on every pass while the checkpoint stays invalid."""
    return seen.newest is None or seen.newest.last_event != "invalid" or seen.newest.verified


def gates_wait_for_run(pending: Sequence[str | None], run: str) -> list[int]:
    """Which of the pass's checkpoints must be settled (committed and recorded, or failed) before the
    gates judge one of `run`: `pending[i]` is the run of checkpoint i if its uploads are still in
    flight, else None. The gates compare a checkpoint with its run's verified history and the newest
    verified checkpoint below it, which an upload of the same run still in flight may become; settling
    those first gives the gates what a one-checkpoint-at-a-time pass gave them. Other runs' uploads
    go on: a run's history is its own."""
    return [i for i, r in enumerate(pending) if r == run]
