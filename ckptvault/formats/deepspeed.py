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

Custom save tags. `save_checkpoint(save_dir, tag=...)` takes any string as the tag (`str(tag)`; the
default is `f"global_step{self.global_steps}"`) and writes `save_dir/<tag>/` with the same file names
(`_get_ckpt_name`: `os.path.join(save_dir, str(tag), ...)`); `load_checkpoint(load_dir)` with no tag
reads the tag from `latest` and nothing else. So a run-root directory that is not `global_step<N>` is
a tag when it holds DeepSpeed's rank files (or `latest` names it). Its step is the `global_steps` the
engine recorded in its model states (`_common_checkpoint_state`, which `_load_checkpoint` restores
into `self.global_steps`): the one number that says where a resume continues. The tag's own digits
are not used (`epoch3-loss0.25` has two numbers and neither is the step). It is read from the
`data.pkl` of `mp_rank_00_model_states.pt` (ZeRO-3: `zero_pp_rank_0_mp_rank_00_model_states.pt`) by
its pickle opcodes (`pickletools.genops`, nothing constructed, imported or called; the tensors in the
zip are never read), stopping at the top-level `global_steps`. A tag whose model states do not read
yet (still being written) is not a candidate, unless `latest` names it: then it is reported, not
complete, at the step its name holds (0 if none). A tag is then complete as a `global_step<N>` one
is: `latest` names it, or names a tag whose step (its `global_step<N>` name, or its recorded
`global_steps`) is the same or later, and every rank's file is there. Tags nested in
subdirectories (`tag="a/b"`) are not looked for.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

from ckptvault.formats import _fs, _pickle
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^global_step(\d+)$")
POINTER = "latest"
MODEL_STATES = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
OPTIM_STATES = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


def _judge(name: str, step: int, latest: str | None, latest_step: int | None) -> tuple[bool, str]:
    if latest is None:
        return False, f"no '{POINTER}' file at the run root yet (DeepSpeed writes it after the save)"
    if latest == name:
        return True, ""
    if latest_step is None:
        return False, (
            f"'{POINTER}' names tag {latest[:60]!r}, whose step cannot be read (no such directory, or its "
            f"model states do not read yet), so it cannot be ordered against {name}"
        )
    if latest_step >= step:
        return True, ""
    return False, f"'{POINTER}' names {_label(latest, latest_step)}; {_label(name, step)} is still being saved"


def _label(tag: str, step: int) -> str:
    """A tag as a reason names it: a custom tag with the step it recorded, global_step<N> as it is."""
    return tag if NAME.match(tag) else f"{tag[:60]} (step {step})"


def _missing(names: list[str], what: str) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"{what}: {', '.join(names[:3])}{more} missing (another rank is still saving, or never did)"


def missing_rank_files(files: set[str]) -> str:
    """Why the rank files in a tag directory (`files`: its names) are not a whole checkpoint, or ''."""
    what, gaps = rank_file_gaps(files)
    return _missing(gaps, what) if gaps else what


def rank_file_gaps(files: set[str]) -> tuple[str, list[str]]:
    """The rank files missing from a tag directory whose names are `files`: (which ranks, their file
    names), or (why, []) when what is wrong is not a missing file, or ('', []) when it is whole.
    Names only, so a node-local tag is checked over every node's names (ckptvault.ingest.nodes)."""
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
        return "no mp_rank_XX_model_states.pt yet (DeepSpeed's model states)", []
    gaps = [f"mp_rank_{x:02d}_model_states.pt" for x in range(max(mp) + 1) if x not in mp]
    if gaps:
        return "model-parallel ranks", gaps
    dp = {r for r, _ in optim} | {r for r, _ in zero3}
    if not dp:
        return "", []
    if len(prefixes) > 1:
        return "ZeRO optimizer states both with and without the bf16_ prefix: two saves mixed in one tag", []
    prefix = next(iter(prefixes), "")
    want = [(r, x) for r in range(max(dp) + 1) for x in sorted(mp)]
    gaps = [f"{prefix}zero_pp_rank_{r}_mp_rank_{x:02d}_optim_states.pt" for r, x in want if (r, x) not in optim]
    if zero3:
        gaps += [f"zero_pp_rank_{r}_mp_rank_{x:02d}_model_states.pt" for r, x in want if (r, x) not in zero3]
    return (f"data-parallel ranks 0..{max(dp)} of mp ranks 0..{max(mp)}", gaps) if gaps else ("", [])


_RECORDED = "global_steps"
_WRITER = "ds_version"  # `_common_checkpoint_state`: deepspeed.__version__ of the engine that saved
_MODEL_STATES_0 = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
PICKLE_LIMIT = 256 << 20  # a data.pkl larger than this is not walked for what wrote it


def _top_level_int(stream: Any, key: str) -> int | None:
    """The int stored under `key` in the top-level dict of a pickle, by its opcodes alone, or None."""
    v = _pickle.top_level(stream, frozenset([key])).get(key)
    return v if isinstance(v, int) else None


def recorded_step(tag_dir: Path) -> int | None:
    """The `global_steps` DeepSpeed recorded in the tag's model states, or None if they do not read
    (absent, still being written, or not DeepSpeed's)."""
    for name in _MODEL_STATES_0:
        try:
            with zipfile.ZipFile(tag_dir / name) as z:
                pkl = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
                if len(pkl) != 1:
                    return None
                with z.open(pkl[0]) as f:
                    return _top_level_int(f, _RECORDED)
        except FileNotFoundError:
            continue
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, IndexError):
            return None
    return None


def _has_rank_files(path: Path) -> bool:
    return any(MODEL_STATES.match(f) or OPTIM_STATES.match(f) for f in _fs.names(path))


def _latest_step(root: Path, latest: str | None) -> int | None:
    if latest is None:
        return None
    if m := NAME.match(latest):
        return int(m[1])
    return recorded_step(root / latest) if _latest_names_a_dir(latest) else None


def _latest_names_a_dir(latest: str) -> bool:
    return "/" not in latest and latest not in ("", ".", "..")


def _judge_tag(path: Path, name: str, step: int, latest: str | None, latest_step: int | None) -> tuple[bool, str]:
    complete, reason = _judge(name, step, latest, latest_step)
    if not complete:
        return complete, reason
    gap = missing_rank_files(_fs.names(path))
    return (False, f"'{POINTER}' names it, but {gap}") if gap else (True, "")


def _digits(name: str) -> int:
    m = re.search(r"\d+", name)
    return int(m[0]) if m else 0


def _custom_tags(root: Path, latest: str | None, latest_step: int | None) -> list[Candidate]:
    out = []
    for e in _fs.entries(root):
        if NAME.match(_fs.strip_temp(e.name)) or not _fs.is_dir(e) or _fs.is_temp_name(e.name):
            continue
        path = Path(e.path)
        named = e.name == latest
        if not named and not _has_rank_files(path):
            continue
        step = recorded_step(path)
        if step is None:
            if named:
                why = (
                    f"'{POINTER}' names custom tag {e.name!r}, but its {_MODEL_STATES_0[0]} does not read yet, so "
                    f"its global_steps is unknown (still being written?); reported at step {_digits(e.name)} until then"
                )
                out.append(Candidate(LAYOUT_NAME, _digits(e.name), path, False, why))
            continue
        complete, reason = _judge_tag(path, e.name, step, latest, latest_step)
        out.append(Candidate(LAYOUT_NAME, step, path, complete, reason))
    return out


def read_written_by(tag_dir: Path) -> dict[str, str]:
    """`{"deepspeed": ds_version}`: the DeepSpeed version the engine recorded in the tag's model states
    (a top-level key of the `mp_rank_00_model_states.pt` dict, read by its pickle opcodes as
    `global_steps` is; the tensors are never read); {} if it does not read."""
    for name in _MODEL_STATES_0:
        try:
            with zipfile.ZipFile(tag_dir / name) as z:
                pkl = _pickle.zip_pickle(z, PICKLE_LIMIT)
                if pkl is None:
                    return {}
                v = _pickle.top_level(z.read(pkl), frozenset([_WRITER])).get(_WRITER)
                return {"deepspeed": v} if isinstance(v, str) and v else {}
        except FileNotFoundError:
            continue
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, IndexError):
            return {}
    return {}


LAYOUT_NAME = "deepspeed"


class DeepSpeedLayout:
    name = LAYOUT_NAME

    def candidates(self, root: Path) -> list[Candidate]:
        latest = _fs.read_small_text(root / POINTER)
        latest_step = _latest_step(root, latest)
        out = _fs.step_dirs(
            self.name, root, NAME, lambda e, step: _judge_tag(Path(e.path), e.name, step, latest, latest_step)
        )
        out += _custom_tags(root, latest, latest_step)
        return sorted(out, key=lambda c: (c.step, c.path.name))

    def matches(self, root: Path) -> bool:
        if any(NAME.match(_fs.strip_temp(e.name)) and _fs.is_dir(e) for e in _fs.entries(root)):
            return True
        # a run saved with custom tags only: `latest` and the tag directory it names, with rank files
        latest = _fs.read_small_text(root / POINTER)
        return latest is not None and _latest_names_a_dir(latest) and _has_rank_files(root / latest)

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        # A custom save tag is the directory name; the pointer must name that directory.
        return POINTER, ckpt_name or f"global_step{step}"


LAYOUT = DeepSpeedLayout()
