"""Restore: bring back run R at step S (or `latest`) to a directory the framework resumes from.

Steps, each one call a task wraps: resolve the step; load its manifest (the commit marker: no
manifest, no restore); estimate bytes, classes, time and cost; warm up archived objects
(RestoreObject) as its own step; check which are still frozen; download every file into a temporary
directory beside the destination with every CRC32C checked; write the format's pointer file; rename
into place. Nothing at the destination is touched until every byte is verified.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ckptvault import humanize
from ckptvault.catalog import CheckpointState, Event
from ckptvault.errors import CkptvaultError
from ckptvault.formats import get_layout
from ckptvault.manifest import MANIFEST_NAME, Manifest, ManifestError, checkpoint_prefix, safe_relpath
from ckptvault.store import ObjectStore, ProgressFn
from ckptvault.tiering.cost import PriceTable

# Permission bits only: set-uid/set-gid from a bucket are never restored.
PERMISSION_BITS = 0o1777
ARCHIVAL = frozenset({"GLACIER", "DEEP_ARCHIVE"})  # must be thawed before a GET; GLACIER_IR need not
_ONGOING = re.compile(r'ongoing-request\s*=\s*"(true|false)"')


class RestoreError(CkptvaultError):
    """A restore that cannot go on; the message says what and how to fix it. Nothing was changed."""


@dataclass(frozen=True)
class ObjectPlan:
    key: str
    path: str  # relative path in the checkpoint
    size: int
    crc32c: str
    mtime: float  # set on the restored file, as training wrote it
    storage_class: str
    thawed: bool  # readable now (not archival, or archival with a completed restore)
    mode: int | None = None  # permission bits to restore; None in manifests older than the field
    # docs/FORMAT.md "Compressed files": the object is these frames (empty: the file as it is)
    frames: tuple[tuple[int, int, int, str], ...] = ()
    stored_size: int | None = None  # the object's size; None: `size`

    @property
    def stored_bytes(self) -> int:
        """What the GETs move and the storage class bills: the object, not the file it decodes to."""
        return self.size if self.stored_size is None else self.stored_size


@dataclass(frozen=True)
class Estimate:
    run: str
    step: int
    bytes: int
    objects: int
    by_class: dict[str, tuple[int, int]]  # class -> (objects, bytes)
    frozen: int  # objects that need RestoreObject before download
    tier: str
    usd: float
    seconds_min: float
    seconds_max: float
    objects_plan: tuple[ObjectPlan, ...] = field(repr=False, default=())
    egress: str = "in-region"
    egress_usd: float = 0.0
    throughput_mib_s: float | None = None  # this run's last measured restore or drill; None: never measured

    @property
    def download_seconds(self) -> float | None:
        if not self.throughput_mib_s:
            return None
        return self.bytes / 2**20 / self.throughput_mib_s

    @property
    def total_usd(self) -> float:
        return self.usd + self.egress_usd

    def report(self) -> str:
        """What an operator reads before the restore starts: one line per question they have."""
        lines = [f"restore {self.run} step {self.step}: {self.bytes / 2**30:.2f} GiB in {self.objects} objects"]
        for c, (n, b) in sorted(self.by_class.items()):
            lines.append(f"  {c:<14} {n:>6} objects  {b / 2**30:10.2f} GiB")
        if self.frozen:
            lines.append(
                f"  thaw: {self.frozen} archived objects with the {self.tier} tier, "
                f"expected {humanize.duration(self.seconds_min)} to {humanize.duration(self.seconds_max)}"
            )
        else:
            lines.append("  thaw: none needed")
        if self.download_seconds is not None and self.throughput_mib_s:
            lines.append(
                f"  download: about {humanize.duration(self.download_seconds)} "
                f"(at {self.throughput_mib_s:.0f} MiB/s, this run's last measured restore)"
            )
        else:
            lines.append("  download: no restore of this run measured yet")
        lines.append(
            f"  cost: ${self.usd:.2f} retrieval and requests + ${self.egress_usd:.2f} egress ({self.egress}) "
            f"= ${self.total_usd:.2f}"
        )
        return "\n".join(lines)

    def as_record(self) -> dict[str, object]:
        """The estimate as `restore --json` reports it (README, Restore at 3 a.m.)."""
        return {
            "bytes": self.bytes,
            "objects": self.objects,
            "by_class": {c: {"objects": n, "bytes": b} for c, (n, b) in sorted(self.by_class.items())},
            "frozen_objects": self.frozen,
            "thaw_tier": self.tier,
            "thaw_seconds": [self.seconds_min, self.seconds_max] if self.frozen else None,
            "retrieval_usd": round(self.usd, 6),
            "egress": self.egress,
            "egress_usd": round(self.egress_usd, 6),
            "throughput_mib_s": self.throughput_mib_s,
            "download_seconds": self.download_seconds,
        }

    def describe(self) -> str:
        classes = ", ".join(f"{c}: {n} objects / {b / 2**30:.2f} GiB" for c, (n, b) in sorted(self.by_class.items()))
        wait = (
            "no thaw needed"
            if self.frozen == 0
            else f"{self.frozen} archived objects to thaw with the {self.tier} tier: "
            f"{humanize.duration(self.seconds_min)} to {humanize.duration(self.seconds_max)}"
        )
        return (
            f"restore {self.run} step {self.step}: {self.bytes / 2**30:.2f} GiB in {self.objects} objects ({classes}); "
            f"{wait}; estimated retrieval cost ${self.usd:.2f}"
        )


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


def load_manifest(store: ObjectStore, prefix: str, run: str, step: int, save: int = 1) -> Manifest:
    key = checkpoint_prefix(prefix, run, step, save) + MANIFEST_NAME
    try:
        return Manifest.from_json(store.get_bytes(key), key)
    except ManifestError as e:
        raise RestoreError(
            f"{e}. The checkpoint cannot be restored safely; run `ckptvault drill` to inspect it."
        ) from None


def _is_thawed(storage_class: str, restore_header: str | None) -> bool:
    if storage_class not in ARCHIVAL:
        return True
    if not restore_header:
        return False
    m = _ONGOING.search(restore_header)
    return bool(m and m.group(1) == "false")


def plan_objects(store: ObjectStore, prefix: str, manifest: Manifest) -> list[ObjectPlan]:
    """One LIST for every object's size and class (a checkpoint can hold thousands of files), then a
    HEAD only for archived objects, the one thing a listing cannot say: whether they are thawed."""
    base = checkpoint_prefix(prefix, manifest.run, manifest.step, manifest.save)
    listed = {info.key: info for info in store.list(base)}
    plans, missing = [], []
    for f in manifest.files:
        rel = safe_relpath(f.path)
        info = listed.get(base + rel)
        if info is not None and info.storage_class in ARCHIVAL:
            info = store.head(base + rel)
        if info is None:
            missing.append(rel)
            continue
        if info.size != f.stored_bytes:
            missing.append(f"{rel} (size {info.size} in the store, {f.stored_bytes} in the manifest)")
            continue
        plans.append(
            ObjectPlan(
                base + rel,
                rel,
                f.size,
                f.crc32c,
                f.mtime,
                info.storage_class,
                _is_thawed(info.storage_class, info.restore),
                f.mode,
                f.frames,
                f.stored_size if f.frames else None,
            )
        )
    if missing:
        raise RestoreError(
            f"{manifest.run} step {manifest.step}: {len(missing)} objects named by the manifest are missing or wrong: "
            + ", ".join(missing[:10])
        )
    return plans


def estimate(
    manifest: Manifest,
    plans: Sequence[ObjectPlan],
    prices: PriceTable,
    tier: str,
    egress: str = "in-region",
    throughput_mib_s: float | None = None,
) -> Estimate:
    by_class: dict[str, tuple[int, int]] = {}
    for p in plans:
        n, b = by_class.get(p.storage_class, (0, 0))
        by_class[p.storage_class] = (n + 1, b + p.stored_bytes)
    frozen_by_class: dict[str, tuple[int, int]] = {}
    for p in plans:
        if not p.thawed:
            n, b = frozen_by_class.get(p.storage_class, (0, 0))
            frozen_by_class[p.storage_class] = (n + 1, b + p.stored_bytes)
    usd, smin, smax = prices.restore_estimate(by_class, tier)
    if not frozen_by_class:
        smin = smax = 0.0
    return Estimate(
        run=manifest.run,
        step=manifest.step,
        bytes=manifest.total_bytes,
        objects=len(plans),
        by_class=by_class,
        frozen=sum(n for n, _ in frozen_by_class.values()),
        tier=tier,
        usd=usd,
        seconds_min=smin,
        seconds_max=smax,
        objects_plan=tuple(plans),
        egress=egress,
        egress_usd=prices.egress(sum(p.stored_bytes for p in plans), egress),
        throughput_mib_s=throughput_mib_s,
    )


# Transfers smaller than this measure the fixed cost of a restore, not its throughput.
_MIN_MEASURED_BYTES = 64 * 2**20


def restore_throughput(events: Sequence[Event]) -> float | None:
    """MiB/s of the newest restore or passing drill of at least 64 MiB among `events` (None: none yet)."""
    for e in sorted(events, key=lambda e: e.at, reverse=True):
        if e.event not in ("restored", "drilled") or e.ok is False:
            continue
        try:
            d = json.loads(e.detail) if e.detail else {}
        except json.JSONDecodeError:
            continue
        if not isinstance(d, dict):
            continue
        rate, nbytes = d.get("mib_per_s"), d.get("bytes", e.bytes)
        if isinstance(rate, int | float) and rate > 0 and isinstance(nbytes, int) and nbytes >= _MIN_MEASURED_BYTES:
            return float(rate)
    return None


def request_thaw(store: ObjectStore, plans: Sequence[ObjectPlan], tier: str, days: int = 3) -> dict[str, int]:
    """Warm-up as its own step: RestoreObject for every frozen object. Idempotent: an object already
    thawing or thawed is counted, not an error."""
    counts: dict[str, int] = {}
    for p in plans:
        if p.thawed:
            continue
        status = store.restore_object(p.key, days, tier)
        counts[status] = counts.get(status, 0) + 1
    return counts


def still_frozen(store: ObjectStore, plans: Sequence[ObjectPlan]) -> list[ObjectPlan]:
    """HEAD the objects not yet readable; returns those still frozen."""
    out = []
    for p in plans:
        if p.thawed:
            continue
        info = store.head(p.key)
        if info is None or not _is_thawed(info.storage_class, info.restore):
            out.append(p)
    return out


def wait_for_thaw(
    store: ObjectStore,
    plans: Sequence[ObjectPlan],
    deadline_s: float,
    first_delay: float = 5.0,
    max_delay: float = 900.0,
) -> list[ObjectPlan]:
    """Poll with exponential backoff until nothing is frozen or the deadline passes; returns what is
    still frozen (empty when done)."""
    end = time.monotonic() + deadline_s
    delay = first_delay
    frozen = still_frozen(store, plans)
    while frozen and time.monotonic() + delay <= end:
        time.sleep(delay)
        delay = min(delay * 2, max_delay)
        frozen = still_frozen(store, frozen)
    return frozen


def check_destination(dest: Path, force: bool) -> None:
    if dest.exists() and not dest.is_dir():
        raise RestoreError(f"destination {dest} exists and is not a directory. Choose another --dest.")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise RestoreError(
            f"destination {dest} is not empty. Choose an empty or new directory, or pass --force "
            "(the existing directory is then kept, renamed aside, never deleted)."
        )


def staging_dir(dest: Path) -> Path:
    """A temporary directory beside the destination: same file system, so the final rename is atomic."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.ckptvault-partial-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def checkpoint_name(manifest: Manifest) -> str:
    """The checkpoint's own directory (or file) name on the hot tier, which frameworks look for."""
    name = Path(manifest.source).name if manifest.source else ""
    return name if name not in ("", ".", "..") else f"step-{manifest.step}"


def download_one(
    store: ObjectStore, plan: ObjectPlan, into: Path, manifest: Manifest, progress: ProgressFn | None = None
) -> str:
    """Fetch one object into the staging directory, CRC32C checked by the adapter (a compressed one
    decoded there, every frame checked): what lands in `into` is always the original bytes."""
    target = into / plan.path if manifest.single_file else into / checkpoint_name(manifest) / plan.path
    target.parent.mkdir(parents=True, exist_ok=True)
    # `frames` only when there are some: a store adapter that predates frames still serves raw objects
    coded = {"frames": plan.frames} if plan.frames else {}
    store.download_file(plan.key, target, size=plan.size, crc32c=plan.crc32c, progress=progress, **coded)
    if plan.mode is not None:
        os.chmod(target, plan.mode & PERMISSION_BITS)
    os.utime(target, (time.time(), plan.mtime))
    return plan.path


def write_pointer(staged: Path, manifest: Manifest) -> str | None:
    """Recreate `latest` / `latest_checkpointed_iteration.txt` so the framework resumes from here."""
    pointer = get_layout(manifest.format).pointer_file(manifest.step, checkpoint_name(manifest))
    if pointer is None:
        return None
    name, content = pointer
    (staged / name).write_text(content)
    return name


def finalize(staged: Path, dest: Path, force: bool) -> Path | None:
    """Rename the verified staging directory into place. With --force an existing destination is
    renamed aside (returned) rather than deleted: a restore never destroys data."""
    aside = None
    if dest.exists():
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
        elif force:
            aside = dest.with_name(f"{dest.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            dest.rename(aside)
        else:
            raise RestoreError(f"destination {dest} appeared while restoring; the restored copy is kept at {staged}")
    staged.rename(dest)
    return aside


def discard(staged: Path) -> None:
    """Remove a staging directory after a failed restore: it holds only our partial copy."""
    if staged.name.startswith(".") and ".ckptvault-partial-" in staged.name:
        shutil.rmtree(staged, ignore_errors=True)
