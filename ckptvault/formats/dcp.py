"""PyTorch Distributed Checkpoint (DCP, torchtitan): a directory of `__<rank>_<n>.distcp` files.

The commit rule is torch's: `torch/distributed/checkpoint/filesystem.py`, `FileSystemWriter.finish`
(torch 2.13), runs on the coordinator after every rank's `write_data` has returned its results (the
gather in `state_dict_saver._save_state_dict`), writes `.metadata.tmp` and renames it to `.metadata`.
So `.metadata` is the commit marker: a step directory without it holds shards that cannot load.

Where: the run root itself (`dcp.save(..., checkpoint_id=<root>/step-<N>)`), or torchtitan's default,
`<job.dump_folder>/<checkpoint.folder>/step-<N>` with `folder = "checkpoint"` (torchtitan
docs/checkpoint.md, `CheckpointManager` in torchtitan/components/checkpoint.py): a source may point at
the dump folder, and its `checkpoint/` is searched too.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^(?:step[-_])?(\d+)$")
METADATA = ".metadata"
SUFFIX = ".distcp"
TORCHTITAN_FOLDER = "checkpoint"
SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")  # __<rank>_<file of that rank>.distcp


def _roots(root: Path) -> list[Path]:
    sub = root / TORCHTITAN_FOLDER
    return [root, sub] if sub.is_dir() else [root]


def judge_dcp_dir(path: Path) -> tuple[bool, str]:
    """Completeness of one DCP directory (also used for NeMo's `weights/`)."""
    present = _fs.names(path)
    if METADATA in present:
        return True, ""
    if METADATA + ".tmp" in present:
        return False, ".metadata.tmp present: the coordinator has not renamed it to .metadata yet"
    return False, "no .metadata yet (written last, after every rank's .distcp file)"


def rank_gaps(rels: Iterable[str]) -> list[str]:
    """The ranks without a shard in a directory of `.distcp` files, by name (`rels`: paths inside the
    checkpoint): `DIR/__R_*.distcp` for each R in 0..max that has none. torch's FileSystemWriter
    (single_file_per_rank, the default) writes at least one file per rank, empty or not. A missing
    *last* rank leaves no gap (`.metadata` names it, but it is a pickle, not read here). Used over a
    node-local checkpoint's merged names, where `.metadata` on node 0 says nothing of the others' disks."""
    ranks: dict[str, set[int]] = {}
    for rel in rels:
        d, name = posixpath.split(rel)
        if m := SHARD.match(name):
            ranks.setdefault(d, set()).add(int(m[1]))
    return [
        posixpath.join(d, f"__{r}_*{SUFFIX}") for d, have in sorted(ranks.items()) for r in range(max(have) + 1)
        if r not in have
    ]  # fmt: skip


class DCPLayout:
    name = "dcp"

    def candidates(self, root: Path) -> list[Candidate]:
        out = []
        for r in _roots(root):
            out += _fs.step_dirs(self.name, r, NAME, lambda e, _step: judge_dcp_dir(Path(e.path)))
        return sorted(out, key=lambda c: (c.step, c.path.name))

    def matches(self, root: Path) -> bool:
        for r in _roots(root):
            for e in _fs.entries(r):
                named = NAME.match(_fs.strip_temp(e.name)) and _fs.is_dir(e)
                if named and _fs.has_suffix_in(Path(e.path), SUFFIX):
                    return True
        return False

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return None


LAYOUT = DCPLayout()
