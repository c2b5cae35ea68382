"""A restored file's blocks reserved before its bytes are written (ckptvault/preallocate.py): on the
real file system under tmp_path, and the kernel's refusals (an errno set as the C call would)."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptvault import preallocate

MIB = 1024 * 1024


@pytest.fixture
def sized(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    path = tmp_path / "optimizer.pt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, 8 * MIB)
    try:
        yield fd, path
    finally:
        os.close(fd)


def _failing(*errnos: int) -> Callable[[int, int, int, int], int]:
    """fallocate(2) as ctypes sees it failing: -1, with these errnos one call after another."""
    left = list(errnos)

    def call(fd: int, mode: int, offset: int, length: int) -> int:
        if not left:
            return 0
        ctypes.set_errno(left.pop(0))
        return -1

    return call


def test_the_blocks_are_allocated_and_the_size_is_kept(sized: tuple[int, Path]) -> None:
    fd, path = sized
    assert os.fstat(fd).st_blocks == 0  # ftruncate alone: a sparse file
    assert preallocate.reserve(fd, 8 * MIB, path) is True
    st = os.fstat(fd)
    assert st.st_blocks * 512 >= 8 * MIB
    assert st.st_size == 8 * MIB
    assert path.read_bytes() == bytes(8 * MIB)  # reserved blocks read back as zeros, as a hole does


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL])
def test_a_file_system_without_fallocate_leaves_the_file_sparse(
    sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    fd, path = sized
    monkeypatch.setattr(preallocate, "_fallocate", _failing(code))
    assert preallocate.reserve(fd, 8 * MIB, path) is False
    assert os.fstat(fd).st_blocks == 0


def test_no_room_names_the_file_and_what_to_do(sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    fd, path = sized
    monkeypatch.setattr(preallocate, "_fallocate", _failing(errno.ENOSPC))
    with pytest.raises(OSError) as got:
        preallocate.reserve(fd, 8 * MIB, path)
    assert got.value.errno == errno.ENOSPC
    assert got.value.filename == str(path)
    assert "no room for the restored file's 8388608 bytes" in str(got.value)
    assert "--dest" in str(got.value)


def test_an_interrupted_call_is_made_again(sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    fd, path = sized
    monkeypatch.setattr(preallocate, "_fallocate", _failing(errno.EINTR, errno.EINTR))
    assert preallocate.reserve(fd, 8 * MIB, path) is True


def test_an_empty_file_asks_nothing(sized: tuple[int, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    fd, path = sized
    monkeypatch.setattr(preallocate, "_fallocate", _failing(errno.EIO))  # would raise if it were called
    assert preallocate.reserve(fd, 0, path) is False
