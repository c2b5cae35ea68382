"""Tests against the real training frameworks (the `frameworks` extra): what they write is found,
uploaded, restored, resumed by the framework itself, and drilled. See conftest.py and writers.py."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def need(module: str) -> ModuleType:
    """Import `module` (a framework from the `frameworks` extra). Missing: the test fails with CI=true
    (CI installs the extra, so a missing framework is a broken install, never a reason to skip) and
    is skipped elsewhere, saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        msg = f"{module} is not importable ({e}); `make venv` installs the frameworks extra"
        if in_ci():
            pytest.fail(f"{msg} (CI=true: a missing framework fails, it does not skip)", pytrace=False)
        pytest.skip(msg)
