from __future__ import annotations

import pytest

from ckptvault.transfer.ranges import MIB, ranges, split_size, splits


def test_only_files_over_a_nonzero_threshold_split() -> None:
    assert split_size(0) == 0
    assert not splits(10 * MIB, 0)
    assert not splits(16 * MIB, split_size(16))
    assert splits(16 * MIB + 1, split_size(16))


@pytest.mark.parametrize(
    ("size", "unit", "target", "expected"),
    [
        (40, 5, 12, [(0, 10), (10, 10), (20, 10), (30, 10)]),  # cut on whole units, under the target
        (41, 5, 12, [(0, 10), (10, 10), (20, 10), (30, 10), (40, 1)]),  # the last takes the rest
        (12, 5, 3, [(0, 5), (5, 5), (10, 2)]),  # never under one unit
        (10, 5, 100, [(0, 10)]),  # one range when the target covers the file
        (0, 5, 10, []),
        (2049, 32, 2048, [(0, 1056), (1056, 993)]),  # just over the target: halves, not 2048 and a sliver
        (100, 10, 30, [(0, 30), (30, 30), (60, 30), (90, 10)]),  # 4 ranges needed: one length but the last
    ],
)
def test_ranges_cover_the_file_in_order_on_whole_units(
    size: int, unit: int, target: int, expected: list[tuple[int, int]]
) -> None:
    got = ranges(size, unit, target)
    assert got == expected
    assert sum(n for _, n in got) == size
    assert all(off % unit == 0 for off, _ in got)


def test_a_unit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="unit"):
        ranges(10, 0, 5)
