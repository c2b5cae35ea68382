"""Which of a checkpoint's uploads are split into range tasks (`[scale] split_size_mb`), the ranges,
and the order work is handed to the task runner. Pure decisions, unit-tested; the ingest pass
uses them (ckptvault/ingest/uploads.py), the store does the transfer (ObjectStore.begin_upload,
upload_parts, complete_upload).

Not split: a file compression may encode (its object is frames chosen on the worker that reads it),
one hashed with SHA-256 (a whole-file digest cannot be combined from ranges, as CRC32C can), a file
a crashed run may have left already stored (`stored`, `check_crc32c`: the one-task path compares it
first), and any file at or under the threshold.
"""

from __future__ import annotations

from collections.abc import Sequence

from ckptvault.config import Compression
from ckptvault.ingest.steps import FileJob
from ckptvault.store import SplitUpload, TransferConfig
from ckptvault.store.upload_request import part_size_for
from ckptvault.transfer.ranges import ranges, splits


def is_split(job: FileJob, threshold: int, transfer: TransferConfig, *, sha256: bool, compression: Compression) -> bool:
    """Whether the job's file goes up as range tasks: a plain upload over the threshold that cuts into
    at least two ranges of whole parts, and over the multipart threshold, so that its object is the one
    an unsplit upload makes (the same parts)."""
    if not job.upload or job.stored is not None or job.check_crc32c is not None or sha256 or compression != "off":
        return False
    size = job.file.size
    if not splits(size, threshold) or size <= transfer.multipart_threshold:
        return False
    return len(ranges(size, part_size_for(size, transfer.part_size), threshold)) >= 2


def largest_first(jobs: Sequence[FileJob]) -> list[FileJob]:
    """Work scheduled by size: the biggest file is not the one started last, leaving one worker on it
    while the others idle. Stable, so equal sizes keep the checkpoint's order."""
    return sorted(jobs, key=lambda j: -j.file.size)


def part_ranges(upload: SplitUpload, target: int) -> list[tuple[int, int]]:
    """(first part number, part count) of each range task: whole parts, about `target` bytes each."""
    return [
        (off // upload.part_size + 1, -(-n // upload.part_size))
        for off, n in ranges(upload.size, upload.part_size, target)
    ]
