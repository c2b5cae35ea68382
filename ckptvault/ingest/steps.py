"""Ingest, one step at a time: each function here is one call a Prefect task wraps.

The commit protocol (docs/FORMAT.md): data objects first, each verified by the store adapter; the
manifest last, with If-None-Match: * where the server honours it. A checkpoint save whose manifest
exists is done; a rerun after a crash re-lists the save's prefix and uploads only the files that are
missing or differ. What to do with each discovered checkpoint is decided in `ingest_decision`.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ckptvault import __version__
from ckptvault.catalog import Catalog, CheckpointState, newest_saves
from ckptvault.checkpoint import written_by as reported
from ckptvault.checkpoint.blocks import sidecar_of
from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.checkpoint.manifest import (
    BLOCKS_NAME,
    FIRST_SAVE,
    MANIFEST_NAME,
    VALIDATION_NAME,
    FileEntry,
    Manifest,
    NodePlacement,
    SaveLock,
    checkpoint_prefix,
    fingerprint,
)
from ckptvault.checksum import file_crc32c_blocks
from ckptvault.config import Compression, SourceConfig, ValidationRules
from ckptvault.errors import AlreadyAlerted
from ckptvault.formats import read_metrics, read_written_by
from ckptvault.ingest.discovery import DiscoveryResult, Found, discover
from ckptvault.ingest.gates import GateSubject, ValidationReport
from ckptvault.ingest.nodes import node_path
from ckptvault.ingest.structure import check_structure
from ckptvault.objectlock.save_lock import to_extend
from ckptvault.store import (
    ObjectInfo,
    ObjectStore,
    PreconditionFailedError,
    ProgressFn,
    Retention,
    SentPart,
    SplitUpload,
)
from ckptvault.store.stored_crc import stored_crc32c

# Incomplete multipart uploads under a checkpoint we are about to (re)send, started longer ago than
# this, are leftovers of a crashed ingest: plan_upload aborts them instead of paying for their parts
# until the bucket's abort-incomplete-MPU rule (1 day) runs. Six hours is far longer than any one
# file takes to upload (a 500 GB file at 50 MB/s: under 3 h), so a live upload of a concurrent ingest
# is never aborted, and it is well clear of clock skew between us and the server.
STALE_UPLOAD_SECONDS = 6 * 3600
# Files smaller than this are stored as they are even with compression on: they cost nothing to keep,
# a compressed object is always a multipart upload (three requests), and a config.json or a tracker
# file stays readable by any S3 tool.
MIN_COMPRESS_SIZE = 1024 * 1024


@dataclass(frozen=True)
class FileJob:
    """One local file and where it goes; `upload` False when the store already holds the same bytes."""

    file: LocalFile
    key: str
    upload: bool
    known_crc32c: str | None = None  # when skipped: the CRC32C already verified for the stored object
    # (size, CRC32C of its bytes) of an object already there that may be this file compressed by a
    # crashed ingest: upload_one encodes the file again and keeps the object if they match
    stored: tuple[int, str] | None = None
    # a node-local file the flow cannot read: the stored object's CRC32C, compared with the file's by
    # the worker on its node, which then keeps the object instead of sending it again
    check_crc32c: str | None = None
    # when skipped: the file's block CRC32Cs from the local read that matched `known_crc32c` (the sidecar's)
    known_blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class SentRange:
    """What one range task of a split upload sent: its parts, and the file's permission bits (read by
    the first range, on the host that has the file, for the manifest)."""

    parts: tuple[SentPart, ...]
    mode: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What happened to one checkpoint in one ingest pass (a row of the flow's table artifact)."""

    run: str
    step: int
    format: str
    result: str  # "uploaded" | "warned" (uploaded, with gate warnings) | "present" | "invalid" | "failed" | "waiting"
    bytes: int = 0
    files: int = 0
    uploaded_files: int = 0
    seconds: float = 0.0
    message: str = ""
    save: int = FIRST_SAVE
    error: str = ""  # a failed one's error class (the exception's type name), for the metrics' ledger

    @property
    def ok(self) -> bool:
        return self.result in ("uploaded", "warned", "present", "waiting")

    def with_result(self, result: str, message: str = "", seconds: float = 0.0) -> Outcome:
        return replace(self, result=result, message=message, seconds=seconds)

    def with_uploaded(self, files: int) -> Outcome:
        return replace(self, uploaded_files=files)

    def with_save(self, save: int) -> Outcome:
        return replace(self, save=save)


def ledger_counts(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """What the metrics' ledger counts of an ingest pass (ckptvault/observe/ledger.py): each checkpoint whose
    upload failed, by its error class. (Its bytes are the catalog's: `verified` events carry them.)"""
    out: dict[str, float] = {}
    for o in outcomes:
        if o.result == "failed":
            key = f"upload_failures|{o.error or 'Unknown'}"
            out[key] = out.get(key, 0.0) + 1.0
    return out


class IngestIncomplete(AlreadyAlerted):
    """Some finished checkpoint ended neither uploaded nor already present."""

    def __init__(self, outcomes: Sequence[Outcome]) -> None:
        self.outcomes = list(outcomes)
        bad = [o for o in self.outcomes if not o.ok]
        lines = [f"{len(bad)} checkpoint(s) not uploaded:"]
        lines += [f"  {o.run} step {o.step} ({o.format}): {o.result}: {o.message}" for o in bad]
        super().__init__("\n".join(lines))


def find_checkpoints(source: SourceConfig, now: float | None = None) -> DiscoveryResult:
    """Every checkpoint-shaped entry under the source's run root, with readiness judged."""
    path = node_path(source.path) if source.locality == "node" else source.path
    return discover(source.run, path, source.format, source.settle_seconds, time.time() if now is None else now)


def known_states(catalog: Catalog, run: str) -> dict[int, CheckpointState]:
    """The newest save of each step of the run: what a step means to ingest and to the gates."""
    return {step: s for (_, step), s in newest_saves(catalog.current(run)).items()}


def local_fingerprint(found: Found) -> str:
    """The (path, size, mtime) digest of the local checkpoint, comparable with `Manifest.fingerprint`."""
    return fingerprint((f.rel, f.size, f.mtime) for f in found.files)


def is_committed(store: ObjectStore, prefix: str, found: Found, save: int = FIRST_SAVE) -> bool:
    """O(1): one HEAD of the save's manifest, the commit marker."""
    return store.head(checkpoint_prefix(prefix, found.run, found.step, save) + MANIFEST_NAME) is not None


def validate_structure(found: Found) -> list[str]:
    """Every structural problem of the checkpoint, each naming the file (empty when sound)."""
    return check_structure(found.format, found.path, found.files)


def previous_verified(known: dict[int, CheckpointState], step: int) -> CheckpointState | None:
    """The run's newest current (verified, not superseded) checkpoint below `step`: the baseline a new
    one is compared with."""
    below = [s for n, s in known.items() if n < step and s.verified and not s.superseded]
    return max(below, key=lambda s: s.step) if below else None


def quality_gate(
    found: Found, known: dict[int, CheckpointState], previous: Manifest | None, rules: ValidationRules
) -> ValidationReport:
    """The statistical gates over the run's own history (Great Expectations is imported only here)."""
    from ckptvault.ingest.quality import validate_candidate

    candidate = GateSubject.from_found(found, read_metrics(found.format, found.path))
    return validate_candidate(candidate, list(known.values()), previous, rules)


def write_blocks(
    store: ObjectStore, prefix: str, found: Found, entries: Sequence[FileEntry], save: int = FIRST_SAVE
) -> str | None:
    """`_BLOCKS.json` (docs/FORMAT.md, "Block checksums") from the block CRCs the uploads computed,
    written after every data object is verified and before the manifest, with the store's retention (a
    locked save's); None, nothing written, when no file has blocks. A rerun's identical sidecar is its
    own (the conditional write takes it); a different one a killed pass left is replaced."""
    data = sidecar_of(entries)
    if data is None:
        return None
    key = checkpoint_prefix(prefix, found.run, found.step, save) + BLOCKS_NAME
    try:
        store.put_bytes(key, data, if_none_match=True, content_type="application/json")
    except PreconditionFailedError:
        store.put_bytes(key, data, content_type="application/json")
    if store.retention is not None:  # a killed pass's identical sidecar, locked with that pass's earlier date
        store.extend_retention(key, store.retention)
    return key


def write_validation(
    store: ObjectStore, prefix: str, found: Found, report: ValidationReport, save: int = FIRST_SAVE
) -> str:
    """`_VALIDATION.json` beside where the manifest goes; it never makes a checkpoint exist."""
    key = checkpoint_prefix(prefix, found.run, found.step, save) + VALIDATION_NAME
    store.put_bytes(key, report.to_json(), content_type="application/json")
    return key


def plan_upload(
    store: ObjectStore, prefix: str, found: Found, save: int = FIRST_SAVE, read_local: bool = True
) -> list[FileJob]:
    """One LIST of the checkpoint's prefix decides what a rerun must (re)send.

    An object of the right size whose stored CRC32C equals the local file's is kept: that costs one
    local read pass instead of an upload. An object smaller than the file, with a known CRC32C, may
    be its compressed encoding: the job carries its size and CRC32C for upload_one to check. Anything
    else (absent, other size, unknown or different CRC32C) is uploaded again, which overwrites
    whatever partial or wrong object is there. When
    anything is to be sent, stale incomplete multipart uploads under the checkpoint (a crashed run's,
    older than STALE_UPLOAD_SECONDS) are aborted first, and the store's capabilities are learnt (once
    per store) so that the copies the upload tasks receive carry them. `read_local` False (a node-local source,
    whose files only their nodes can read): the CRC32C comparison is left to the upload task there.
    """
    base = checkpoint_prefix(prefix, found.run, found.step, save)
    existing: dict[str, ObjectInfo] = {o.key: o for o in store.list(base)}
    jobs = []
    for f in found.files:
        key = base + f.rel
        obj = existing.get(key)
        if obj is not None and obj.size != f.size and _may_be_encoded(obj.size, f.size):
            crc = stored_crc32c(store, key)
            jobs.append(FileJob(f, key, upload=True, stored=(obj.size, crc) if crc else None))
            continue
        if obj is None or obj.size != f.size:
            jobs.append(FileJob(f, key, upload=True))
            continue
        stored = stored_crc32c(store, key)
        if stored is not None and not read_local:
            jobs.append(FileJob(f, key, upload=True, check_crc32c=stored))
        elif stored is not None and (local := file_crc32c_blocks(f.path))[0] == stored:
            jobs.append(FileJob(f, key, upload=False, known_crc32c=stored, known_blocks=local[1]))
        else:
            jobs.append(FileJob(f, key, upload=True))
    if any(j.upload for j in jobs):
        store.abort_multipart_uploads(base, older_than=time.time() - STALE_UPLOAD_SECONDS)
        # Every upload needs the server's capabilities. Learnt here, in the process that hands the store
        # to the upload tasks, each task's copy carries them (S3Store pickles what it has learnt);
        # otherwise each task on a Dask worker unpickles an unprobed copy and probes again, about ten
        # requests (writes and deletes under the probe prefix) for every file sent.
        store.capabilities()
    return jobs


def _may_be_encoded(stored: int, size: int) -> bool:
    """Whether an object of `stored` bytes can be the frames of a file of `size` (docs/FORMAT.md: a frame
    is at most its 4 MiB of original + 16 bytes). Decided without importing the Blosc library."""
    return size >= MIN_COMPRESS_SIZE and 0 < stored <= size + 16 * (size // (4 * 1024 * 1024) + 1)


def upload_one(
    store: ObjectStore,
    job: FileJob,
    found: Found,
    *,
    sha256: bool = False,
    progress: ProgressFn | None = None,
    save: int = FIRST_SAVE,
    compression: Compression = "off",
) -> FileEntry:
    """Send one file (or accept the verified copy already there) and return its manifest entry.
    With compression "auto" the file's codec is chosen from its header or a few sampled MiB
    (ckptvault.codec.choose) and, when it compresses, the object is its frames."""
    f = job.file
    mode = _mode(f.path)
    if job.check_crc32c is not None and (local := file_crc32c_blocks(f.path))[0] == job.check_crc32c:
        job = replace(job, upload=False, known_crc32c=job.check_crc32c, known_blocks=local[1])
    if not job.upload and job.known_crc32c is not None:
        if progress:
            progress(f.size)
        return FileEntry(
            path=f.rel, size=f.size, mtime=f.mtime, crc32c=job.known_crc32c, mode=mode, blocks=job.known_blocks
        )
    tags = upload_tags(found, save)
    typesize = _typesize(f, compression)
    if typesize is not None and job.stored is not None:
        kept = _already_encoded(job, typesize, mode, sha256)
        if kept is not None:
            if progress:
                progress(f.size)
            return kept
    coded = {"typesize": typesize} if typesize is not None else {}  # as restore's `frames`: only when used
    # A multipart object on a server that keeps no CRC32C of it comes back tagged with the CRC32C of
    # its bytes (for frames, not the file's): a rerun keeps a plain object when it equals the local
    # file's, a compressed one when it equals the file encoded again (ObjectStore.upload_file).
    result = store.upload_file(f.path, job.key, tags=tags, sha256=sha256, progress=progress, **coded)
    return FileEntry(
        path=f.rel,
        size=result.size,
        mtime=f.mtime,
        crc32c=result.crc32c,
        sha256=result.sha256,
        mode=mode,
        codec=result.codec,
        typesize=result.typesize,
        stored_size=result.stored_size,
        frames=result.frames,
        stored_crc32c=result.stored_crc32c if result.frames else None,
        blocks=result.blocks,
    )


def upload_tags(found: Found, save: int) -> dict[str, str]:
    """The tags on every data object of a checkpoint save (tiering and people find it by them)."""
    tags = {"run": found.run, "step": str(found.step), "format": found.format}
    if save != FIRST_SAVE:
        tags["save"] = str(save)
    return tags


def begin_split(store: ObjectStore, job: FileJob, found: Found, save: int = FIRST_SAVE) -> SplitUpload:
    """Start the multipart upload of a file whose ranges several tasks send (ingest/split.py says which)."""
    f = job.file
    return store.begin_upload(f.path, job.key, size=f.size, mtime=f.mtime, tags=upload_tags(found, save))


def send_range(
    store: ObjectStore, job: FileJob, upload: SplitUpload, first: int, count: int, progress: ProgressFn | None = None
) -> SentRange:
    """Read and send parts first..first+count-1 of the file, where the file is; the first range also
    reads its permission bits."""
    parts = store.upload_parts(upload, first, count, progress=progress)
    return SentRange(parts, _mode(job.file.path) if first == 1 else None)


def finish_split(store: ObjectStore, job: FileJob, upload: SplitUpload, sent: Sequence[SentRange]) -> FileEntry:
    """Complete the split upload once every range is sent, and return the file's manifest entry."""
    # tagged with its CRC32C where the server keeps none, as upload_one's (ObjectStore.complete_upload)
    result = store.complete_upload(upload, [p for r in sent for p in r.parts])
    mode = next((r.mode for r in sent if r.mode is not None), None)
    f = job.file
    return FileEntry(path=f.rel, size=result.size, mtime=f.mtime, crc32c=result.crc32c, mode=mode, blocks=result.blocks)


def abort_split(store: ObjectStore, upload: SplitUpload) -> None:
    """Give up a split upload whose ranges did not all arrive (best effort)."""
    store.abort_upload(upload)


def _already_encoded(job: FileJob, typesize: int, mode: int | None, sha256: bool) -> FileEntry | None:
    """The entry of the object a crashed ingest left, when encoding the file again gives exactly its
    bytes (size and CRC32C of the stored bytes): one local read and encode instead of an upload."""
    from ckptvault import codec
    from ckptvault.store.framed import encoder_threads

    assert job.stored is not None
    stored_size, stored_crc = job.stored
    f = job.file
    got = codec.reencode(f.path, typesize, workers=encoder_threads(), sha256=sha256, limit=stored_size)
    if got is None or got.size != f.size or (got.stored_size, got.stored_crc32c) != (stored_size, stored_crc):
        return None
    return FileEntry(
        path=f.rel,
        size=f.size,
        mtime=f.mtime,
        crc32c=got.crc32c,
        sha256=got.sha256,
        mode=mode,
        codec=codec.SHUFFLE_ZSTD,
        typesize=typesize,
        stored_size=stored_size,
        frames=tuple((fr.offset, fr.length, fr.size, fr.crc32c) for fr in got.frames),
        stored_crc32c=stored_crc,
    )


def _typesize(f: LocalFile, compression: Compression) -> int | None:
    """The element size to encode `f` with, or None to store it as it is."""
    if compression == "off" or f.size < MIN_COMPRESS_SIZE:
        return None
    from ckptvault import codec  # the Blosc library: imported only by ingests that compress

    choice = codec.choose(f.path, f.size)
    return choice.typesize if choice.codec == codec.SHUFFLE_ZSTD else None


def _mode(path: Path) -> int | None:
    """The permission bits restore gives back (a 0600 key file must not come back world-readable)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None  # the upload that follows reports the file; the manifest just omits the mode


def lock_save(store: ObjectStore, retention: Retention, days: int, jobs: Sequence[FileJob]) -> int:
    """Raise to `retention` the lock of each object of a save that needs it before its manifest
    commits (ckptvault.objectlock.save_lock.to_extend: objects a killed pass sent, or all after a long upload).
    Returns how many were raised."""
    reused = [j.key for j in jobs if not j.upload or j.stored is not None or j.check_crc32c is not None]
    kept = set(reused)
    sent = [j.key for j in jobs if j.key not in kept]
    keys = to_extend(retention, days, time.time(), reused, sent)
    return sum(store.extend_retention(k, retention) for k in keys)


def commit_manifest(
    store: ObjectStore,
    prefix: str,
    found: Found,
    entries: Sequence[FileEntry],
    save: int = FIRST_SAVE,
    placement: NodePlacement | None = None,
) -> Manifest:
    """Write the manifest last. Losing the conditional write to another ingest is not an error:
    the other writer committed the same checkpoint, and its manifest stands. `placement`: a node-local
    source's, recorded so that a restore places the files as they were, whatever the config says later.
    The retention `store` writes with (a save's, `[lock]` on: its objects were raised to it before)
    is recorded in the manifest as its `lock` (docs/FORMAT.md, "The manifest"): the very retention the
    manifest itself is written with, so a catalog rebuilt from manifests knows it."""
    by_path = {e.path: e for e in entries}
    missing = [f.rel for f in found.files if f.rel not in by_path]
    if missing:
        raise ValueError(f"{found.run} step {found.step}: refusing to commit, files not uploaded: {missing[:5]}")
    manifest = Manifest(
        run=found.run,
        step=found.step,
        format=found.format,
        files=tuple(by_path[f.rel] for f in found.files),
        created_at=found.newest_mtime,
        uploaded_at=time.time(),
        source=str(found.path),
        single_file=found.candidate.is_file,
        tool_version=__version__,
        metrics=read_metrics(found.format, found.path),
        save=save,
        placement=placement,
        lock=None if store.retention is None else SaveLock(store.retention.mode, store.retention.until_ts),
        written_by=reported.merge(read_written_by(found.format, found.path), dict(found.reported_by)),
    )
    key = checkpoint_prefix(prefix, found.run, found.step, save) + MANIFEST_NAME
    try:
        store.put_bytes(key, manifest.to_json(), if_none_match=True, content_type="application/json")
    except PreconditionFailedError:
        return Manifest.from_json(store.get_bytes(key), key)
    return manifest
