"""Reserve a restored file's blocks before its bytes are written (Linux fallocate(2)).

Why: a restore writes one big file from many ranges at once, with direct writes (O_DIRECT). On ext4 a
direct write into a hole of a sparse file allocates its blocks, and such a write holds the file's inode
lock exclusively until its I/O completes: the 16 ranges of an optimizer file queue behind each other
and the disk sees one of its writes at a time. Into blocks reserved beforehand a direct write is an
overwrite, which ext4 runs under a shared lock, so the ranges' writes reach the disk together. A
destination without room for the file also fails before its first byte is fetched, not part-way.

fallocate(2), not `os.posix_fallocate`: where a filesystem has no fallocate, glibc's posix_fallocate
emulates it by writing into every block, a second write of the whole file. Here such a filesystem
(some NFS and FUSE mounts, older ZFS) is told apart by its error and simply not reserved: the file
stays sparse and is written as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable

# The filesystem has no fallocate, or not for this file: write into the sparse file as before.
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV, errno.EPERM})


def _load() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None  # not Linux: files stay sparse
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    call: Callable[[int, int, int, int], int] = fn
    return call


_fallocate = _load()


def reserve(fd: int, size: int, path: os.PathLike[str] | str) -> bool:
    """Allocate blocks for bytes [0, size) of the open file `fd` without changing its size; False where
    the filesystem cannot (nothing done). Raises OSError (ENOSPC: no room for `path`) otherwise."""
    if _fallocate is None or size <= 0:
        return False
    while _fallocate(fd, 0, 0, size) != 0:
        err = ctypes.get_errno()
        if err != errno.EINTR:
            break
    else:
        return True
    if err in _UNSUPPORTED:
        return False
    if err in (errno.ENOSPC, errno.EDQUOT):
        why = f"no room for the restored file's {size} bytes ({os.strerror(err)}): free space there or restore "
        why += "to another --dest"
    else:
        why = f"reserving {size} bytes for the restored file: {os.strerror(err)}"
    raise OSError(err, why, os.fspath(path))
