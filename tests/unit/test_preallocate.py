"""A restored file's blocks reserved before its bytes are written (ckptvault/store/preallocate.py): on the
real file system under tmp_path (ext4 here and in CI), and the kernel's refusals (an errno set as the
C call would set it)."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptvault.store import preallocate

MIB = 1024 * 1024
BTRFS_MAGIC = 0x9123683E
TMPFS_MAGIC = 0x01021994


@pytest.fixture
def sized(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    path = tmp_path / "optimizer.pt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, 8 * MIB)
    try:
        yield fd, path
    finally:
        os.close(fd)


@pytest.fixture
def on_ext4(monkeypatch: pytest.MonkeyPatch) -> None:
    """The faked calls below run as they would on ext4, whatever tmp_path's file system is."""
    monkeypatch.setattr(preallocate, "_fs_type", lambda fd: preallocate.EXT4_MAGIC)


def _failing(*errnos: int, calls: list[int] | None = None) -> Callable[[int, int, int, int], int]:
    """fallocate(2) as ctypes sees it failing: -1, with these errnos one call after another."""
    left = list(errnos)

    def call(fd: int, mode: int, offset: int, length: int) -> int:
        if calls is not None:
            calls.append(length)
        if not left:
            return 0
        ctypes.set_errno(left.pop(0))
        return -1

    return call


def test_the_blocks_are_allocated_and_the_size_is_kept(sized: tuple[int, Path]) -> None:
    fd, path = sized
    kind = preallocate._fs_type(fd)
    if kind not in preallocate.RESERVED_ON:
        pytest.fail(f"{path.parent} is on file system type {kind!r}, not ext4 or XFS: run the tests on one")
    assert os.fstat(fd).st_blocks == 0  # ftruncate alone: a sparse file
    assert preallocate.reserve(fd, 8 * MIB, path) is True
    st = os.fstat(fd)
    assert st.st_blocks * 512 >= 8 * MIB
    assert st.st_size == 8 * MIB
    assert path.read_bytes() == bytes(8 * MIB)  # reserved blocks read back as zeros, as a hole does


@pytest.mark.parametrize("kind", [BTRFS_MAGIC, TMPFS_MAGIC, None])
def test_other_file_systems_are_left_sparse_without_asking(
    sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch, kind: int | None
) -> None:
    fd, path = sized
    calls: list[int] = []
    monkeypatch.setattr(preallocate, "_fs_type", lambda fd: kind)
    monkeypatch.setattr(preallocate, "_fallocate", _failing(calls=calls))
    assert preallocate.reserve(fd, 8 * MIB, path) is False
    assert calls == []  # not even asked: the real file system is never touched


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV, errno.EPERM])
def test_a_refused_reservation_leaves_the_file_sparse(
    sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch, on_ext4: None, code: int
) -> None:
    fd, path = sized
    calls: list[int] = []
    monkeypatch.setattr(preallocate, "_fallocate", _failing(code, calls=calls))
    assert preallocate.reserve(fd, 8 * MIB, path) is False
    assert calls == [8 * MIB]  # asked once, not again


def test_no_room_names_the_file_and_what_to_do(
    sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch, on_ext4: None
) -> None:
    fd, path = sized
    monkeypatch.setattr(preallocate, "_fallocate", _failing(errno.ENOSPC))
    with pytest.raises(OSError) as got:
        preallocate.reserve(fd, 8 * MIB, path)
    assert got.value.errno == errno.ENOSPC
    assert got.value.filename == str(path)
    assert "no room for the restored file's 8388608 bytes" in str(got.value)
    assert "free space there or restore somewhere with room" in str(got.value)


def test_another_error_is_raised_as_itself(
    sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch, on_ext4: None
) -> None:
    fd, path = sized
    monkeypatch.setattr(preallocate, "_fallocate", _failing(errno.EIO))
    with pytest.raises(OSError) as got:
        preallocate.reserve(fd, 8 * MIB, path)
    assert got.value.errno == errno.EIO and "reserving 8388608 bytes" in str(got.value)


def test_an_interrupted_call_is_made_again(
    sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch, on_ext4: None
) -> None:
    fd, path = sized
    calls: list[int] = []
    monkeypatch.setattr(preallocate, "_fallocate", _failing(errno.EINTR, errno.EINTR, calls=calls))
    assert preallocate.reserve(fd, 8 * MIB, path) is True
    assert len(calls) == 3


def test_an_empty_file_asks_nothing(sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch, on_ext4: None) -> None:
    fd, path = sized
    monkeypatch.setattr(preallocate, "_fallocate", _failing(errno.EIO))  # would raise if it were called
    assert preallocate.reserve(fd, 0, path) is False
