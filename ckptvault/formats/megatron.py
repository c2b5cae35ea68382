"""Megatron-LM: `iter_<7-digit N>/` directories (legacy `mp_rank_XX/model_optim_rng.pt` or torch_dist),
plus `release/` for converted checkpoints.

Megatron rewrites the run-root tracker `latest_checkpointed_iteration.txt` only after a save has
finished on every rank, so an iteration is complete once the tracker names it or a later one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^iter_(\d{7,})$")
TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"


def _judge(step: int, is_release: bool, tracker: str | None) -> tuple[bool, str]:
    if tracker is None:
        return False, f"no {TRACKER} at the run root yet (Megatron writes it after the save)"
    if tracker == RELEASE:
        if is_release:
            return True, ""
        return False, f"{TRACKER} names 'release', not iteration {step}"
    if not tracker.isdigit():
        return False, f"{TRACKER} holds {tracker[:40]!r}, expected an iteration number or 'release'"
    if is_release or int(tracker) >= step:
        return True, ""
    return False, f"{TRACKER} names iteration {int(tracker)}; {step} is still being saved"


def _is_iter_dir(e: os.DirEntry[str]) -> bool:
    return NAME.match(_fs.strip_temp(e.name)) is not None and _fs.is_dir(e)


class MegatronLayout:
    name = "megatron"

    def candidates(self, root: Path) -> list[Candidate]:
        tracker = _fs.read_small_text(root / TRACKER)
        out = []
        for e in _fs.entries(root):
            base = _fs.strip_temp(e.name)
            m = NAME.match(base)
            if not (m or base == RELEASE) or not _fs.is_dir(e):
                continue
            step = int(m[1]) if m else 0
            path = Path(e.path)
            if _fs.is_temp_name(e.name):
                out.append(Candidate(self.name, step, path, False, _fs.TEMP_REASON))
                continue
            complete, reason = _judge(step, m is None, tracker)
            out.append(Candidate(self.name, step, path, complete, reason))
        return sorted(out, key=lambda c: (c.step, c.path.name))

    def matches(self, root: Path) -> bool:
        return any(e.name == TRACKER or _is_iter_dir(e) for e in _fs.entries(root))

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return TRACKER, RELEASE if ckpt_name == RELEASE else str(step)


LAYOUT = MegatronLayout()
