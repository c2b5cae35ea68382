"""Splitting one big file into ranges, each its own task (`[scale] split_size_mb`): on a cluster one
file is then sent by ingest, or fetched by restore, on several workers at once. Pure functions: which
files split, and where the cuts fall. The cuts fall on whole `unit`s (an upload's part size), so an
upload range is a run of whole parts of one multipart upload.
"""

from __future__ import annotations

MIB = 1024 * 1024


def split_size(split_size_mb: int) -> int:
    """The configured threshold in bytes; 0: never split."""
    return split_size_mb * MIB


def splits(size: int, threshold: int) -> bool:
    """Whether a file of `size` bytes is split (strictly larger than a non-zero threshold)."""
    return threshold > 0 and size > threshold


def ranges(size: int, unit: int, target: int) -> list[tuple[int, int]]:
    """(offset, length) pieces covering bytes [0, size) in order: as few as allow none over `target`
    (unless one `unit` is), each a whole number of units, all of one length but the last, which takes
    the rest. That length is the units spread over the pieces, so a file just over `target` is cut in
    two halves, not into `target` and a sliver whose task would cost more than it sends."""
    if unit <= 0:
        raise ValueError(f"unit must be positive, got {unit}")
    units = -(-size // unit)
    most = max(1, target // unit)  # units in the largest range allowed
    count = -(-units // most)  # fewest ranges
    step = -(-units // count) * unit if count else unit  # spread the units evenly over them
    return [(off, min(step, size - off)) for off in range(0, size, step)]
