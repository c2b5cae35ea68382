"""The hot copy as the replicate pass's source (docs/FORMAT.md, "Replicas", the commit's step 3): a file
of a committed save still on the local file system where ingest read it, unchanged, is read instead of
the primary's object: no egress from the primary, and a local read instead of ranged GETs.

`HotFile` is a ckptvault.store.RangeSource, so `ObjectStore.copy_from` streams it exactly as it streams
the primary's object: the same parts, the same CRC32C computed in the read pass and compared with the
manifest's before the upload is completed. What this module adds is where the file is, the cheap
checks before the first byte (a regular file, the manifest's size and mtime) and the same checks at
each read. Every doubt is `HotCopyUnusable`, and the pass then reads that file from the primary."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ckptvault.checkpoint.manifest import CODEC_NONE, FileEntry, Manifest, ManifestError, safe_relpath
from ckptvault.errors import CkptvaultError

# The mtime a file may differ by and still be the manifest's: the tolerance eviction's re-check allows
# (ckptvault/tiering/eviction.py compare_local, not imported: a wing imports no other wing), since
# both ask the same question of the same file.
MTIME_TOLERANCE = 1e-3
# What copy_from's messages name this source by: with the absolute path as the key, `file:///path`.
FILE_SCHEME = "file:/"


class HotCopyUnusable(CkptvaultError):
    """The hot copy of one file is not (or is no longer) the manifest's: read that file from the primary.
    `gone`: it is simply not there (evicted, or this host does not see the hot tier), which is routine
    and not worth naming; anything else (changed, unreadable) is named in the save's fallbacks."""

    def __init__(self, message: str, *, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


def hot_path(manifest: Manifest, entry: FileEntry) -> Path | None:
    """Where `entry`'s hot copy is by FORMAT.md's rule (the manifest's `source`, joined with the entry's
    path unless the save is a single file), or None where the rule says the primary is read: a compressed
    entry (its stored frames cannot be rebuilt byte for byte), a node-local save (its files are on each
    node's disk, not this host's), a relative `source` (relative to a working directory nobody knows)."""
    if entry.codec != CODEC_NONE or manifest.placement is not None:
        return None
    root = Path(manifest.source)
    if not manifest.source or not root.is_absolute():
        return None
    if manifest.single_file:
        return root
    try:
        return root / safe_relpath(entry.path)
    except ManifestError:
        return None


class HotFile:
    """One local file opened for copy_from (a RangeSource): `read_range` is a positioned read, safe from
    the copy's reader threads, after an fstat that the file is still the manifest's size and mtime. The
    CRC32C is copy_from's to check. Close it (or use it as a context manager) when the copy is done."""

    bucket = FILE_SCHEME

    def __init__(self, path: Path, entry: FileEntry) -> None:
        self.path, self.entry = path, entry
        try:
            # O_NOFOLLOW: a symlink put where the file was is not the file ingest read
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise HotCopyUnusable(f"{path}: not on the hot tier (evicted?)", gone=True) from None
        except OSError as e:
            raise HotCopyUnusable(f"{path}: cannot be opened ({e.strerror})") from None
        try:
            self._check()
        except BaseException:
            os.close(self._fd)
            raise

    @property
    def key(self) -> str:
        """What copy_from is told the source object is: the absolute path (`file:///...` in its messages)."""
        return str(self.path)

    def _check(self) -> None:
        try:
            st = os.fstat(self._fd)
        except OSError as e:
            raise HotCopyUnusable(f"{self.path}: cannot be read ({e.strerror})") from None
        if not stat.S_ISREG(st.st_mode):
            raise HotCopyUnusable(f"{self.path}: not a regular file")
        if st.st_size != self.entry.size:
            raise HotCopyUnusable(f"{self.path}: {st.st_size} bytes, the manifest says {self.entry.size}")
        if abs(st.st_mtime - self.entry.mtime) > MTIME_TOLERANCE:
            raise HotCopyUnusable(f"{self.path}: modified since it was ingested (its mtime is not the manifest's)")

    def read_range(self, key: str, offset: int, length: int, *, size: int) -> bytes:
        if length < 1 or offset < 0 or offset + length > size or size != self.entry.size:
            raise HotCopyUnusable(f"{self.path}: range {offset}+{length} is not in 0..{self.entry.size}")
        self._check()
        chunks, got = [], 0
        while got < length:  # pread may return less than asked (a signal, a 2 GiB cap): read the rest
            try:
                data = os.pread(self._fd, length - got, offset + got)
            except OSError as e:
                raise HotCopyUnusable(f"{self.path}: read failed ({e.strerror})") from None
            if not data:
                raise HotCopyUnusable(f"{self.path}: shorter than the manifest's {self.entry.size} bytes")
            chunks.append(data)
            got += len(data)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> HotFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
