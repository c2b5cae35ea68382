"""NeMo 2: a directory named like the checkpoint (containing `step=S`), with `weights/` (a DCP
checkpoint) and `context/` (the model's config as JSON/YAML).

NeMo creates an empty sibling `<name>-unfinished` before saving and deletes it afterwards, so the
checkpoint is incomplete while that marker exists. A `...-last` directory duplicating a stepped one is
the save_last copy and is skipped in favour of the original.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

STEP = re.compile(r"(?:^|[-_])step=(\d+)")
UNFINISHED = "-unfinished"
WEIGHTS = "weights"
CONTEXT = "context"
LAST = "-last"


class NemoLayout:
    name = "nemo"

    def candidates(self, root: Path) -> list[Candidate]:
        listing = _fs.entries(root)
        siblings = {e.name for e in listing}
        out: list[Candidate] = []
        for e in listing:
            m = STEP.search(e.name)
            if not m or e.name.endswith(UNFINISHED) or not _fs.is_dir(e):
                continue
            step, path = int(m[1]), Path(e.path)
            if _fs.is_temp_name(e.name):
                out.append(Candidate(self.name, step, path, False, _fs.TEMP_REASON))
            elif e.name + UNFINISHED in siblings:
                reason = f"marker {e.name}{UNFINISHED} present: still saving"
                out.append(Candidate(self.name, step, path, False, reason))
            else:
                inside = _fs.names(path)
                missing = [d + "/" for d in (WEIGHTS, CONTEXT) if d not in inside]
                if missing:
                    out.append(Candidate(self.name, step, path, False, f"no {' or '.join(missing)} inside"))
                else:
                    out.append(Candidate(self.name, step, path, True))
        stepped = {(c.step) for c in out if not c.path.name.endswith(LAST)}
        out = [c for c in out if not (c.path.name.endswith(LAST) and c.step in stepped)]
        return sorted(out, key=lambda c: (c.step, c.path.name))

    def matches(self, root: Path) -> bool:
        for e in _fs.entries(root):
            if STEP.search(e.name) and _fs.is_dir(e) and {WEIGHTS, CONTEXT} <= _fs.names(Path(e.path)):
                return True
        return False

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return None


LAYOUT = NemoLayout()
