"""What every checkpoint layout module provides, and the candidate it reports.

A layout module finds *candidates* under a run root: every directory or file that looks like one of
its checkpoints, complete or not. Completeness is judged by the layout's own commit rule (a marker
file, a pointer file naming this step or a later one, no `-unfinished` sibling, ...); quiescence
(`settle_seconds`) is judged afterwards by `discovery.py`, the same way for every layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Candidate:
    """One checkpoint-shaped thing under a run root."""

    format: str  # "hf" | "dcp" | "megatron" | "deepspeed" | "orbax" | "lightning" | "nemo"
    step: int
    path: Path  # the checkpoint directory, or the single file (lightning)
    complete: bool  # the layout's commit rule holds
    reason: str = ""  # why it is not complete (empty when complete), e.g. "no trainer_state.json yet"

    @property
    def is_file(self) -> bool:
        return self.path.is_file()


class Layout(Protocol):
    """A checkpoint format. Implementations are stateless module-level objects."""

    name: str

    def candidates(self, root: Path) -> list[Candidate]:
        """Every checkpoint-shaped entry directly under `root` (the run root), sorted by step."""
        ...

    def matches(self, root: Path) -> bool:
        """True if `root` looks like a run root of this layout (used by format = "auto")."""
        ...

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        """The run-root pointer file a restore should recreate so the framework resumes from this
        checkpoint, as (file name, content); None if the layout has none."""
        ...
