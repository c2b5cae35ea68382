"""PyTorch Lightning: `*.ckpt` files with `step=S` in the name (`epoch=E-step=S.ckpt`); the candidate
path is the file itself.

`last.ckpt` (and `last-v1.ckpt`, ...) and any `.ckpt` without a `step=` are skipped: they are copies
or aliases of a stepped checkpoint (ModelCheckpoint's `save_last`), so archiving them would store the
same bytes twice under no step. Lightning has no commit marker: a file is complete once it stops
changing, which discovery judges with `settle_seconds`; `*.ckpt.tmp` files are still being written.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

STEP = re.compile(r"(?:^|[-_ ])step=(\d+)")
SUFFIX = ".ckpt"


def _step(name: str) -> int | None:
    base = _fs.strip_temp(name)
    if not base.endswith(SUFFIX) or base.startswith("last"):
        return None
    m = STEP.search(base)
    return int(m[1]) if m else None


class LightningLayout:
    name = "lightning"

    def candidates(self, root: Path) -> list[Candidate]:
        out = []
        for e in _fs.entries(root):
            step = _step(e.name)
            if step is None:
                continue
            if _fs.is_temp_name(e.name):
                out.append(Candidate(self.name, step, Path(e.path), False, _fs.TEMP_REASON))
            else:
                out.append(Candidate(self.name, step, Path(e.path), True))
        return sorted(out, key=lambda c: (c.step, c.path.name))

    def matches(self, root: Path) -> bool:
        return any(_step(e.name) is not None for e in _fs.entries(root))

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return None


LAYOUT = LightningLayout()
