"""A checkpoint's files handed to the submitter, and what a failure leaves open put right.

A file under `[scale] split_size_mb` is one upload call; a bigger one is a multipart upload begun
here, whose ranges of parts are calls of their own (ckptvault/ingest/split.py says which files), and
which is completed here once every range is in. A split upload the checkpoint does not complete is
aborted, so that a failed checkpoint leaves no upload open to be paid for until the bucket's rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ckptvault.checkpoint.manifest import FileEntry
from ckptvault.config import Config
from ckptvault.ingest.discovery import Found
from ckptvault.ingest.nodes import jobs_by_node
from ckptvault.ingest.split import is_split, largest_first, part_ranges
from ckptvault.ingest.steps import FileJob, SentRange, abort_split, begin_split, finish_split, send_range, upload_one
from ckptvault.store import ObjectStore, SplitUpload
from ckptvault.transfer.placement import Placement
from ckptvault.transfer.progress import ProgressBar
from ckptvault.transfer.ranges import split_size
from ckptvault.transfer.submitter import Pending, Submitter, settle

# A checkpoint's transfer: every call here that moves or finishes bytes, per file and per part, all store
# I/O (retried on transient store errors). The ingest flow runs these on plain threads of its own
# process when no Dask cluster runs its tasks: no task run per file or per part
# (ckptvault_prefect/runtime/ingest.py, docs/performance.md).
DATA_PATH: frozenset[Callable[..., Any]] = frozenset({upload_one, begin_split, send_range, finish_split, abort_split})


@dataclass(frozen=True)
class SplitSend:
    """A file sent by range calls: its begun upload and the ranges in flight."""

    job: FileJob
    upload: SplitUpload
    ranges: list[Pending[SentRange]]


@dataclass
class Sent:
    """A checkpoint's uploads in flight: one call per whole file, and the split files."""

    files: list[Pending[FileEntry]] = field(default_factory=list)
    splits: list[SplitSend] = field(default_factory=list)

    def calls(self) -> list[Pending[Any]]:
        return [*self.files, *(f for s in self.splits for f in s.ranges)]


def send(
    submit: Submitter, cfg: Config, store: ObjectStore, found: Found, jobs: list[FileJob], save: int,
    placement: Placement | None,
) -> Sent:  # fmt: skip
    """Every job's upload submitted, none awaited; node-local files by the worker of the node that holds
    them. If a begin or a submission fails, what was started is settled and aborted before it raises."""
    bar = ProgressBar(found.total_bytes, f"{found.run} step {found.step}")
    compression = cfg.compression_for(found.run)
    threshold = split_size(cfg.scale.split_size_mb)
    sent = Sent()

    def submit_some(some: list[FileJob], node: str | None) -> None:
        whole = []
        for job in largest_first(some):  # the biggest file's ranges first, then files by size
            if not is_split(job, threshold, store.transfer, sha256=cfg.sha256, compression=compression):
                whole.append(job)
                continue
            upload = submit(begin_split, store, job, found, save)
            calls = [partial(send_range, store, job, upload, first, count, bar)
                     for first, count in part_ranges(upload, threshold)]  # fmt: skip
            sent.splits.append(SplitSend(job, upload, submit.map(calls, node)))
        if whole:
            calls_whole = [partial(upload_one, store, job, found, sha256=cfg.sha256, progress=bar, save=save,
                                   compression=compression) for job in whole]  # fmt: skip
            sent.files.extend(submit.map(calls_whole, node))

    try:
        if placement is None:
            submit_some(jobs, None)
            return sent
        for node, node_jobs in jobs_by_node(placement, jobs).items():
            if node_jobs:
                submit_some(node_jobs, placement.name(node))
        return sent
    except BaseException:
        # the checkpoint fails, so what it started must not outlive it
        settle(sent.calls())
        abort(submit, store, sent.splits)
        raise


def complete(submit: Submitter, store: ObjectStore, splits: list[SplitSend]) -> list[FileEntry]:
    """Complete each split upload, every range of it sent; if one fails, abort it and the ones after it."""
    entries = []
    for i, s in enumerate(splits):
        try:
            entries.append(submit(finish_split, store, s.job, s.upload, [f.result() for f in s.ranges]))
        except Exception:
            # this one too: a completion that failed for good (its retries spent) left its upload open
            abort(submit, store, splits[i:])
            raise
    return entries


def abort(submit: Submitter, store: ObjectStore, splits: list[SplitSend]) -> None:
    for s in splits:
        submit(abort_split, store, s.upload)
