"""Orbax (JAX): `<N>/` or `<prefix>_<N>/` step directories holding `_CHECKPOINT_METADATA`, as
`orbax.checkpoint.CheckpointManager` writes them (one subdirectory per item: `default/`, or the
item names, and `metrics/` when the manager tracks a best metric).

The commit rule is Orbax's (orbax/checkpoint/_src/path/atomicity.py and temporary_paths.py,
`is_path_finalized`, orbax-checkpoint 0.12): a save is written into `<name>.orbax-checkpoint-tmp`
(`AtomicRenameTemporaryPath`, the default on a POSIX file system) and its `finalize` records
`commit_timestamp_nsecs` in `_CHECKPOINT_METADATA`, writes `commit_success.txt` and renames the
directory to its final name; `CommitFileTemporaryPath` (GCS, GCSFuse, or chosen in
`CheckpointManagerOptions.temporary_path_class`) writes in place under the final name and
`commit_success.txt` is its commit. So:

- a temporary name is never complete;
- `commit_success.txt` present: complete (both modes write it last);
- without it: in progress if another step of the run has one (this run's Orbax writes it), or if
  `_CHECKPOINT_METADATA` says `commit_timestamp_nsecs: null` (finalize has not run); otherwise a
  final name with `_CHECKPOINT_METADATA` is an older Orbax's rename commit, complete.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^(?:.*?_)?(\d+)$")
METADATA = "_CHECKPOINT_METADATA"
COMMIT = "commit_success.txt"
TMP_MARK = ".orbax-checkpoint-tmp"
# Content-addressed chunk files of the OCDBT key-value store (`<item>/d/<hex>`,
# `<item>/ocdbt.process_<P>/d/<hex>`): how many there are changes from save to save (B-tree nodes and
# data files are written as needed), so the shape gate does not count them.
CHUNK = re.compile(r"(?:^|/)d/[0-9a-f]{16,}$")


def _not_finalized(path: Path) -> bool:
    """_CHECKPOINT_METADATA says the save's finalize has not run (commit_timestamp_nsecs null)."""
    try:
        doc = json.loads((path / METADATA).read_bytes()[: 1 << 20])
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "commit_timestamp_nsecs" in doc and doc["commit_timestamp_nsecs"] is None


METRICS_ITEM = "metrics"  # CheckpointManager's METRIC_ITEM_NAME: `<step>/metrics/metrics`, JSON


def _numbers(doc: object) -> dict[str, float]:
    if not isinstance(doc, dict):
        return {}
    return {
        str(k): float(v) for k, v in doc.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def read_metrics(ckpt_dir: Path) -> dict[str, float]:
    """The metrics `CheckpointManager.save(step, ..., metrics=...)` recorded: the `metrics` item
    (`<step>/metrics/metrics`, JSON, written when the manager tracks a best metric, `best_fn`) and
    the `metrics` of `_CHECKPOINT_METADATA` (StepMetadata); numeric values only. Empty if none."""
    out: dict[str, float] = {}
    for path, pick in ((ckpt_dir / METADATA, METRICS_ITEM), (ckpt_dir / METRICS_ITEM / METRICS_ITEM, None)):
        try:
            doc = json.loads(path.read_bytes()[: 1 << 20])
        except (OSError, ValueError):
            continue
        out.update(_numbers(doc.get(pick) if pick is not None and isinstance(doc, dict) else doc))
    return out


def counts_for_shape(rel: str) -> bool:
    return CHUNK.search(rel) is None


class OrbaxLayout:
    name = "orbax"

    def candidates(self, root: Path) -> list[Candidate]:
        found: list[tuple[int, Path, set[str] | None]] = []
        for e in _fs.entries(root):
            m = NAME.match(_fs.strip_temp(e.name))
            if not m or not _fs.is_dir(e):
                continue
            contents = None if _fs.is_temp_name(e.name) else _fs.names(Path(e.path))
            found.append((int(m[1]), Path(e.path), contents))
        uses_commit = any(c is not None and COMMIT in c for _, _, c in found)
        out = []
        for step, path, contents in found:
            if contents is None:
                out.append(Candidate(self.name, step, path, False, _fs.TEMP_REASON))
            elif METADATA not in contents:
                out.append(Candidate(self.name, step, path, False, f"no {METADATA} yet"))
            elif COMMIT in contents:
                out.append(Candidate(self.name, step, path, True))
            elif uses_commit:
                reason = f"no {COMMIT} yet (other steps of this run have one: Orbax writes it last)"
                out.append(Candidate(self.name, step, path, False, reason))
            elif _not_finalized(path):
                reason = f"{METADATA} has commit_timestamp_nsecs null: Orbax has not finalized this save"
                out.append(Candidate(self.name, step, path, False, reason))
            else:
                out.append(Candidate(self.name, step, path, True))
        return sorted(out, key=lambda c: (c.step, c.path.name))

    def matches(self, root: Path) -> bool:
        for e in _fs.entries(root):
            if TMP_MARK in e.name:
                return True
            if NAME.match(e.name) and _fs.is_dir(e) and METADATA in _fs.names(Path(e.path)):
                return True
        return False

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return None


LAYOUT = OrbaxLayout()
