"""A big file restored as ranges (ckptvault/restore/ranged.py): which files split and where, and the
allocate / fetch_range / seal steps on the in-memory store, the store the library tests use."""

from __future__ import annotations

import ctypes
import errno
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.restore import ranged
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.store import ChecksumMismatchError, TransferConfig, TransientStoreError, preallocate
from ckptvault.store.memory import MemoryStore

MIB = 1024 * 1024
MANIFEST = Manifest(run="r", step=1, format="hf", files=(), created_at=1.0, uploaded_at=2.0, source="/x/checkpoint-1")


def _plan(path: str, size: int, *, crc: str = "AAAAAA==", frames: bool = False, mode: int | None = None) -> ObjectPlan:
    coded = ((0, size, size, crc),) if frames else ()
    return ObjectPlan(f"k/{path}", path, size, crc, 1_600_000_000.0, "STANDARD", True, mode, coded)


def test_only_big_raw_files_split_into_whole_units_in_order() -> None:
    big, mid, small = _plan("big", 41), _plan("mid", 12), _plan("small", 5)
    squeezed = _plan("squeezed", 41, frames=True)
    one_unit = _plan("one-unit", 9)  # over the threshold, but a unit of 10 leaves one range: no split
    cut = ranged.split_plans([big, squeezed, mid, one_unit, small], threshold=8, unit=10)
    assert cut.split == [big, mid]
    assert cut.whole == [squeezed, one_unit, small]  # the plans' (largest-first) order kept
    assert [(p.plan.path, p.offset, p.length) for p in cut.pieces] == [
        ("big", 0, 10), ("big", 10, 10), ("big", 20, 10), ("big", 30, 10), ("big", 40, 1),
        ("mid", 0, 10), ("mid", 10, 2),
    ]  # fmt: skip
    assert ranged.split_plans([big], threshold=0, unit=10).split == []  # 0: never split


def _stored(tmp_path: Path, size: int) -> tuple[MemoryStore, ObjectPlan, bytes]:
    store = MemoryStore("b", transfer=TransferConfig(part_size=5 * MIB, multipart_threshold=5 * MIB))
    data = random.Random(size).randbytes(size)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    res = store.upload_file(src, "k/model.bin")
    return store, _plan("model.bin", size, crc=res.crc32c, mode=0o640), data


def test_ranges_fetched_at_once_into_one_file_are_sealed_byte_identical(tmp_path: Path) -> None:
    store, plan, data = _stored(tmp_path, 12 * MIB + 7)
    staged = tmp_path / "staged"
    staged.mkdir()
    cut = ranged.split_plans([plan], threshold=5 * MIB, unit=store.transfer.part_size)
    assert len(cut.pieces) == 3
    ranged.allocate(plan, staged, MANIFEST)
    seen: list[int] = []

    def fetch(p: ranged.Piece) -> ranged.FetchedRange:
        return ranged.fetch_range(store, plan, staged, MANIFEST, p.offset, p.length, seen.append)

    with ThreadPoolExecutor(3) as pool:  # each range opens the file itself, as on separate workers
        fetched = list(pool.map(fetch, reversed(cut.pieces)))
    [mine] = ranged.by_file(cut.split, fetched)
    assert [f.offset for f in mine] == [0, 5 * MIB, 10 * MIB]
    assert [f.crc32c for f in mine] == [to_b64(crc32c_update(data[f.offset : f.offset + f.length])) for f in mine]
    assert ranged.seal(plan, staged, MANIFEST, mine) == "model.bin"
    out = staged / "checkpoint-1" / "model.bin"
    assert out.read_bytes() == data and sum(seen) == len(data)
    st = os.stat(out)
    assert st.st_mode & 0o777 == 0o640 and st.st_mtime == plan.mtime


def test_seal_refuses_a_wrong_crc_a_missing_range_or_another_version_and_removes_the_file(tmp_path: Path) -> None:
    store, plan, _ = _stored(tmp_path, 12 * MIB)
    staged = tmp_path / "staged"
    staged.mkdir()
    out = staged / "checkpoint-1" / "model.bin"

    def fetch_all(p: ObjectPlan) -> list[ranged.FetchedRange]:
        ranged.allocate(p, staged, MANIFEST)
        cut = ranged.split_plans([p], 5 * MIB, 5 * MIB)
        return [ranged.fetch_range(store, p, staged, MANIFEST, c.offset, c.length) for c in cut.pieces]

    wrong = _plan("model.bin", plan.size, crc=to_b64(crc32c_update(b"other")))
    with pytest.raises(ChecksumMismatchError) as e:
        ranged.seal(wrong, staged, MANIFEST, fetch_all(wrong))
    assert "k/model.bin" in str(e.value) and wrong.crc32c in str(e.value) and "3 ranges" in str(e.value)
    assert not out.exists()  # no corrupt file left looking whole

    fetched = fetch_all(plan)
    with pytest.raises(RestoreError, match="do not cover the file in order"):
        ranged.seal(plan, staged, MANIFEST, [fetched[0], fetched[2]])
    assert not out.exists()

    fetched = fetch_all(plan)
    replaced = [*fetched[:2], replace(fetched[2], etag='"another"')]
    with pytest.raises(TransientStoreError, match="replaced"):
        ranged.seal(plan, staged, MANIFEST, replaced)

    fetched = fetch_all(plan)
    os.truncate(out, plan.size + 1)  # something else wrote to the staging file
    with pytest.raises(ChecksumMismatchError, match="bytes, expected"):
        ranged.seal(plan, staged, MANIFEST, fetched)
    assert not out.exists()


def test_a_range_never_creates_its_file_nor_refills_a_discarded_staging_directory(tmp_path: Path) -> None:
    store, plan, _ = _stored(tmp_path, 6 * MIB)
    with pytest.raises(RestoreError, match="is gone"):
        ranged.fetch_range(store, plan, tmp_path / "discarded", MANIFEST, 0, 5 * MIB)
    staged = tmp_path / "staged"
    staged.mkdir()
    with pytest.raises(RestoreError, match="was not created"):
        ranged.fetch_range(store, plan, staged, MANIFEST, 0, 5 * MIB)
    assert not (tmp_path / "discarded").exists() and list(staged.iterdir()) == []


def test_allocate_reserves_the_file_s_blocks_before_any_range(tmp_path: Path) -> None:
    """Its ranges' direct writes then overwrite reserved blocks (a shared inode lock on ext4, not an
    exclusive one per allocating write): ckptvault/store/preallocate.py."""
    plan = _plan("model.bin", 12 * MIB)
    staged = tmp_path / "staged"
    staged.mkdir()
    ranged.allocate(plan, staged, MANIFEST)
    st = os.stat(staged / "checkpoint-1" / "model.bin")
    assert st.st_size == 12 * MIB
    assert st.st_blocks * 512 >= 12 * MIB, f"not reserved: is {tmp_path} on ext4 or XFS (preallocate.RESERVED_ON)?"


def test_allocate_without_room_removes_the_file_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ext4 and XFS keep what a failed fallocate did allocate: the file goes, so its blocks do not hold
    the room the other files' downloads need."""

    def fallocate_without_room(fd: int, mode: int, offset: int, length: int) -> int:
        ctypes.set_errno(errno.ENOSPC)
        return -1

    monkeypatch.setattr(preallocate, "_fs_type", lambda fd: preallocate.EXT4_MAGIC)
    monkeypatch.setattr(preallocate, "_fallocate", fallocate_without_room)
    staged = tmp_path / "staged"
    staged.mkdir()
    with pytest.raises(OSError, match="no room for the restored file"):
        ranged.allocate(_plan("model.bin", 12 * MIB), staged, MANIFEST)
    assert not (staged / "checkpoint-1" / "model.bin").exists()
