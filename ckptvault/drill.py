"""Restore drills: prove that what sits in the store (archived or not) restores and loads.

Selection rotates like restic's `check --read-data-subset=n/t`, in spirit: every verified checkpoint
is drilled over time (least recently drilled first), and each drill always includes every run's
newest checkpoint and one of its oldest archived ones, the two a disaster would reach for.
"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptvault.catalog import CheckpointState

COLD_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE", "GLACIER_IR", "STANDARD_IA", "COLD"})


@dataclass(frozen=True)
class DrillResult:
    run: str
    step: int
    ok: bool
    seconds: float
    bytes: int
    problems: tuple[str, ...] = ()

    def row(self) -> dict[str, object]:
        return {"run": self.run, "step": self.step, "ok": self.ok, "seconds": round(self.seconds, 2),
                "problems": list(self.problems)}  # fmt: skip

    def detail(self) -> str:
        mib_s = self.bytes / 2**20 / self.seconds if self.seconds > 0 else 0.0
        return json.dumps(
            {
                "seconds": round(self.seconds, 3),
                "bytes": self.bytes,
                "mib_per_s": round(mib_s, 1),
                "problems": list(self.problems),
            }
        )


def render_markdown(results: Sequence[DrillResult], pending: Sequence[str]) -> str:
    lines = ["| run | step | ok | seconds | GiB | problems |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r.run} | {r.step} | {'yes' if r.ok else '**NO**'} | {r.seconds:.1f} | {r.bytes / 2**30:.2f} | "
        f"{'; '.join(r.problems)[:300]} |"
        for r in results
    ]
    if pending:
        lines.append(f"\nStill thawing (completed by the next drill): {', '.join(pending)}")
    return "\n".join(lines)


def select_sample(states: Sequence[CheckpointState], n: int) -> list[CheckpointState]:
    """Each run's newest verified, one of its oldest archived, then least recently drilled up to n."""
    verified = [s for s in states if s.verified]
    chosen: dict[tuple[str, int], CheckpointState] = {}
    runs = sorted({s.run for s in verified})
    for run in runs:
        mine = sorted((s for s in verified if s.run == run), key=lambda s: s.step)
        chosen[(run, mine[-1].step)] = mine[-1]
        archived = [s for s in mine if s.storage_class in COLD_CLASSES]
        if archived:
            # among the oldest archived, the least recently drilled, so repeated drills walk them
            oldest = sorted(archived[: max(1, len(archived) // 4)], key=lambda s: (s.last_drill_at or 0.0, s.step))
            chosen.setdefault((run, oldest[0].step), oldest[0])
    rest = sorted(
        (s for s in verified if (s.run, s.step) not in chosen),
        key=lambda s: (s.last_drill_at is not None, s.last_drill_at or 0.0, s.run, s.step),
    )
    for s in rest:
        if len(chosen) >= max(n, len(runs)):
            break
        chosen[(s.run, s.step)] = s
    return sorted(chosen.values(), key=lambda s: (s.run, s.step))


def _check_safetensors(path: Path, rel: str) -> list[str]:
    if importlib.util.find_spec("safetensors") is None:
        return []
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                f.get_tensor(name)  # a full read of every tensor: the proof that it loads
    except Exception as e:
        return [f"{rel}: safetensors does not load: {e}"]
    return []


def _check_zip(path: Path, rel: str) -> list[str]:
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        return [f"{rel}: not a readable torch.save zip: {e}"]
    if bad is not None:
        return [f"{rel}: zip member {bad} fails its CRC"]
    if importlib.util.find_spec("torch") is not None:
        import torch

        try:
            torch.load(path, weights_only=True, map_location="cpu")
        except Exception as e:
            return [f"{rel}: torch.load(weights_only=True) fails: {e}"]
    return []


def load_check(ckpt_path: Path) -> list[str]:
    """Every problem loading the restored checkpoint (a directory or one file), framework-free
    where possible: safetensors tensors are read in full, torch zips CRC-checked (and loaded with
    torch.load(weights_only=True) when torch is installed)."""
    files = [ckpt_path] if ckpt_path.is_file() else sorted(p for p in ckpt_path.rglob("*") if p.is_file())
    problems: list[str] = []
    for p in files:
        rel = p.name if ckpt_path.is_file() else p.relative_to(ckpt_path).as_posix()
        if p.suffix == ".safetensors":
            problems += _check_safetensors(p, rel)
        elif p.suffix in (".pt", ".ckpt", ".bin") and zipfile.is_zipfile(p):
            problems += _check_zip(p, rel)
        elif p.suffix in (".pt", ".ckpt"):
            problems.append(f"{rel}: not a zip-format torch file")
    return problems
