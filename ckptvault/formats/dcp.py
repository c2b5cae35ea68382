"""PyTorch Distributed Checkpoint (DCP, torchtitan): a directory of `__<rank>_<n>.distcp` files.

The coordinator writes `.metadata.tmp` and renames it to `.metadata` after every rank finished, so
`.metadata` is the commit marker.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^(?:step[-_])?(\d+)$")
METADATA = ".metadata"
SUFFIX = ".distcp"


def judge_dcp_dir(path: Path) -> tuple[bool, str]:
    """Completeness of one DCP directory (also used for NeMo's `weights/`)."""
    present = _fs.names(path)
    if METADATA in present:
        return True, ""
    if METADATA + ".tmp" in present:
        return False, ".metadata.tmp present: the coordinator has not renamed it to .metadata yet"
    return False, "no .metadata yet (written last, after every rank's .distcp file)"


class DCPLayout:
    name = "dcp"

    def candidates(self, root: Path) -> list[Candidate]:
        return _fs.step_dirs(self.name, root, NAME, lambda e, _step: judge_dcp_dir(Path(e.path)))

    def matches(self, root: Path) -> bool:
        for e in _fs.entries(root):
            named = NAME.match(_fs.strip_temp(e.name)) and _fs.is_dir(e)
            if named and _fs.has_suffix_in(Path(e.path), SUFFIX):
                return True
        return False

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return None


LAYOUT = DCPLayout()
