"""Reserve a restored file's blocks before its bytes are written (Linux fallocate(2)), on ext4 and XFS.

Why: a restore writes one big file from many ranges at once, with direct writes (O_DIRECT). On ext4 a
direct write into a hole of a sparse file allocates its blocks, and such a write holds the file's inode
lock exclusively until its I/O completes: the 16 ranges of an optimizer file queue behind each other
and the disk sees one of its writes at a time. Into blocks reserved beforehand an aligned direct write
is an overwrite, which ext4 runs under a shared lock (the kernels of the last years, with ext4's default
`dioread_nolock`; measured on 6.18), so the ranges' writes reach the disk together. A file that does
not fit also fails before its own first byte is fetched, not part-way.

Only where that is what fallocate does: ext4 and XFS (their superblock magic, from fstatfs). Elsewhere
the file stays sparse, as before: btrfs would write a preallocated file's buffered pages without
copy-on-write and without compression, and reserve its uncompressed size; OpenZFS reserves nothing;
NFS, FUSE and Lustre clients may have none, cost a round trip, or emulate it by writing zeros.
fallocate(2), not `os.posix_fallocate`, for the same reason: glibc emulates the latter by writing into
every block where the filesystem has no fallocate, a second write of the whole file.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable

EXT4_MAGIC = 0xEF53  # ext2/3/4 share it
XFS_MAGIC = 0x58465342
RESERVED_ON = frozenset({EXT4_MAGIC, XFS_MAGIC})

# The filesystem has no fallocate, or not for this file: write into the sparse file as before.
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV, errno.EPERM})


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)  # the process's own C library: no ldconfig run at import
    except OSError:
        return None


def _load_fallocate(libc: ctypes.CDLL | None) -> Callable[[int, int, int, int], int] | None:
    fn = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)  # 64-bit offsets either way
    if fn is None:
        return None  # not Linux: files stay sparse
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    call: Callable[[int, int, int, int], int] = fn
    return call


def _load_fs_type(libc: ctypes.CDLL | None) -> Callable[[int], int | None]:
    fstatfs = getattr(libc, "fstatfs", None)
    if fstatfs is None:
        return lambda fd: None
    fstatfs.restype = ctypes.c_int

    def fs_type(fd: int) -> int | None:
        buf = ctypes.create_string_buffer(256)  # struct statfs (120 bytes on 64-bit Linux); f_type first
        if fstatfs(ctypes.c_int(fd), buf) != 0:
            return None
        return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF

    return fs_type


_lib = _libc()
_fallocate = _load_fallocate(_lib)
_fs_type = _load_fs_type(_lib)


def reserve(fd: int, size: int, path: os.PathLike[str] | str) -> bool:
    """Allocate blocks for bytes [0, size) of the open file `fd` without changing its size, on ext4 and
    XFS; False where not (nothing done). Raises OSError (ENOSPC: no room for `path`) otherwise."""
    if _fallocate is None or size <= 0 or _fs_type(fd) not in RESERVED_ON:
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
        why += "somewhere with room"
    else:
        why = f"reserving {size} bytes for the restored file: {os.strerror(err)}"
    raise OSError(err, why, os.fspath(path))
