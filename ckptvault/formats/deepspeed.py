"""DeepSpeed: `global_step<N>/` directories with `mp_rank_XX_model_states.pt` and `*_optim_states.pt`.

The commit rule follows deepspeed/runtime/engine.py (0.19.8), `DeepSpeedEngine.save_checkpoint`: every
rank saves its own files (`_save_checkpoint`: `mp_rank_XX_model_states.pt` from data-parallel rank 0 of
each model-parallel rank, `zero_pp_rank_R_mp_rank_XX_model_states.pt` per rank under ZeRO-3, named by
`_get_ckpt_name`; `_save_zero_checkpoint`: `[bf16_]zero_pp_rank_R_mp_rank_XX_optim_states.pt`, named by
`_get_rank_zero_ckpt_name`), then global rank 0 writes the run-root `latest` (the tag) right after its
own save, with no barrier across ranks before it (the `dist.barrier()` comes after). So a tag is
complete once `latest` names it or a later step AND every rank's file is there: the model-parallel
ranks XX of the model states must be 0..max, the data-parallel ranks R of the ZeRO files must be
0..max, and each R must have its file for every XX. Only names are read (nothing is unpickled). A
highest rank whose file has not been created yet leaves no trace in the names: the quiescence that
discovery requires of every checkpoint (`settle_seconds`, newest mtime) is what covers it, and a rank
still writing its file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^global_step(\d+)$")
POINTER = "latest"
MODEL_STATES = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
OPTIM_STATES = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


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


def _missing(names: list[str], what: str) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"{what}: {', '.join(names[:3])}{more} missing (another rank is still saving, or never did)"


def missing_rank_files(files: set[str]) -> str:
    """Why the rank files in a tag directory (`files`: its names) are not a whole checkpoint, or ''."""
    mp: set[int] = set()
    zero3: set[tuple[int, int]] = set()  # (dp rank, mp rank) of ZeRO-3 model states
    optim: dict[tuple[int, int], str] = {}  # (dp rank, mp rank) -> file name
    prefixes: set[str] = set()
    for f in files:
        if m := MODEL_STATES.match(f):
            if m[1] is None:
                mp.add(int(m[2]))
            else:
                zero3.add((int(m[1]), int(m[2])))
        elif m := OPTIM_STATES.match(f):
            optim[(int(m[2]), int(m[3]))] = f
            prefixes.add(m[1] or "")
    mp |= {x for _, x in zero3}
    if not mp:
        return "no mp_rank_XX_model_states.pt yet (DeepSpeed's model states)"
    gaps = [f"mp_rank_{x:02d}_model_states.pt" for x in range(max(mp) + 1) if x not in mp]
    if gaps:
        return _missing(gaps, "model-parallel ranks")
    dp = {r for r, _ in optim} | {r for r, _ in zero3}
    if not dp:
        return ""
    if len(prefixes) > 1:
        return "ZeRO optimizer states both with and without the bf16_ prefix: two saves mixed in one tag"
    prefix = next(iter(prefixes), "")
    want = [(r, x) for r in range(max(dp) + 1) for x in sorted(mp)]
    gaps = [f"{prefix}zero_pp_rank_{r}_mp_rank_{x:02d}_optim_states.pt" for r, x in want if (r, x) not in optim]
    if zero3:
        gaps += [f"zero_pp_rank_{r}_mp_rank_{x:02d}_model_states.pt" for r, x in want if (r, x) not in zero3]
    if gaps:
        return _missing(gaps, f"data-parallel ranks 0..{max(dp)} of mp ranks 0..{max(mp)}")
    return ""


def _judge_tag(e: os.DirEntry[str], step: int, latest: str | None) -> tuple[bool, str]:
    complete, reason = _judge(e.name, step, latest)
    if not complete:
        return complete, reason
    gap = missing_rank_files(_fs.names(Path(e.path)))
    return (False, f"'{POINTER}' names it, but {gap}") if gap else (True, "")


class DeepSpeedLayout:
    name = "deepspeed"

    def candidates(self, root: Path) -> list[Candidate]:
        latest = _fs.read_small_text(root / POINTER)
        return _fs.step_dirs(self.name, root, NAME, lambda e, step: _judge_tag(e, step, latest))

    def matches(self, root: Path) -> bool:
        return any(NAME.match(_fs.strip_temp(e.name)) and _fs.is_dir(e) for e in _fs.entries(root))

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        # A custom save tag is the directory name; the pointer must name that directory.
        return POINTER, ckpt_name or f"global_step{step}"


LAYOUT = DeepSpeedLayout()
