"""How `ckptvault follow` learns that a source changed: inotify on a local file system, polling elsewhere.

inotify reports what this kernel writes. On a network or cluster file system (NFS, Lustre, GPFS, CIFS,
CephFS, BeeGFS, FUSE mounts such as sshfs, S3 mounts, JuiceFS) the checkpoints are usually written by other
nodes, whose writes this kernel never sees as events: a watcher there would wait forever. So each source
gets its own mechanism, decided by the file system type its run root is on (/proc/self/mountinfo): a
known local type gets inotify, anything else (a network type, an unknown one, no mountinfo: not Linux)
is polled. An inotify error (no instance left, the watch limit reached) falls back to polling too.

Either way an event is only a reason to look: follow scans the run's listing and ingest judges the step
by its commit rule (ckptvault/ingest/follow.py), exactly as for polling.

inotify is reached through ctypes (libc's inotify_init1 / inotify_add_watch): no dependency. Each run
root is watched with the directories under it down to `MAX_DEPTH` levels, deep enough for every layout's
commit marker (Lightning's `lightning_logs/version_N/checkpoints/*.ckpt` is the deepest, at 3); a
directory created later is watched as it appears.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import struct
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Mechanism = Literal["inotify", "poll"]
WATCH_CHOICES: tuple[str, ...] = ("auto", "inotify", "poll")

# Local file systems: every write to them goes through this kernel, so inotify sees it.
LOCAL_TYPES = frozenset(
    {
        "ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "jfs", "reiserfs", "nilfs2", "zfs",
        "tmpfs", "ramfs", "overlay", "vfat", "exfat", "ntfs", "ntfs3", "hfsplus",
    }
)  # fmt: skip
# Named in the message only: the usual homes of checkpoints where inotify sees nothing of other nodes.
NETWORK_TYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "beegfs", "glusterfs", "9p",
        "virtiofs", "afs", "panfs", "wekafs", "orangefs", "pvfs2", "gfs2", "ocfs2", "fuse", "fuseblk",
    }
)  # fmt: skip

MAX_DEPTH = 3
DEBOUNCE_SECONDS = 0.25  # a save writes many files: scan once they have been quiet this long
DEBOUNCE_MAX_SECONDS = 1.0  # but no later than this after the first event (a writer that never pauses)

# <sys/inotify.h>
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
# Not IN_MODIFY: one event per write() of a multi-GiB file would flood the queue; a file is looked at
# when it is closed, renamed into place, created (an empty marker) or touched.
WATCH_MASK = (
    IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
    | IN_MOVE_SELF | IN_ONLYDIR
)  # fmt: skip
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


@dataclass(frozen=True)
class Choice:
    """The mechanism for one source and why, as follow prints it."""

    mechanism: Mechanism
    fstype: str  # "" when unknown
    point: str  # the mount point the run root is under ("" when unknown)
    reason: str


def _unescape(field_: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes (\040, ...)
    out, i = [], 0
    while i < len(field_):
        code = field_[i + 1 : i + 4]
        if field_[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field_[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of /proc/self/mountinfo: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE
    SUPER` (proc(5)); lines that do not parse are skipped."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if sep + 1 >= len(fields):
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[sep + 1]))
    return mounts


def mount_of(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """The mount `path` (absolute, symlinks resolved) is on: the longest mount point that is a prefix of
    it, the last such mount when several stack on one point (the one mounted on top)."""
    best: Mount | None = None
    for m in mounts:
        point = m.point.rstrip("/") or "/"
        under = path == point or point == "/" or path.startswith(point + "/")
        if under and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def mechanism_for(fstype: str) -> tuple[Mechanism, str]:
    """inotify for a local file system type, polling for anything else, and the reason in words."""
    if fstype in LOCAL_TYPES:
        return "inotify", f"{fstype} is local: inotify sees every write"
    base = fstype.split(".", 1)[0]
    if fstype in NETWORK_TYPES or base in NETWORK_TYPES:
        return "poll", f"{fstype} is a network or FUSE file system: inotify does not see other nodes' writes"
    return "poll", f"{fstype or 'the file system type'} is not known to be local: polled to be safe"


def decide(root: Path, mountinfo: str | None, watch: str = "auto") -> Choice:
    """The mechanism for a source whose run root is `root` (it need not exist yet: the nearest existing
    parent's file system counts), given the text of /proc/self/mountinfo (None: unreadable, not Linux)
    and the `--watch` choice (auto, inotify, poll)."""
    real = os.path.realpath(root)
    mount = mount_of(real, parse_mountinfo(mountinfo)) if mountinfo is not None else None
    fstype, point = (mount.fstype, mount.point) if mount else ("", "")
    if watch == "poll":
        return Choice("poll", fstype, point, "--watch poll")
    if watch == "inotify":
        return Choice("inotify", fstype, point, "--watch inotify")
    if mountinfo is None:
        return Choice("poll", "", "", "no /proc/self/mountinfo (not Linux): polled")
    mechanism, reason = mechanism_for(fstype)
    return Choice(mechanism, fstype, point, reason)


def read_mountinfo() -> str | None:
    try:
        return Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None


class Inotify:
    """One inotify instance through libc (ctypes). Raises OSError where the kernel refuses (ENOSYS off
    Linux, EMFILE with fs.inotify.max_user_instances used up, ENOSPC at fs.inotify.max_user_watches)."""

    def __init__(self) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is Linux's")
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        self.fd: int = fd

    def add(self, path: str | os.PathLike[str], mask: int = WATCH_MASK) -> int:
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), ctypes.c_uint32(mask))
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), os.fspath(path))
        return int(wd)

    def read(self, timeout: float) -> list[tuple[int, int, str]]:
        """The events that arrive within `timeout` seconds (an empty list when none): (wd, mask, name)."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return []
        try:
            buf = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        events, i = [], 0
        while i + _HEADER.size <= len(buf):
            wd, mask, _cookie, n = _HEADER.unpack_from(buf, i)
            name = buf[i + _HEADER.size : i + _HEADER.size + n].rstrip(b"\0")
            events.append((wd, mask, os.fsdecode(name)))
            i += _HEADER.size + n
        return events

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class TreeWatcher:
    """inotify watches over the run roots of the sources that got inotify: each root and its directories
    down to MAX_DEPTH, new directories added as they appear. `wait` says which runs changed."""

    ino: Inotify
    roots: dict[str, Path] = field(default_factory=dict)  # run -> root being watched (or waited for)
    watched: dict[str, bool] = field(default_factory=dict)  # run -> its root is watched now
    _wds: dict[int, tuple[str, Path, int]] = field(default_factory=dict)  # wd -> (run, dir, depth)

    def watch(self, run: str, root: Path) -> None:
        """Watch `root` (and what is under it) for `run`. A root that is not there yet is left for
        `retry_roots`. Raises OSError when the kernel refuses a watch for want of room (ENOSPC): the
        caller polls that source instead."""
        self.roots[run] = root
        self.watched[run] = False
        self._add_tree(run, root, 0)

    def forget(self, run: str) -> None:
        """Stop watching `run` (its source is polled instead); its watches' late events are ignored."""
        self.roots.pop(run, None)
        self.watched.pop(run, None)
        for wd in [wd for wd, (r, _, _) in self._wds.items() if r == run]:
            del self._wds[wd]

    def retry_roots(self) -> tuple[list[str], dict[str, OSError]]:
        """Try again the roots not watched yet: the runs whose root is watched now (scan them), and the
        runs whose watch the kernel refused for want of room (ENOSPC at fs.inotify.max_user_watches),
        forgotten here: their sources are polled from now on."""
        got, refused = [], {}
        for run, root in list(self.roots.items()):
            if not self.watched[run]:
                try:
                    self._add_tree(run, root, 0)
                except OSError as e:  # a root that appeared when the watches had run out
                    self.forget(run)
                    refused[run] = e
                    continue
                if self.watched[run]:
                    got.append(run)
        return got, refused

    def _add_tree(self, run: str, d: Path, depth: int) -> None:
        try:
            wd = self.ino.add(d)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                raise
            return  # gone (ENOENT), not a directory, unreadable: nothing there to see
        self._wds[wd] = (run, d, depth)
        if depth == 0:
            self.watched[run] = True
        if depth >= MAX_DEPTH:
            return
        try:
            subdirs = [e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for sub in subdirs:
            self._add_tree(run, Path(sub), depth + 1)

    def wait(self, timeout: float) -> set[str]:
        """Block up to `timeout` seconds for a change; once one comes, gather more until they pause for
        DEBOUNCE_SECONDS (at most DEBOUNCE_MAX_SECONDS). The runs with a change; every watched run when
        the kernel's queue overflowed (events were lost)."""
        dirty: set[str] = set()
        events = self.ino.read(timeout)
        first = time.monotonic()
        while events:
            for wd, mask, name in events:
                self._one(wd, mask, name, dirty)
            left = DEBOUNCE_MAX_SECONDS - (time.monotonic() - first)
            if left <= 0:
                break
            events = self.ino.read(min(DEBOUNCE_SECONDS, left))
        return dirty

    def _one(self, wd: int, mask: int, name: str, dirty: set[str]) -> None:
        if mask & IN_Q_OVERFLOW:
            dirty.update(self.roots)
            return
        where = self._wds.get(wd)
        if where is None:
            return
        run, d, depth = where
        dirty.add(run)
        if mask & IN_IGNORED:  # the directory went (deleted, moved, unmounted): its watch is gone
            del self._wds[wd]
            if depth == 0:
                self.watched[run] = False
            return
        if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and depth < MAX_DEPTH:
            # no room for more watches (OSError): the run's periodic rescan still sees the step
            with contextlib.suppress(OSError):
                self._add_tree(run, d / name, depth + 1)

    def close(self) -> None:
        self.ino.close()
