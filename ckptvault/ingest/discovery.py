"""Find the checkpoints of one run on the hot tier and say which are ready to archive.

Ready = the layout's commit rule holds AND nothing in the checkpoint changed during the last
`settle_seconds` (quiescence catches writers that have no commit rule, and late writers that do).
The walk opens each directory once and lstats its entries through that descriptor (`fstatat`), never
follows symlinks (so loops cannot hang it), and turns unreadable entries into problems, not crashes.
Only complete candidates are walked: an incomplete one cannot become ready this round anyway.
"""

from __future__ import annotations

import gc
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR, S_ISLNK, S_ISREG

from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.formats import LAYOUTS, FormatError, detect_layout, get_layout, is_temp_name
from ckptvault.formats.base import Candidate, Layout

_new_tuple = tuple.__new__


@dataclass(frozen=True)
class Found:
    run: str
    candidate: Candidate
    files: tuple[LocalFile, ...]  # sorted by rel; empty for candidates that are not complete (not walked)
    ready: bool
    reason: str  # why it is not ready; empty when ready
    newest_mtime: float  # newest mtime among its files and directories (the entry itself if not walked)
    # what the training process reported it ran (a hook's `KEY=VERSION` words, parsed): into written_by
    reported_by: tuple[tuple[str, str], ...] = ()

    @property
    def step(self) -> int:
        return self.candidate.step

    @property
    def format(self) -> str:
        return self.candidate.format

    @property
    def path(self) -> Path:
        return self.candidate.path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class DiscoveryResult:
    found: list[Found]  # sorted by step
    problems: list[str]  # each names the path and what was done about it


def _symlink_problem(path: str, top: str) -> str:
    try:
        target = os.readlink(path)
    except OSError as e:
        return f"{path}: unreadable symlink ({e.strerror}); not followed"
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
    if resolved == top or resolved.startswith(top + os.sep):
        return f"{path}: symlink to {target} inside the checkpoint; not followed, so it is not archived"
    return f"{path}: symlink to {target} points outside the checkpoint; not followed, so it is not archived"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def walk(top: Path, problems: list[str]) -> tuple[list[LocalFile], float, str]:
    """Every regular file under directory `top`, the newest mtime of files and directories, and an
    error (empty if the whole tree could be read). Symlinks and special files become problems.

    Each directory is opened once and scanned through its descriptor, so every entry's lstat is an
    `fstatat(dirfd, name)` (no path lookup from the root, as `find` does it) and paths are built by
    string concatenation only for the entries we keep."""
    top_s = os.fspath(top)
    files: list[LocalFile] = []
    append = files.append
    newest = os.lstat(top_s).st_mtime
    error = ""
    stack = [(top_s, "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            fd = os.open(directory, _DIR_FLAGS)
        except OSError as e:
            problems.append(f"{directory}: cannot read directory ({e.strerror}); checkpoint not archived")
            error = error or f"cannot read {directory} ({e.strerror})"
            continue
        try:  # the entries' lazy stats go through fd: it stays open until the listing is done
            try:
                with os.scandir(fd) as it:
                    listing = list(it)
            except OSError as e:
                problems.append(f"{directory}: cannot read directory ({e.strerror}); checkpoint not archived")
                error = error or f"cannot read {directory} ({e.strerror})"
                continue
            base = directory + os.sep
            for entry in listing:
                name = entry.name
                try:
                    st = entry.stat(follow_symlinks=False)  # fstatat(fd, name, AT_SYMLINK_NOFOLLOW)
                except OSError as e:
                    problems.append(f"{base}{name}: cannot stat ({e.strerror}); checkpoint not archived")
                    error = error or f"cannot stat {base}{name} ({e.strerror})"
                    continue
                mode = st.st_mode
                if S_ISLNK(mode):
                    problems.append(_symlink_problem(base + name, top_s))
                    continue
                mtime = st.st_mtime
                if mtime > newest:
                    newest = mtime
                if S_ISREG(mode):
                    append(_new_tuple(LocalFile, (prefix + name, base + name, st.st_size, mtime)))
                elif S_ISDIR(mode):
                    stack.append((base + name, prefix + name + "/"))
                else:
                    problems.append(f"{base}{name}: not a regular file (socket, fifo or device); skipped")
        finally:
            os.close(fd)
    files.sort()  # by rel: unique within one checkpoint, so the other fields never decide
    return files, newest, error


def _quiet_reason(newest: float, settle_seconds: float, now: float) -> str:
    age = now - newest
    if age < 0:
        return f"newest file has an mtime {-age:.1f} s in the future (clock skew?); waiting until it is settled"
    if age < settle_seconds:
        return f"still being written: newest file changed {age:.1f} s ago, settle_seconds = {settle_seconds:g}"
    return ""


def _examine(run: str, c: Candidate, settle_seconds: float, now: float, problems: list[str]) -> Found | None:
    try:
        st = os.lstat(c.path)
    except OSError as e:
        problems.append(f"{c.path}: vanished or unreadable while discovering ({e.strerror}); skipped")
        return None
    if stat.S_ISLNK(st.st_mode):
        problems.append(
            f"{c.path}: the checkpoint itself is a symlink; not followed. "
            "Point [[sources]].path at the directory that holds the real checkpoints."
        )
        return None
    if not c.complete:
        return Found(run, c, (), False, c.reason or "not complete", st.st_mtime)
    if stat.S_ISREG(st.st_mode):
        files = [LocalFile(c.path.name, c.path, st.st_size, st.st_mtime)]
        newest, error = st.st_mtime, ""
    else:
        try:
            files, newest, error = walk(c.path, problems)
        except OSError as e:  # the directory vanished between listing and walking
            problems.append(f"{c.path}: vanished while discovering ({e.strerror}); skipped")
            return None
    reason = error or _quiet_reason(newest, settle_seconds, now)
    return Found(run, c, tuple(files), not reason, reason, newest)


def _one_per_step(cands: list[Candidate], problems: list[str]) -> list[Candidate]:
    """A step is one checkpoint in the store: prefer the finished name over leftover temporaries,
    and the first name over later duplicates (lightning `-v1` copies), saying so."""
    by_step: dict[int, list[Candidate]] = {}
    for c in cands:
        by_step.setdefault(c.step, []).append(c)
    out = []
    for step, group in sorted(by_step.items()):
        # shortest name first: the original, not its `-v1` / `-copy` style duplicates
        final = sorted(
            (c for c in group if not is_temp_name(c.path.name)), key=lambda c: (len(c.path.name), c.path.name)
        )
        temps = sorted((c for c in group if is_temp_name(c.path.name)), key=lambda c: c.path.name)
        if final:
            for t in temps:
                problems.append(
                    f"{t.path}: leftover temporary beside the finished checkpoint for step {step} "
                    "(probably from a crashed save); ignored, delete it to free space"
                )
            for dup in final[1:]:
                problems.append(f"{dup.path}: a second checkpoint for step {step}; using {final[0].path.name}")
            out.append(final[0])
        else:
            out.append(temps[0])
    return out


def _layout(root: Path, fmt: str, problems: list[str]) -> Layout | None:
    if fmt != "auto":
        return get_layout(fmt)
    try:
        return detect_layout(root)
    except FormatError as e:
        if any(layout.matches(root) for layout in LAYOUTS.values()):
            raise  # several layouts match: a configuration error that will not fix itself, so fail loudly
        problems.append(str(e))  # nothing checkpoint-like yet: normal for a run that just started
        return None


def discover(run: str, root: Path, fmt: str, settle_seconds: float, now: float) -> DiscoveryResult:
    """The checkpoints of `run` under `root`, sorted by step. `fmt` is a layout name or "auto";
    raises FormatError for an unknown name or an ambiguous "auto"."""
    problems: list[str] = []
    try:
        with os.scandir(root):
            pass
    except OSError as e:
        problems.append(f"run {run!r}: cannot read {root} ({e.strerror}); check [[sources]].path and permissions")
        return DiscoveryResult([], problems)
    layout = _layout(root, fmt, problems)
    if layout is None:
        return DiscoveryResult([], problems)
    found = []
    with _gc_paused():
        for c in _one_per_step(layout.candidates(root), problems):
            f = _examine(run, c, settle_seconds, now, problems)
            if f is not None:
                found.append(f)
    return DiscoveryResult(found, problems)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """A million live LocalFiles make every full GC pass rescan them all: a third of the walk's time.
    They hold no reference cycles, so cycle collection can wait until the walk is done."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
