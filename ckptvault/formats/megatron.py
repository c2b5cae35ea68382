"""Megatron-LM: `iter_<7-digit N>/` directories, legacy (`mp_rank_XX/model_optim_rng.pt`) or torch_dist
(megatron.core.dist_checkpointing), plus `release/` for converted checkpoints.

The rule follows megatron/training/checkpointing.py (Megatron-LM, read at NVIDIA/Megatron-LM 0032978;
that file is not part of the megatron-core wheel): `save_checkpoint` has every rank write its part
(legacy: `torch.save(state_dict, get_checkpoint_name(...))` into `iter_<N:07d>/mp_rank_<TT>/` without
pipeline parallelism, `mp_rank_<TT>_<PPP>/` with it, `_<EEE>` appended with expert parallelism, each
with `model_optim_rng.pt` and, under the distributed optimizer, `distrib_optim.pt`), then
`torch.distributed.barrier()`, then rank 0 writes the run-root tracker `latest_checkpointed_iteration.txt`
(`iter_finalize_fn`: the iteration, or `release`). So an iteration is complete once the tracker names it
or a later one. A legacy iteration must also hold its whole grid of rank directories (each position of
`mp_rank_TT[_PPP][_EEE]` 0..max, every combination, each with its `model_optim_rng.pt` or another
`.pt`, as converted checkpoints may name it): a rank missing under an iteration the tracker has moved
past is a save that crashed and was never written again (the job restarted with another interval),
and is not whole. torch_dist iterations have no rank directories
and are judged by the tracker alone (dist_checkpointing writes `.metadata` last, as DCP does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^iter_(\d{7,})$")
TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
RANK_DIR = re.compile(r"^mp_rank_(\d{2})((?:_\d{3}){0,2})$")
LEGACY_FILE = "model_optim_rng.pt"


def _has_torch_file(rank_dir: Path) -> bool:
    # Any .pt, not only model_optim_rng.pt: converters and older Megatron versions name the file
    # otherwise, and a checkpoint that never counts as complete is one that is never archived.
    return any(n.endswith(".pt") for n in _fs.names(rank_dir))


def missing_ranks(ckpt: Path) -> str:
    """Why a legacy iteration's rank directories are not a whole grid, or '' (also for torch_dist)."""
    what, gaps = rank_grid_gaps(_fs.names(ckpt), lambda d: _has_torch_file(ckpt / d))
    if not gaps:
        return what
    more = f" and {len(gaps) - 3} more" if len(gaps) > 3 else ""
    return f"{', '.join(gaps[:3])}{more} missing (a rank that never finished its save)"


def rank_grid_gaps(entries: Iterable[str], has_torch_file: Callable[[str], bool]) -> tuple[str, list[str]]:
    """The grid positions missing from an iteration whose top-level names are `entries`: ('', names
    of the missing rank directories or their torch files), or (why, []) when the grid has two
    shapes, or ('', []) when it is whole. `has_torch_file(rank_dir)` says whether one holds a .pt.
    Names only, so a node-local iteration is checked over every node's names (ckptvault.ingest.nodes)."""
    ranks: dict[tuple[int, ...], str] = {}
    for entry in entries:
        if m := RANK_DIR.match(entry):
            ranks[(int(m[1]), *(int(x) for x in m[2].split("_")[1:]))] = entry
    if not ranks:
        return "", []
    if len({len(r) for r in ranks}) > 1:
        return f"rank directories of different shapes ({', '.join(sorted(ranks.values())[:4])}): two layouts mixed", []
    tops = [max(r[i] for r in ranks) for i in range(len(next(iter(ranks))))]
    want: list[tuple[int, ...]] = [()]
    for top in tops:
        want = [(*w, i) for w in want for i in range(top + 1)]

    def name(r: tuple[int, ...]) -> str:
        return "mp_rank_" + "_".join([f"{r[0]:02d}", *(f"{x:03d}" for x in r[1:])])

    gaps = [name(r) + "/" for r in want if r not in ranks]
    gaps += [f"{ranks[r]}/{LEGACY_FILE}" for r in want if r in ranks and not has_torch_file(ranks[r])]
    return "", gaps


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


DIST_CONFIG = "metadata.json"  # megatron.core.dist_checkpointing's CONFIG_FNAME: its CheckpointingConfig


def read_written_by(ckpt: Path) -> dict[str, str]:
    """`{"megatron-core.<sharded_backend>": sharded_backend_version}` from a torch_dist iteration's
    `metadata.json` (dist_checkpointing's `CheckpointingConfig`, e.g. `{"megatron-core.torch_dist": "1"}`):
    the version of megatron-core's on-disk format, not of the package (Megatron records no package
    version). {} for a legacy iteration (no metadata.json) or one that does not read."""
    doc = _fs.read_small_json(ckpt / DIST_CONFIG) or {}
    backend, version = doc.get("sharded_backend"), doc.get("sharded_backend_version")
    if not isinstance(backend, str) or not backend or isinstance(version, bool) or not isinstance(version, int | str):
        return {}
    return {f"megatron-core.{backend}": str(version)}


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
            if complete and (gap := missing_ranks(path)):
                complete, reason = False, f"{TRACKER} names it or a later iteration, but {gap}"
            out.append(Candidate(self.name, step, path, complete, reason))
        return sorted(out, key=lambda c: (c.step, c.path.name))

    def matches(self, root: Path) -> bool:
        return any(e.name == TRACKER or _is_iter_dir(e) for e in _fs.entries(root))

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return TRACKER, RELEASE if ckpt_name == RELEASE else str(step)


LAYOUT = MegatronLayout()
