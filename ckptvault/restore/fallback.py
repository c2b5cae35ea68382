"""A restore into one directory that survives a copy failing mid-way (docs/replicas.md, "Restore from a
copy"): every file is fetched from the first copy `copies.choose` gave; each file that copy could not
give (an object missing, its bytes not the manifest's CRC32C, the store unreachable or failing after
the retries) is fetched again from the next copy, and so on. Every file is still checked against the
manifest's CRC32C whichever copy it came from, so the mix is the save, byte for byte.

As ckptvault/restore/downloads.py: every byte goes into a staging directory beside the destination,
which is renamed into place only when every file is verified; a file that failed is removed from the
staging directory before it is fetched again (a range fetch needs to create it afresh); on any failure
the staging directory is removed and the destination is untouched. Each call is run by the submitter.

A copy that fails with a store error after the retries (unreachable, a 5xx storm) is not asked again in
this restore while another copy can serve: its `Breaker` trips, and each of its files not yet fetched
fails at once, without a request, for the next copy to give (one shared object on the flow's threads;
on a Dask cluster each worker trips its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault.restore import ranged, tensors
from ckptvault.restore.copies import CopyStatus
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.restore.selection import TensorFile
from ckptvault.restore.steps import (
    discard,
    download_one,
    finalize,
    staged_path,
    staging_dir,
    write_marker,
    write_pointer,
)
from ckptvault.store import (
    ChecksumMismatchError,
    FetchedRange,
    NotFoundError,
    ObjectFrozenError,
    ObjectStore,
    ProgressFn,
    StoreError,
    TransientStoreError,
)
from ckptvault.transfer.progress import ProgressBar
from ckptvault.transfer.submitter import Pending, Submitter, settle


@dataclass(frozen=True)
class Fallback:
    """One file read from another copy than the first, and why."""

    path: str
    source: str  # the copy it came from
    because: str  # what went wrong on the copies before it

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "from": self.source, "because": self.because}

    def describe(self) -> str:
        return f"{self.path}: read from {self.source} ({self.because})"


@dataclass(frozen=True)
class CopiesRestore:
    pointer: str | None
    replaced: str | None  # where the destination's old contents were kept (--force)
    source: str  # the copy read first
    fallbacks: tuple[Fallback, ...]


class CopyFailing(StoreError):
    """The copy failed with a store error after the retries earlier in this restore: this file is not
    asked of it (not transient: no retry), the next copy gives it."""


class Breaker:
    """One copy's state in one restore: the first store error after the retries trips it. A plain
    class, not a dataclass: a task runner passes it to each call as it is (shared), never rebuilt."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.why = ""  # the first failure; "" while none (a str assignment is atomic across threads)

    def check(self) -> None:
        if self.why:
            raise CopyFailing(f"{self.name} failed earlier in this restore ({self.why}); not asked again")

    def trip(self, e: BaseException) -> None:
        if not self.why:
            self.why = str(e)[:200]


def download_guarded(
    breaker: Breaker | None, store: ObjectStore, plan: ObjectPlan, into: Path, manifest: Manifest,
    progress: ProgressFn | None = None,
) -> str:  # fmt: skip
    """`steps.download_one`, not tried once the copy's breaker has tripped, and tripping it on a store
    error that outlived the retries."""
    if breaker is not None:
        breaker.check()
    try:
        return download_one(store, plan, into, manifest, progress)
    except TransientStoreError as e:
        if breaker is not None:
            breaker.trip(e)
        raise


def fetch_range_guarded(
    breaker: Breaker | None, store: ObjectStore, plan: ObjectPlan, into: Path, manifest: Manifest, offset: int,
    length: int, progress: ProgressFn | None = None,
) -> FetchedRange:  # fmt: skip
    """`ranged.fetch_range`, guarded as `download_guarded` is."""
    if breaker is not None:
        breaker.check()
    try:
        return ranged.fetch_range(store, plan, into, manifest, offset, length, progress)
    except TransientStoreError as e:
        if breaker is not None:
            breaker.trip(e)
        raise


def fetch_ranges_guarded(
    breaker: Breaker | None, store: ObjectStore, plan: ObjectPlan, into: Path, manifest: Manifest,
    spans: TensorFile, progress: ProgressFn | None = None,
) -> str:  # fmt: skip
    """`tensors.fetch_ranges`, guarded as `download_guarded` is."""
    if breaker is not None:
        breaker.check()
    try:
        return tensors.fetch_ranges(store, plan, into, manifest, spans.ranges, progress, spans.blocks)
    except TransientStoreError as e:
        if breaker is not None:
            breaker.trip(e)
        raise


def why(e: BaseException, copy: str) -> str:
    """A failure of one file on one copy, in the words the fallback report uses."""
    if isinstance(e, ChecksumMismatchError):
        return f"crc32c mismatch on {copy}"
    if isinstance(e, NotFoundError):
        return f"missing on {copy}"
    if isinstance(e, ObjectFrozenError):
        return f"frozen on {copy} (needs a thaw)"
    if isinstance(e, TransientStoreError | CopyFailing):
        return f"{copy} failing or unreachable: {str(e)[:200]}"
    return f"{str(e)[:200]} on {copy}"


def forget(plan: ObjectPlan, into: Path, manifest: Manifest) -> str:
    """Remove what a failed fetch of this file left in the staging directory, before another copy's."""
    staged_path(into, plan, manifest).unlink(missing_ok=True)
    return plan.path


def restore_from_copies(
    submit: Submitter, ordered: Sequence[CopyStatus], target: Path, manifest: Manifest, bar: ProgressBar,
    threshold: int, force: bool, marker: tuple[str, str] | None = None,
    ranges: Mapping[str, TensorFile] | None = None,
) -> CopiesRestore:  # fmt: skip
    """Restore `manifest`'s save into `target` from `ordered` (copies.choose's order; each with its
    store and plans from copies.survey), falling back file by file. RestoreError, with every failure
    named and nothing changed at `target`, when some file could be read from no copy. `marker`: a file
    (name, content) written at the destination's root with the rest (a partial restore's). `ranges`:
    the files of which only these (offset, length) spans are written (a tensor-level selection's,
    restore/tensors.py), from whichever copy gives them."""
    staged = submit(staging_dir, target)
    try:
        with phase(timing.TRANSFER):  # every file's CRC32C checked as it arrives, fsynced before it is done
            fallbacks = _fetch_everything(submit, ordered, staged, manifest, bar, threshold, ranges or {})
        with phase(timing.FINALIZE):
            pointer = submit(write_pointer, staged, manifest)
            if marker is not None:
                submit(write_marker, staged, marker)
    except BaseException:
        submit(discard, staged)
        raise
    with phase(timing.FINALIZE):  # a failure here keeps the verified copy (finalize says where)
        moved = submit(finalize, staged, target, force)
    return CopiesRestore(pointer, str(moved) if moved else None, ordered[0].name, tuple(fallbacks))


def _fetch_everything(
    submit: Submitter, ordered: Sequence[CopyStatus], staged: Path, manifest: Manifest, bar: ProgressBar,
    threshold: int, ranges: Mapping[str, TensorFile],
) -> list[Fallback]:  # fmt: skip
    first = ordered[0]
    if first.store is None:
        raise RestoreError(f"{first.name} has no open store")  # survey never gives a usable copy without one
    failed: dict[str, str] = {path: f"{what} on {first.name}" for path, what in first.missing.items()}
    elsewhere = {p.path for alt in ordered[1:] for p in alt.plans}
    if nowhere := sorted(path for path in failed if path not in elsewhere):
        # fail before downloading anything: no copy has these objects at all
        raise RestoreError(
            f"{manifest.run} step {manifest.step}: {len(nowhere)} objects named by the manifest are missing or wrong "
            f"on every copy ({', '.join(s.name for s in ordered)}): "
            + ", ".join(f"{p} ({failed[p]})" for p in nowhere[:10])
        )
    # a breaker only where another copy can take over: the last copy is asked for every file, with retries
    breakers = [Breaker(s.name) if i < len(ordered) - 1 else None for i, s in enumerate(ordered)]
    got = fetch_all(submit, first.store, list(first.plans), staged, manifest, bar, threshold, breakers[0], ranges)
    said: dict[str, list[str]] = {}  # each copy's own error, for the error that ends a restore
    for path, e in got.items():
        failed[path] = why(e, first.name)
        said.setdefault(path, []).append(str(e))
    fallbacks: list[Fallback] = []
    for alt, breaker in zip(ordered[1:], breakers[1:], strict=True):
        if not failed or alt.store is None:
            continue
        plans = [p for p in alt.plans if p.path in failed]
        if not plans:
            continue
        # a file's staged path is the same whichever copy it comes from: clear what the failed fetch left
        errors = settle(submit.map([partial(forget, p, staged, manifest) for p in plans]))
        if errors:
            raise RestoreError("could not clear failed files for another copy:\n" + "\n".join(errors))
        again = fetch_all(submit, alt.store, plans, staged, manifest, bar, threshold, breaker, ranges)
        for p in plans:
            if p.path in again:
                failed[p.path] += f"; {why(again[p.path], alt.name)}"
                said.setdefault(p.path, []).append(str(again[p.path]))
            else:
                fallbacks.append(Fallback(p.path, alt.name, failed.pop(p.path)))
    if failed:
        lines = [
            f"{path}: {what}" + (f" ({'; '.join(said[path])})" if path in said else "")
            for path, what in sorted(failed.items())
        ]
        raise RestoreError(
            f"{len(failed)} of {len(manifest.files)} files could be read from no copy "
            f"({', '.join(s.name for s in ordered)}); nothing was changed:\n" + "\n".join(lines[:20])
        )
    return fallbacks


def fetch_all(
    submit: Submitter, store: ObjectStore, plans: list[ObjectPlan], staged: Path, manifest: Manifest,
    bar: ProgressBar, threshold: int, breaker: Breaker | None = None,
    ranges: Mapping[str, TensorFile] | None = None,
) -> dict[str, BaseException]:  # fmt: skip
    """Every file of `plans` from `store` into `staged` (a big one as ranges, as
    restore/downloads.download_all fetches it), each checked; returns the files that failed, by path,
    with the first error each gave. Each phase waits for the last. A file in `ranges` gets only those
    spans (restore/tensors.fetch_ranges), one call per file."""
    failed: dict[str, BaseException] = {}
    ranges = ranges or {}
    picked = [p for p in plans if p.path in ranges]
    picked_f: list[Pending[str]] = (
        submit.map([partial(fetch_ranges_guarded, breaker, store, p, staged, manifest, ranges[p.path], bar)
                    for p in picked])
        if picked
        else []
    )  # fmt: skip
    plans = [p for p in plans if p.path not in ranges]
    cut = ranged.split_plans(plans, threshold, store.transfer.part_size)
    split = list(cut.split)
    if split:
        made = submit.map([partial(ranged.allocate, plan, staged, manifest) for plan in split])
        for plan, m in zip(split, made, strict=True):
            _note(failed, plan.path, m)
    ok_split = [p for p in split if p.path not in failed]
    pieces = [x for x in cut.pieces if x.plan.path not in failed]
    ranges_f: list[Pending[FetchedRange]] = submit.map(
        [partial(fetch_range_guarded, breaker, store, x.plan, staged, manifest, x.offset, x.length, bar)
         for x in pieces]
    ) if pieces else []  # fmt: skip
    whole_f: list[Pending[str]] = (
        submit.map([partial(download_guarded, breaker, store, plan, staged, manifest, bar) for plan in cut.whole])
        if cut.whole
        else []
    )
    got: list[FetchedRange] = []
    for piece, r in zip(pieces, ranges_f, strict=True):
        out = r.result(raise_on_failure=False)
        if isinstance(out, BaseException):
            failed.setdefault(piece.plan.path, out)
        else:
            got.append(out)
    for plan, w in zip(cut.whole, whole_f, strict=True):
        _note(failed, plan.path, w)
    for plan, w in zip(picked, picked_f, strict=True):
        _note(failed, plan.path, w)
    to_seal = [p for p in ok_split if p.path not in failed]
    if to_seal:
        keys = {p.key for p in to_seal}
        fetched = ranged.by_file(to_seal, [g for g in got if g.key in keys])
        sealed = submit.map(
            [partial(ranged.seal, p, staged, manifest, f) for p, f in zip(to_seal, fetched, strict=True)]
        )
        for plan, s in zip(to_seal, sealed, strict=True):
            _note(failed, plan.path, s)
    return failed


def _note(failed: dict[str, BaseException], path: str, pending: Pending[object]) -> None:
    out = pending.result(raise_on_failure=False)
    if isinstance(out, BaseException):
        failed.setdefault(path, out)
