from __future__ import annotations

from pathlib import Path

import pytest

from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.ingest.split import is_split, largest_first, part_ranges
from ckptvault.ingest.steps import FileJob
from ckptvault.store import SplitUpload, TransferConfig

MiB = 2**20
FIVE = TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB)


def _job(size: int, name: str = "f", **kw: object) -> FileJob:
    return FileJob(LocalFile(name, Path("/hot") / name, size, 1.0), f"k/{name}", upload=True, **kw)  # type: ignore[arg-type]


def test_only_a_plain_upload_over_the_threshold_in_two_ranges_or_more_splits() -> None:
    big = _job(11 * MiB)
    assert is_split(big, 10 * MiB, FIVE, sha256=False, compression="off")
    assert not is_split(_job(10 * MiB), 10 * MiB, FIVE, sha256=False, compression="off")  # at the threshold
    assert not is_split(big, 0, FIVE, sha256=False, compression="off")  # split_size_mb = 0: never
    assert not is_split(big, 10 * MiB, FIVE, sha256=True, compression="off")  # SHA-256 cannot be combined
    assert not is_split(big, 10 * MiB, FIVE, sha256=False, compression="auto")  # frames chosen where it is read
    # a crashed run's object to compare first, or a skipped file: the one-task path
    assert not is_split(_job(11 * MiB, check_crc32c="AAAAAA=="), 10 * MiB, FIVE, sha256=False, compression="off")
    assert not is_split(_job(11 * MiB, stored=(5, "AAAAAA==")), 10 * MiB, FIVE, sha256=False, compression="off")
    skipped = FileJob(big.file, big.key, upload=False, known_crc32c="AAAAAA==")
    assert not is_split(skipped, 10 * MiB, FIVE, sha256=False, compression="off")
    # parts bigger than the threshold: a range is one part, and 11 MiB of 8 MiB parts is two of them
    eight = TransferConfig(part_size=8 * MiB, multipart_threshold=8 * MiB)
    assert is_split(_job(11 * MiB), 6 * MiB, eight, sha256=False, compression="off")
    # under the multipart threshold an unsplit upload is one PUT: split, the object would differ
    wide = TransferConfig(part_size=5 * MiB, multipart_threshold=64 * MiB)
    assert not is_split(_job(20 * MiB), 10 * MiB, wide, sha256=False, compression="off")


def test_work_goes_largest_first_keeping_the_order_of_equals() -> None:
    jobs = [_job(1, "a"), _job(30, "b"), _job(1, "c"), _job(7, "d")]
    assert [j.file.rel for j in largest_first(jobs)] == ["b", "d", "a", "c"]


@pytest.mark.parametrize(
    ("size", "target", "expected"),
    [
        (21 * MiB, 10 * MiB, [(1, 2), (3, 2), (5, 1)]),  # 5 parts of 5 MiB, the last 1 MiB
        (20 * MiB, 12 * MiB, [(1, 2), (3, 2)]),  # a target between parts: whole parts under it
        (9 * MiB, 1 * MiB, [(1, 1), (2, 1)]),  # a target under one part: one part a range
    ],
)
def test_part_ranges_cover_every_part_once(size: int, target: int, expected: list[tuple[int, int]]) -> None:
    up = SplitUpload("k", "id", "/hot/f", size, 1.0, 5 * MiB)
    got = part_ranges(up, target)
    assert got == expected
    numbers = [n for first, count in got for n in range(first, first + count)]
    assert numbers == list(range(1, up.parts + 1))
