"""Where the catalog's objects live (docs/FORMAT.md, "Layout"): keys, partitions, and what a listing holds.

`<prefix>/_catalog/run=<run, percent-encoded>/events/<time_ns:020d>-<uuid4hex>.parquet`, one object per run
per `append` call, never rewritten, and `.../snapshot/...`, the folded state that compaction writes; the
flat layout before partitions is `_catalog/events/`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from urllib.parse import quote, unquote

CATALOG_DIR = "_catalog/events/"
UNREADABLE_DIR = "_catalog/unreadable/"  # event files compaction could not read, kept for a person


def run_partition(run: str) -> str:
    """The hive partition directory of `run` under `_catalog/` (docs/FORMAT.md: percent-encoded)."""
    return f"run={quote(run, safe='')}/"


@dataclass
class _Part:
    events: list[str]
    snapshots: list[str]


class _Vanished(Exception):
    """A listed catalog object was deleted before its GET: a compaction replaced it; list again."""


def new_key(part_dir: str, kind: str = "events", time_ns: int | None = None) -> str:
    """A fresh object key in a partition: unique by its uuid, ordered by its time."""
    ns = time.time_ns() if time_ns is None else time_ns
    return f"{part_dir}{kind}/{ns:020d}-{uuid.uuid4().hex}.parquet"


def classify(root: str, key: str) -> tuple[str, str | None]:
    """What a key under `root` (`.../_catalog/`) is: ("flat", None), ("events" or "snapshot", run), or
    ("combined", None), or ("", None) for anything else (a set-aside file, a stray object)."""
    if not key.endswith(".parquet"):
        return "", None
    rel = key[len(root) :].split("/")
    # Compat: the flat layout before partitions (FORMAT.md); may go: never, an older writer may add to it
    if len(rel) == 2 and rel[0] == "events":
        return "flat", None
    if len(rel) == 2 and rel[0] == "_combined":
        return "combined", None
    if len(rel) == 3 and rel[0].startswith("run=") and rel[1] in ("events", "snapshot"):
        return rel[1], unquote(rel[0][4:])
    return "", None


def _key_time_ns(key: str) -> int:
    name = key.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else 0
