"""Small file-system helpers shared by the layout modules (private to `ckptvault.formats`).

Layouts look only at names and a few marker files, so one `scandir` of the run root (plus at most one
per candidate) is all they cost; discovery walks the files afterwards, once.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptvault.formats.base import Candidate

# Writers save into a temporary name and rename when done; these decorations mark such names.
_TEMP_PREFIX = re.compile(r"^(?:tmp[-_.]|\.tmp[-_.]?)", re.IGNORECASE)
_TEMP_SUFFIX = re.compile(r"(?:\.orbax-checkpoint-tmp.*|[-_.]tmp(?:[-_.].*)?|\.tmp\d+|-unfinished)$", re.IGNORECASE)


def is_temp_name(name: str) -> bool:
    """A temporary name (`.tmp`, `tmp`, `-unfinished` anywhere): never a finished checkpoint."""
    lower = name.lower()
    return "tmp" in lower or "-unfinished" in lower


def strip_temp(name: str) -> str:
    """The name a temporary entry will have once renamed, so its step can still be parsed."""
    return _TEMP_SUFFIX.sub("", _TEMP_PREFIX.sub("", name))


def entries(root: Path) -> list[os.DirEntry[str]]:
    """The entries directly under `root`, sorted by name; [] if it cannot be read (discovery reports
    unreadable roots itself, layouts only need to not crash)."""
    try:
        with os.scandir(root) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def names(path: Path) -> set[str]:
    """Names directly inside `path` (empty if unreadable or not a directory)."""
    try:
        with os.scandir(path) as it:
            return {e.name for e in it}
    except OSError:
        return set()


def is_dir(entry: os.DirEntry[str]) -> bool:
    # Symlinked checkpoint dirs are still reported as candidates so discovery can say it skips them.
    try:
        return entry.is_dir()
    except OSError:
        return False


def read_small_text(path: Path, limit: int = 4096) -> str | None:
    """A pointer file's stripped content, or None if absent/unreadable (pointer files are tiny)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace").strip()
    except OSError:
        return None


def read_small_json(path: Path, limit: int = 1 << 20) -> dict[str, Any] | None:
    """The JSON object in the file at `path`, or None: absent, unreadable, larger than `limit` bytes (a
    config is a few KiB; a larger file is not read for a record), not an object."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
        if len(raw) > limit:
            return None
        doc = json.loads(raw)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def has_suffix_in(path: Path, suffix: str, limit: int = 64) -> bool:
    """True if one of the first `limit` entries of `path` ends with `suffix` (cheap format sniffing)."""
    try:
        with os.scandir(path) as it:
            for i, e in enumerate(it):
                if e.name.endswith(suffix):
                    return True
                if i >= limit:
                    break
    except OSError:
        pass
    return False


TEMP_REASON = "temporary name: the writer renames it when the save finishes"


def step_dirs(
    fmt: str, root: Path, name: re.Pattern[str], judge: Callable[[os.DirEntry[str], int], tuple[bool, str]]
) -> list[Candidate]:
    """The usual shape of a layout: directories whose name (temp decoration aside) matches `name`,
    group 1 the step; temporary ones are never complete, the rest are judged by the layout's rule."""
    out = []
    for e in entries(root):
        m = name.match(strip_temp(e.name))
        if not m or not is_dir(e):
            continue
        step, path = int(m[1]), Path(e.path)
        if is_temp_name(e.name):
            out.append(Candidate(fmt, step, path, False, TEMP_REASON))
            continue
        complete, reason = judge(e, step)
        out.append(Candidate(fmt, step, path, complete, reason))
    return sorted(out, key=lambda c: (c.step, c.path.name))
