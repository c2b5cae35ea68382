"""What a load check found, per file and per checkpoint, and the constants the checks share."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
DCP_METADATA = ".metadata"
DCP_SUFFIX = ".distcp"
ORBAX_ITEM_METADATA = "_METADATA"
JSON_NAMES = ("_CHECKPOINT_METADATA",)
DCP_BATCH_BYTES = 512 << 20  # tensors allocated per dcp.load call: the check's memory stays bounded
NAMES_SHOWN = 4


@dataclass(frozen=True)
class FileCheck:
    """What was checked for one file (or one directory, path ending in '/') and how."""

    path: str
    how: str
    problem: str = ""  # empty when the check passed
    ran: bool = True  # False: a load check that applies could not run here (its framework is not installed)

    @property
    def ok(self) -> bool:
        return not self.problem

    def describe(self) -> str:
        return f"{self.path}: {self.how}" + (f"; FAILED: {self.problem}" if self.problem else "")


@dataclass(frozen=True)
class LoadReport:
    checks: tuple[FileCheck, ...]

    @property
    def problems(self) -> list[str]:
        return [f"{c.path}: {c.problem}" for c in self.checks if c.problem]

    @property
    def not_run(self) -> list[str]:
        return [c.describe() for c in self.checks if not c.ran]

    def descriptions(self) -> list[str]:
        return [c.describe() for c in self.checks]


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
