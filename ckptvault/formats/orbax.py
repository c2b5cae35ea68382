"""Orbax (JAX): `<N>/` or `<prefix>_<N>/` step directories holding `_CHECKPOINT_METADATA`.

Orbax writes into `<name>.orbax-checkpoint-tmp-<ts>` and renames when done; on file systems without
atomic rename (GCS) it writes `commit_success.txt` last instead. If any step of the run carries that
file, the run uses the protocol and every step must have it.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^(?:.*?_)?(\d+)$")
METADATA = "_CHECKPOINT_METADATA"
COMMIT = "commit_success.txt"
TMP_MARK = ".orbax-checkpoint-tmp"


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
            elif uses_commit and COMMIT not in contents:
                reason = f"no {COMMIT} yet (other steps of this run have one)"
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
