"""A file of a local checkpoint, as discovery found it: what ingest uploads and what a new save is
compared by (ckptvault/catalog/saves.py)."""

from __future__ import annotations

import os
from pathlib import Path

_new_tuple = tuple.__new__


class LocalFile(tuple[str, str, int, float]):
    """One regular file of a checkpoint: an immutable value `LocalFile(rel, path, size, mtime)`, with
    ==, hash and pickle. `rel` is '/'-separated and relative to the checkpoint dir (a single-file
    checkpoint: its file name); `path` is its absolute path.

    Why a tuple: a million-file walk builds a million of these, and `tuple.__new__` in one C call is
    ~4x cheaper than an `__init__` that sets four slots. The price: it compares equal to a plain tuple of
    the same four values, and `path` builds a new `Path` on each access (callers read it once per file).
    """

    __slots__ = ()

    def __new__(cls, rel: str, path: str | os.PathLike[str], size: int, mtime: float) -> LocalFile:
        return _new_tuple(cls, (rel, os.fspath(path), size, mtime))

    @property
    def rel(self) -> str:
        return self[0]

    @property
    def path(self) -> Path:
        return Path(self[1])

    @property
    def size(self) -> int:
        return self[2]

    @property
    def mtime(self) -> float:
        return self[3]

    def __getnewargs__(self) -> tuple[str, str, int, float]:
        # pickle/copy (Prefect task results) rebuild through __new__(rel, path, size, mtime)
        return (self[0], self[1], self[2], self[3])

    def __repr__(self) -> str:
        return f"LocalFile(rel={self[0]!r}, path={self[1]!r}, size={self[2]}, mtime={self[3]})"
