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


# What a load check or a resume check loads with: pip's names (the drill's `loaded_with`)
LOADERS = ("torch", "safetensors", "numpy", "transformers", "accelerate", "lightning", "pytorch-lightning",
           "deepspeed", "megatron-core", "nemo-toolkit", "orbax-checkpoint", "jax")  # fmt: skip


def loaded_with() -> dict[str, str]:
    """{"python": X.Y.Z, pip name: version} of the LOADERS installed in this interpreter, from their package
    metadata: nothing is imported."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in LOADERS:
        try:
            out[name] = metadata.version(name)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return out


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
