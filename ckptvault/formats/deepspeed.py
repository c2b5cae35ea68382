"""DeepSpeed: `global_step<N>/` directories with `mp_rank_00_model_states.pt` and `*_optim_states.pt`.

DeepSpeed writes the run-root `latest` file (the tag of the newest checkpoint) after the save, so a
tag is complete once `latest` names it or a later step.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^global_step(\d+)$")
POINTER = "latest"


def _judge(name: str, step: int, latest: str | None) -> tuple[bool, str]:
    if latest is None:
        return False, f"no '{POINTER}' file at the run root yet (DeepSpeed writes it after the save)"
    if latest == name:
        return True, ""
    m = NAME.match(latest)
    if m is None:
        return False, f"'{POINTER}' names tag {latest[:60]!r}, which cannot be ordered against {name}"
    if int(m[1]) >= step:
        return True, ""
    return False, f"'{POINTER}' names {latest}; {name} is still being saved"


class DeepSpeedLayout:
    name = "deepspeed"

    def candidates(self, root: Path) -> list[Candidate]:
        latest = _fs.read_small_text(root / POINTER)
        return _fs.step_dirs(self.name, root, NAME, lambda e, step: _judge(e.name, step, latest))

    def matches(self, root: Path) -> bool:
        return any(NAME.match(_fs.strip_temp(e.name)) and _fs.is_dir(e) for e in _fs.entries(root))

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        # A custom save tag is the directory name; the pointer must name that directory.
        return POINTER, ckpt_name or f"global_step{step}"


LAYOUT = DeepSpeedLayout()
